"""Pure parsers of the host facts' command output (qwen27b/controller/facts.py runs the commands).

Each turns the output lines into plain JSON-able data; output it cannot make sense of raises
FactParseError instead of a guess. No pyinfra here: controller/facts.py re-raises the error as
pyinfra's FactProcessError, so pyinfra reports "could not process fact" and fails only that host.
The GPU and driver parsers are in gpufacts_parse.py.
"""

from __future__ import annotations

import re
import shlex


class FactParseError(Exception):
    """A fact's output did not have the shape its parser expects (garbled or truncated)."""

    def __init__(self, fact: str, lineno: int | None, expected: str, got: str | None = None):
        where = f"line {lineno}" if lineno is not None else "output"
        message = f"{fact}: {where}: expected {expected}"
        if got is not None:
            message += f", got {got!r}"
        super().__init__(message)
        self.fact = fact
        self.lineno = lineno
        self.expected = expected
        self.got = got

    def __reduce__(self):  # picklable despite the non-message constructor
        return (type(self), (self.fact, self.lineno, self.expected, self.got))


# What a terminal tool may print around its text even into a pipe: nvidia-smi R580 underlines the
# header of `topo -m` with ESC[4m ... ESC[0m (the H100 of 2026-12-07, issue 57). CSI sequences (colour,
# underline, cursor), OSC sequences (titles, links; ended by BEL or ESC \\) and two-byte escapes.
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def terminal_text(output: list[str]) -> list[str]:
    """The lines as a person reads them on a terminal: escape sequences removed, and a carriage
    return's overwrite applied (a line ending in CR, from CRLF output, is the text before it; text
    after a CR inside a line replaces what came before, as a progress line does). Every fact's
    parser reads this (controller/facts.py _ParsedFact.process), so no real host's bytes fail a fact."""
    cleaned = []
    for line in output:
        line = _TERMINAL_ESCAPE.sub("", line).rstrip("\r")
        cleaned.append(line.rsplit("\r", 1)[-1])
    return cleaned


def numbered_lines(output: list[str]) -> list[tuple[int, str]]:
    """Numbered (1-based) non-blank lines, trailing whitespace removed."""
    return [(n, line.rstrip()) for n, line in enumerate(output, 1) if line.strip()]


# --- OS and kernel (what the driver build needs) -----------------------------------------------

_OS_RELEASE_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def parse_os_release(output: list[str]) -> dict:
    """/etc/os-release: id, version_id, pretty_name, codename, id_like (None when absent)."""
    fact = "OsRelease"
    values: dict[str, str] = {}
    for n, line in numbered_lines(output):
        line = line.strip()
        if line.startswith("#"):
            continue
        key, sep, raw = line.partition("=")
        if not sep or not _OS_RELEASE_KEY.match(key):
            raise FactParseError(fact, n, "KEY=value", line)
        try:
            words = shlex.split(raw)
        except ValueError:
            raise FactParseError(fact, n, "a shell-quoted value", line) from None
        if len(words) > 1:
            raise FactParseError(fact, n, "a single (quoted) value", line)
        values[key] = words[0] if words else ""
    if not values.get("ID"):
        raise FactParseError(fact, None, "an ID= line (truncated os-release?)")
    return {
        "id": values["ID"],
        "version_id": values.get("VERSION_ID") or None,
        "pretty_name": values.get("PRETTY_NAME") or None,
        "codename": values.get("VERSION_CODENAME") or values.get("UBUNTU_CODENAME") or None,
        "id_like": values.get("ID_LIKE") or None,
    }


_KERNEL_RELEASE = re.compile(r"^[0-9]+\.[0-9]+[\w.+~-]*$")


def parse_kernel_release(output: list[str]) -> str:
    """uname -r: the running kernel's release."""
    lines = numbered_lines(output)
    if len(lines) != 1 or not _KERNEL_RELEASE.match(lines[0][1].strip()):
        n, line = lines[-1] if lines else (None, None)
        raise FactParseError("KernelRelease", n, "one kernel release like 5.15.0-125-generic", line)
    return lines[0][1].strip()


def parse_secure_boot(output: list[str]) -> str:
    """"enabled", "disabled" or "unsupported", read from whichever SB:mokutil|efivar|none branch answered."""
    fact = "SecureBoot"
    lines = numbered_lines(output)
    if not lines:
        raise FactParseError(fact, None, "a SB:mokutil, SB:efivar or SB:none marker line")
    n, marker = lines[0]
    rest = lines[1:]
    if marker == "SB:none":
        return "unsupported"
    if marker == "SB:mokutil":
        for _, line in rest:
            if "SecureBoot enabled" in line:
                return "enabled"
            if "SecureBoot disabled" in line:
                return "disabled"
            if "doesn't support Secure Boot" in line or "EFI variables are not supported" in line:
                return "unsupported"
        lineno, got = rest[0] if rest else (n + 1, None)
        raise FactParseError(fact, lineno, "mokutil's 'SecureBoot enabled|disabled'", got)
    if marker == "SB:efivar":
        numbers = " ".join(line for _, line in rest).split()
        # efivarfs: 4 bytes of attributes, then the variable's 1-byte value.
        valid = len(numbers) >= 5 and all(re.fullmatch(r"[0-9]+", x) for x in numbers)
        if not valid or numbers[4] not in ("0", "1"):
            got = " ".join(numbers)
            raise FactParseError(fact, n + 1, "od bytes with the 5th 0 or 1 (attributes + value)", got)
        return "enabled" if numbers[4] == "1" else "disabled"
    raise FactParseError(fact, n, "a SB:mokutil, SB:efivar or SB:none marker line", marker)


_POLICY_FIELD = re.compile(r"^\s+(?P<key>Installed|Candidate): (?P<value>\S+)$")


def parse_kernel_headers(output: list[str]) -> dict:
    """{"package", "installed", "candidate"}: linux-headers-<running kernel> and its apt-cache policy
    versions (None for "(none)"; both None when apt knows no such package)."""
    fact = "KernelHeaders"
    lines = [(n, line) for n, line in enumerate(output, 1) if line.strip()]
    if not lines or not re.fullmatch(r"headers linux-headers-[0-9][\w.+~-]*", lines[0][1].strip()):
        n, line = lines[0] if lines else (None, None)
        raise FactParseError(fact, n, "'headers linux-headers-<kernel release>'", line)
    package = lines[0][1].strip().split(" ", 1)[1]
    found = {"package": package, "installed": None, "candidate": None}
    rest = lines[1:]
    if not rest:
        return found  # apt-cache policy prints nothing for a package no archive has
    n, first = rest[0]
    if first.rstrip() != f"{package}:":
        raise FactParseError(fact, n, f"'{package}:' (apt-cache policy's first line)", first)
    seen = set()
    for _, line in rest[1:]:
        match = _POLICY_FIELD.match(line.rstrip())
        if match:
            seen.add(match["key"])
            found[match["key"].lower()] = None if match["value"] == "(none)" else match["value"]
    if seen != {"Installed", "Candidate"}:
        raise FactParseError(fact, rest[-1][0], "'  Installed: ...' and '  Candidate: ...' lines", rest[-1][1])
    return found


# --- Resources ---------------------------------------------------------------------------------

_DF_LINE = re.compile(
    r"^(?P<fs>.+?)\s+(?P<size>[0-9]+)\s+(?P<used>[0-9]+)\s+(?P<avail>[0-9]+)\s+"
    r"(?P<cap>[0-9]+%|-)\s+(?P<mount>/.*)$"
)


def parse_disk_free(output: list[str]) -> dict:
    """The asked path, the existing ancestor measured, its mount, size and free bytes (df -P -B1)."""
    fact = "DiskFree"
    lines = [(n, line.rstrip()) for n, line in enumerate(output, 1)]  # qwen27b's paths never end in a blank
    expected = ("'path ...'", "'checked ...'", "the df -P header", "one df -P line")
    if len(lines) != 4:
        n, line = lines[-1] if lines else (None, None)
        raise FactParseError(fact, n, f"4 lines ({', '.join(expected)})", line)
    (n1, path), (n2, checked), (n3, header), (n4, row) = lines
    if not path.startswith("path ") or len(path) == 5:
        raise FactParseError(fact, n1, expected[0], path)
    if not checked.startswith("checked ") or len(checked) == 8:
        raise FactParseError(fact, n2, expected[1], checked)
    if not header.startswith("Filesystem"):
        raise FactParseError(fact, n3, expected[2], header)
    match = _DF_LINE.match(row.rstrip())
    if not match:
        raise FactParseError(fact, n4, "Filesystem size used available capacity mount", row)
    return {
        "path": path[5:],
        "checked": checked[8:],
        "mount": match["mount"],
        "size_bytes": int(match["size"]),
        "free_bytes": int(match["avail"]),
    }


_MODELS_LINE = re.compile(r"^(?P<bytes>[0-9]+) (?P<state>verified|partial) (?P<name>[^/]+)$")


def parse_models_on_disk(output: list[str]) -> dict:
    """{revision directory: {"bytes", "verified"}}: bytes on disk, and whether its manifest was written."""
    found: dict[str, dict] = {}
    for n, line in numbered_lines(output):
        match = _MODELS_LINE.match(line)
        if not match or match["name"] in found:
            raise FactParseError("ModelsOnDisk", n, "'<bytes> verified|partial <directory>', each once", line)
        found[match["name"]] = {"bytes": int(match["bytes"]), "verified": match["state"] == "verified"}
    return found


_MEMINFO_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_()]+):\s+(?P<value>[0-9]+)(?: kB)?$")


def parse_memory_info(output: list[str]) -> dict:
    """/proc/meminfo: total and available bytes (MemFree + Buffers + Cached before MemAvailable)."""
    fact = "MemoryInfo"
    kib: dict[str, int] = {}
    for n, line in numbered_lines(output):
        match = _MEMINFO_LINE.match(line.strip())
        if not match:
            raise FactParseError(fact, n, "'Key:   value kB'", line)
        kib[match["key"]] = int(match["value"])
    if "MemTotal" not in kib:
        raise FactParseError(fact, None, "a MemTotal line (truncated meminfo?)")
    if "MemAvailable" in kib:
        available = kib["MemAvailable"]
    elif all(k in kib for k in ("MemFree", "Buffers", "Cached")):
        available = kib["MemFree"] + kib["Buffers"] + kib["Cached"]  # kernels before 3.14
    else:
        raise FactParseError(fact, None, "MemAvailable, or MemFree, Buffers and Cached")
    return {"total_bytes": kib["MemTotal"] * 1024, "available_bytes": available * 1024}


# --- Software ----------------------------------------------------------------------------------

_PY_LINE = re.compile(r"^(?P<path>/\S*) (?P<major>[0-9]+)\.(?P<minor>[0-9]+)(?:\.[0-9]+)?\S*$")


def parse_python_versions(output: list[str]) -> dict:
    """{"X.Y": the first interpreter found with that version}."""
    found: dict[str, str] = {}
    for n, line in numbered_lines(output):
        match = _PY_LINE.match(line.strip())
        if not match:
            raise FactParseError("PythonVersions", n, "'/path/to/python X.Y.Z'", line)
        found.setdefault(f"{match['major']}.{match['minor']}", match["path"])
    return found


_DPKG_LINE = re.compile(
    r"^(?P<want>[uihrp])(?P<status>[ncHUFWti])(?P<err>[ R]) "
    r"(?P<package>[a-z0-9][a-z0-9+.-]*) ?(?P<version>\S*)$"
)


def parse_nvidia_cuda_packages(output: list[str]) -> dict:
    """{package: version} of the installed (or held) driver and CUDA packages."""
    installed: dict[str, str] = {}
    for n, line in numbered_lines(output):
        match = _DPKG_LINE.match(line)
        if not match:
            raise FactParseError("NvidiaCudaPackages", n, "'<Status-Abbrev> <package> <version>'", line)
        # Status "i" is installed whether selected "install" (ii) or held (hi, after apt-mark hold).
        if match["status"] != "i":
            continue
        if not match["version"]:
            raise FactParseError("NvidiaCudaPackages", n, "a version for an installed package", line)
        installed.setdefault(match["package"], match["version"])
    return installed


_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*(?::[a-z0-9]+)?$")


def parse_held_packages(output: list[str]) -> list[str]:
    """apt-mark showhold: the held package names, sorted."""
    held = set()
    for n, line in numbered_lines(output):
        name = line.strip()
        if not _PACKAGE_NAME.match(name):
            raise FactParseError("HeldPackages", n, "one package name per line", line)
        held.add(name)
    return sorted(held)


_GETCONF_LIBC = re.compile(r"^glibc ([0-9]+\.[0-9]+)$")
_LDD_VERSION = re.compile(r"^ldd \(.*\) ([0-9]+\.[0-9]+)$")


_GLIBCXX = re.compile(r"^GLIBCXX_([0-9]+(?:\.[0-9]+)*)$")


def parse_libstdcxx_version(output: list[str]) -> str | None:
    """The GLIBCXX_ version names the host's libstdc++.so.6 holds, one a line ("GLIBCXX_3.4.30"):
    the highest, "3.4.30"; None for no output (no libstdc++ found)."""
    versions = []
    for n, line in numbered_lines(output):
        match = _GLIBCXX.match(line.strip())
        if not match:
            raise FactParseError("LibstdcxxVersion", n, "one GLIBCXX_<version> a line", line)
        versions.append(tuple(int(part) for part in match.group(1).split(".")))
    return ".".join(map(str, max(versions))) if versions else None


def parse_glibc_version(output: list[str]) -> str | None:
    """`getconf GNU_LIBC_VERSION` ("glibc 2.35"), or the first line of `ldd --version`
    ("ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) 2.35"): "2.35"; None for no output."""
    lines = numbered_lines(output)
    if not lines:
        return None
    n, line = lines[0]
    match = _GETCONF_LIBC.match(line.strip()) or _LDD_VERSION.match(line.strip())
    if len(lines) != 1 or not match:
        raise FactParseError("GlibcVersion", n, "'glibc 2.35' (getconf) or 'ldd (...) 2.35'", lines[-1][1])
    return match.group(1)
