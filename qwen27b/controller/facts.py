"""Host facts the gate and the planner read, written the way pyinfra writes its own facts.

Each fact is a command plus a pure parser (`process`) that turns the command's output lines into
plain JSON-able data. A parser that cannot make sense of its output raises FactParseError (which
pyinfra reports as "could not process fact" and fails that host) instead of guessing.

Two class attributes tie each fact to recorded host outputs (see tests/support/recorded.py):
`recorded_as` names the file holding the command's output in tests/fixtures/hosts/<host>/, and
`fake_match` is the key for pyinfra's @fake connector (`fake_responses`), which matches a str as a
substring and an re.Pattern with .search() against the command pyinfra runs. A fact with
`requires_command` runs wrapped as `if command -v X >/dev/null 2>&1; then ( CMD ); else echo
'##PYINFRA_NOCMD##'; fi`, so the patterns match CMD either alone or inside that guard.
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.facts import FactBase


class FactParseError(FactProcessError):
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


def _command_pattern(command: str) -> re.Pattern:
    # Alone, or as the body of pyinfra's requires_command guard: "... then ( CMD ); else ...".
    return re.compile(r"(?:^|\( )" + re.escape(command) + r"(?:$| \);)")


def _lines(output: list[str]) -> list[tuple[int, str]]:
    """Numbered (1-based) non-blank lines, trailing whitespace removed."""
    return [(n, line.rstrip()) for n, line in enumerate(output, 1) if line.strip()]


# --- OS and kernel -----------------------------------------------------------------------------

_OS_RELEASE_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class OsRelease(FactBase):
    """The distribution and release pick the CUDA repo path, driver packages and Python route."""

    recorded_as = "os-release"
    _command = "cat /etc/os-release"
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> dict:
        return {"id": None, "version_id": None, "pretty_name": None, "codename": None, "id_like": None}

    def process(self, output: list[str]) -> dict:
        fact = "OsRelease"
        values: dict[str, str] = {}
        for n, line in _lines(output):
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


class KernelRelease(FactBase):
    """DKMS builds the driver for the running kernel; its headers package is named after it."""

    recorded_as = "uname-r.txt"
    _command = "uname -r"
    fake_match = _command_pattern(_command)
    _release = re.compile(r"^[0-9]+\.[0-9]+[\w.+~-]*$")

    def command(self) -> str:
        return self._command

    def process(self, output: list[str]) -> str:
        lines = _lines(output)
        if len(lines) != 1 or not self._release.match(lines[0][1].strip()):
            n, line = lines[-1] if lines else (None, None)
            raise FactParseError("KernelRelease", n, "one kernel release like 5.15.0-125-generic", line)
        return lines[0][1].strip()


# --- NVIDIA GPUs and driver --------------------------------------------------------------------

_GPU_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,compute_cap,driver_version,pcie.link.gen.current,"
    "pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,persistence_mode,ecc.mode.current"
)
_NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
_NO_DEVICES = "No devices were found"
_NOT_A_VALUE = {"N/A", "[N/A]", "Not Supported", "[Not Supported]"}
# nvidia-smi's own failure lines (2>&1 puts them among the CSV rows). Each becomes a "problem"
# entry in the fact, which the gate turns into a refusal or a warning with a fix.
_NVML_INIT = re.compile(r"^Failed to initialize NVML: (?P<reason>.+)$")
_DEVICE_HANDLE = re.compile(
    r"^Unable to determine the device handle for (?:GPU|gpu) ?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-7]): (?P<reason>.+)$"
)
# R470 and older print this for compute_cap (added in R510) and stop: the driver is too old.
_UNKNOWN_FIELD = re.compile(r'^Field "(?P<field>[^"]+)" is not a valid field to query\.?$')
_INFOROM = re.compile(r"^WARNING: infoROM is corrupted at gpu (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")


class NvidiaGpus(FactBase):
    """What the driver sees: count, memory, compute capability, link health, persistence, ECC.

    A list of GPU dicts, plus one {"problem", "bus_id", "message"} dict per failure line
    nvidia-smi printed: "driver-library-mismatch" (the driver was upgraded, the old kernel module
    is still loaded), "nvml-init" (NVML failed for another reason), "device-handle" (a GPU that
    does not answer: Unknown Error / GPU is lost), "inforom" (a corrupted infoROM; the GPU is
    still listed). gate.HostFacts keeps them apart from the GPUs.
    """

    recorded_as = "nvidia-smi-query-gpu.csv"
    _command = f"nvidia-smi --query-gpu={_GPU_FIELDS} --format=csv,noheader,nounits 2>&1 || true"
    fake_match = _command_pattern(_command)

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        # 2>&1 || true: "driver not loaded" (exit 9) must reach process(), not fail the host.
        return self._command

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[dict]:
        lines = _lines(output)
        if any(line.startswith(_NO_DRIVER) or line.strip() == _NO_DEVICES for _, line in lines):
            return []
        gpus = []
        for n, line in lines:
            problem = self._problem(line.strip())
            if problem is not None:
                if problem["problem"] in ("driver-library-mismatch", "nvml-init", "driver-too-old"):
                    return [problem]  # nothing else nvidia-smi printed is a GPU row
                gpus.append(problem)
                continue
            fields = [field.strip() for field in line.split(",")]
            if fields[0] == "index":  # a header row, if --format lost "noheader"
                continue
            if len(fields) != 13:
                raise FactParseError("NvidiaGpus", n, "13 comma-separated --query-gpu fields", line)
            gpus.append(self._gpu(n, line, fields))
        return gpus

    @staticmethod
    def _problem(line: str) -> dict | None:
        if _UNKNOWN_FIELD.match(line):
            return {"problem": "driver-too-old", "bus_id": None, "message": line}
        match = _NVML_INIT.match(line)
        if match:
            kind = "driver-library-mismatch" if "Driver/library version mismatch" in line else "nvml-init"
            return {"problem": kind, "bus_id": None, "message": line}
        match = _DEVICE_HANDLE.match(line) or _INFOROM.match(line)
        if match:
            kind = "inforom" if line.startswith("WARNING: infoROM") else "device-handle"
            return {"problem": kind, "bus_id": match["bus"], "message": line}
        return None

    @staticmethod
    def _gpu(n: int, line: str, fields: list[str]) -> dict:
        def value(i: int) -> str | None:
            field = fields[i]
            return None if field in _NOT_A_VALUE or (field.startswith("[") and field.endswith("]")) else field

        def number(i: int, what: str, unit: str = "") -> int | None:
            field = value(i)
            if field is None:
                return None
            if unit and field.endswith(unit):
                field = field[: -len(unit)].rstrip()
            if not re.fullmatch(r"[0-9]+", field):
                raise FactParseError("NvidiaGpus", n, f"{what} as an integer", line)
            return int(field)

        def switch(i: int, what: str) -> bool | None:
            field = value(i)
            if field is None:
                return None
            if field not in ("Enabled", "Disabled"):
                raise FactParseError("NvidiaGpus", n, f"{what} Enabled/Disabled", line)
            return field == "Enabled"

        index = number(0, "index")
        name = value(1)
        if index is None or not name:
            raise FactParseError("NvidiaGpus", n, "a GPU index and name", line)
        compute = value(5)
        if compute is not None and not re.match(r"^[0-9]+\.[0-9]+$", compute):
            raise FactParseError("NvidiaGpus", n, "compute_cap like 7.0", line)
        return {
            "index": index,
            "name": name,
            "uuid": value(2),
            "bus_id": value(3),
            "memory_mib": number(4, "memory.total", "MiB"),
            "compute_capability": compute,
            "driver_version": value(6),
            "pcie_gen_current": number(7, "pcie.link.gen.current"),
            "pcie_gen_max": number(8, "pcie.link.gen.max"),
            "pcie_width_current": number(9, "pcie.link.width.current"),
            "pcie_width_max": number(10, "pcie.link.width.max"),
            "persistence_mode": switch(11, "persistence_mode"),
            "ecc_enabled": switch(12, "ecc.mode.current"),
        }


_LSPCI_LINE = re.compile(
    r"^(?P<slot>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*?\[(?P<class>[0-9a-f]{4})\]: "
    r"(?P<description>.*) \[10de:(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]{2}\))?$",
    re.IGNORECASE,
)
_GPU_PCI_CLASSES = {"0300", "0302"}  # VGA compatible controller, 3D controller


class NvidiaPciDevices(FactBase):
    """The GPUs on the bus whether or not a driver is loaded: the gate's view of a bare host."""

    recorded_as = "lspci-nvidia.txt"
    _command = "lspci -nn -D -d 10de:"
    fake_match = _command_pattern(_command)

    def requires_command(self) -> str:
        return "lspci"

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[dict]:
        devices = []
        for n, line in _lines(output):
            match = _LSPCI_LINE.match(line.strip())
            if not match:
                raise FactParseError(
                    "NvidiaPciDevices", n, "an lspci -nn -D line ending in [10de:XXXX] (rev xx)", line
                )
            if match["class"] not in _GPU_PCI_CLASSES:
                continue  # the card's HDMI audio, USB-C, UCSI or NVSwitch bridge functions
            slot = match["slot"].lower()
            devices.append(
                {
                    "slot": slot if slot.count(":") == 2 else f"0000:{slot}",
                    "class": match["class"],
                    "device_id": match["device"].lower(),
                    "description": match["description"],
                }
            )
        return devices


_NVRM_VERSION = re.compile(
    r"^NVRM version: NVIDIA UNIX (?:(?P<open>Open Kernel Module for \S+)|\S+ Kernel Module)"
    r"\s+(?P<version>[0-9]+(?:\.[0-9]+)+)(?:\s|$)"
)


class NvidiaKernelModule(FactBase):
    """Volta needs the proprietary module: the open one refuses GPUs without GSP."""

    recorded_as = "proc-driver-nvidia-version.txt"
    _command = "cat /proc/driver/nvidia/version 2>/dev/null || true"
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> dict:
        return {"loaded": False, "flavor": None, "version": None}

    def process(self, output: list[str]) -> dict:
        lines = _lines(output)
        if not lines:
            return self.default()
        n, first = lines[0]
        match = _NVRM_VERSION.match(first.strip())
        if not match:
            raise FactParseError(
                "NvidiaKernelModule", n, "'NVRM version: NVIDIA UNIX ... Kernel Module  VERSION'", first
            )
        return {
            "loaded": True,
            "flavor": "open" if match["open"] else "proprietary",
            "version": match["version"],
        }


class NouveauLoaded(FactBase):
    """nouveau holds the GPUs: it must be blacklisted (and the initramfs rebuilt) before the driver."""

    recorded_as = "nouveau-count.txt"
    _command = "grep -c '^nouveau ' /proc/modules || true"
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> bool:
        return False

    def process(self, output: list[str]) -> bool:
        lines = _lines(output)
        if len(lines) != 1 or not re.fullmatch(r"[0-9]+", lines[0][1].strip()):
            n, line = lines[-1] if lines else (None, None)
            raise FactParseError("NouveauLoaded", n, "one count from grep -c", line)
        return int(lines[0][1]) > 0


_SB_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


class SecureBoot(FactBase):
    """With Secure Boot on, an unsigned DKMS nvidia.ko will not load: the driver needs MOK signing."""

    recorded_as = "secureboot.txt"
    # One marker line per branch, so the parser knows which source answered.
    _command = (
        "if command -v mokutil >/dev/null 2>&1; then echo SB:mokutil; mokutil --sb-state 2>&1 || true; "
        f"elif [ -r {_SB_VAR} ]; then echo SB:efivar; od -An -t u1 {_SB_VAR}; "
        "else echo SB:none; fi"
    )
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    def process(self, output: list[str]) -> str:
        fact = "SecureBoot"
        lines = _lines(output)
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


class KernelHeaders(FactBase):
    """DKMS needs linux-headers-<running kernel>: is it installed, or in a configured archive?

    {"package", "installed", "candidate"} (versions, None for "(none)"); both None when apt knows
    no such package (a custom or long-superseded kernel). None when not read (no apt-cache).
    """

    recorded_as = "apt-cache-policy-headers.txt"
    _command = ('k=$(uname -r); echo "headers linux-headers-$k"; '
                'apt-cache policy "linux-headers-$k" 2>/dev/null || true')
    fake_match = _command_pattern(_command)

    def requires_command(self) -> str:
        return "apt-cache"

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> dict:
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


class DiskFree(FactBase):
    """The checkpoint (~20 GiB NVFP4 + draft) and the wheels must fit where the model dir will be."""

    recorded_as = "df-model-dir.txt"
    path_arg = "models"
    fake_match = re.compile(r'; df -P -B1 "\$p"(?:$| \);)')

    def command(self, path: str) -> str:
        # The model dir may not exist yet: measure its nearest existing ancestor.
        return (
            f"p={shlex.quote(path)}; printf 'path %s\\n' \"$p\"; "
            'while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            "printf 'checked %s\\n' \"$p\"; "
            'df -P -B1 "$p"'
        )

    @staticmethod
    def default() -> dict:
        return {"path": None, "checked": None, "mount": None, "size_bytes": None, "free_bytes": None}

    def process(self, output: list[str]) -> dict:
        fact = "DiskFree"
        lines = [(n, line) for n, line in enumerate(output, 1)]
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


class ModelsOnDisk(FactBase):
    """What is already under the models dir, per revision directory: bytes on disk (partial
    downloads included) and whether its hub manifest was written. The disk check then needs only
    the missing bytes: a converged host downloads nothing and needs no room for it."""

    recorded_as = "models-on-disk.txt"
    fake_match = re.compile(r"b=\$\(du -sb -- \"\$d\" \| cut -f1\)")
    path_arg = "models"  # the stack path this fact takes (as DiskFree)

    def command(self, path: str) -> str:
        return (f"cd {shlex.quote(path)} 2>/dev/null || exit 0; "
                'for d in */; do [ -d "$d" ] && [ ! -L "${d%/}" ] || continue; '
                'b=$(du -sb -- "$d" | cut -f1); m=partial; [ -f "${d}qwen27b-manifest.sha256" ] && m=verified; '
                "printf '%s %s %s\\n' \"$b\" \"$m\" \"${d%/}\"; done")

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        found: dict[str, dict] = {}
        for n, line in _lines(output):
            match = _MODELS_LINE.match(line)
            if not match or match["name"] in found:
                raise FactParseError("ModelsOnDisk", n, "'<bytes> verified|partial <directory>', each once", line)
            found[match["name"]] = {"bytes": int(match["bytes"]), "verified": match["state"] == "verified"}
        return found


_MEMINFO_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_()]+):\s+(?P<value>[0-9]+)(?: kB)?$")


class MemoryInfo(FactBase):
    """Host RAM bounds the loader (safetensors are staged through page cache) and swap space for KV."""

    recorded_as = "meminfo"
    _command = "cat /proc/meminfo"
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> dict:
        return {"total_bytes": None, "available_bytes": None}

    def process(self, output: list[str]) -> dict:
        fact = "MemoryInfo"
        kib: dict[str, int] = {}
        for n, line in _lines(output):
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

_PY_VERSION = "import sys; print(\"%d.%d.%d\" % sys.version_info[:3])"
_PY_LINE = re.compile(r"^(?P<path>/\S*) (?P<major>[0-9]+)\.(?P<minor>[0-9]+)(?:\.[0-9]+)?\S*$")


class PythonVersions(FactBase):
    """The 1Cat-vLLM wheel needs Python 3.12: use one already there, or install our own under /opt."""

    recorded_as = "python-versions.txt"
    # Versioned names before the bare python3, so "3.10" maps to /usr/bin/python3.10; our own
    # builds come last. A python that will not start prints nothing (and is not offered).
    _command = (
        "for n in python3.8 python3.9 python3.10 python3.11 python3.12 python3.13 python3.14 python3; "
        'do c=$(command -v "$n" 2>/dev/null) || continue; case "$c" in /*) ;; *) continue;; esac; '
        f"v=$(\"$c\" -c '{_PY_VERSION}' 2>/dev/null) && echo \"$c $v\"; done; "
        "for c in /opt/qwen27b/python/*/bin/python3.[0-9]*; "
        'do case "$c" in *-config) continue;; esac; [ -x "$c" ] || continue; '
        f"v=$(\"$c\" -c '{_PY_VERSION}' 2>/dev/null) && echo \"$c $v\"; done; true"
    )
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        found: dict[str, str] = {}
        for n, line in _lines(output):
            match = _PY_LINE.match(line.strip())
            if not match:
                raise FactParseError("PythonVersions", n, "'/path/to/python X.Y.Z'", line)
            found.setdefault(f"{match['major']}.{match['minor']}", match["path"])
        return found


_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"(?P<xid>[0-9]+),\s*(?P<text>.*)$"
)
_ISO_TIME = re.compile(
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)\s"
)
_DMESG_TIME = re.compile(r"^\[([^\]]+)\]")


class XidErrors(FactBase):
    """Recent Xid events (79 fell off the bus, 48 double-bit ECC, ...) explain an unhealthy GPU."""

    recorded_as = "xid-errors.txt"
    # Not `journalctl -k`: -k implies -b (this boot only), and the Xid that matters is often the
    # one from before the last reboot.
    _command = (
        "(journalctl _TRANSPORT=kernel -o short-iso --no-pager -q --since=-7d 2>/dev/null "
        "|| dmesg 2>/dev/null) | grep -F 'NVRM: Xid' | tail -n 200 || true"
    )
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[dict]:
        events = []
        for n, line in _lines(output):
            at = line.find("NVRM: Xid")
            match = _XID.match(line, at) if at >= 0 else None
            if not match:
                raise FactParseError("XidErrors", n, "'NVRM: Xid (PCI:dddd:bb:dd): N, ...'", line)
            prefix = line[:at].strip()
            iso = _ISO_TIME.match(prefix + " ")
            bracket = _DMESG_TIME.match(prefix)
            if iso:
                time = iso.group(1)
            elif bracket:
                time = f"[{bracket.group(1).strip()}]"
            else:
                time = None
            text = match["text"].strip()
            # Drivers since ~R470 prefix the message with the process that hit it.
            text = re.sub(r"^pid=[^,]*,\s*", "", text)
            text = re.sub(r"^name=[^,]*,\s*", "", text)
            events.append({"time": time, "pci": match["pci"], "xid": int(match["xid"]), "text": text})
        return events


_DPKG_LINE = re.compile(
    r"^(?P<want>[uihrp])(?P<status>[ncHUFWti])(?P<err>[ R]) "
    r"(?P<package>[a-z0-9][a-z0-9+.-]*) ?(?P<version>\S*)$"
)


class NvidiaCudaPackages(FactBase):
    """Installed driver and CUDA packages: what to keep, what to replace, what conflicts."""

    recorded_as = "dpkg-nvidia-cuda.txt"
    _command = (
        "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
        "'nvidia-*' 'libnvidia-*' 'cuda-*' 'cuda' 2>/dev/null || true"
    )
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        installed: dict[str, str] = {}
        for n, line in _lines(output):
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


class HeldPackages(FactBase):
    """Driver and kernel are held after a verified install so unattended upgrades cannot swap them."""

    recorded_as = "apt-mark-showhold.txt"
    _command = "apt-mark showhold 2>/dev/null || true"
    fake_match = _command_pattern(_command)

    def command(self) -> str:
        return self._command

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[str]:
        held = set()
        for n, line in _lines(output):
            name = line.strip()
            if not _PACKAGE_NAME.match(name):
                raise FactParseError("HeldPackages", n, "one package name per line", line)
            held.add(name)
        return sorted(held)


ALL_FACTS: tuple[type[FactBase], ...] = (
    OsRelease,
    KernelRelease,
    NvidiaGpus,
    NvidiaPciDevices,
    NvidiaKernelModule,
    NouveauLoaded,
    SecureBoot,
    DiskFree,
    MemoryInfo,
    PythonVersions,
    XidErrors,
    NvidiaCudaPackages,
    HeldPackages,
    KernelHeaders,
    ModelsOnDisk,
)
