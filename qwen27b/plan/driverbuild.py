"""A driver build that failed, and kernels installed but not booted (issue 24): the parsers of
the two facts that read them (controller/facts.py DriverBuild, InstalledKernels) and the gate's
pure decisions on them.

A failed DKMS build leaves the driver packages half-configured (dpkg `iF`/`iU`); NvidiaCudaPackages
lists installed packages only, so the plan re-ran the same install, which failed the same way. Here
dpkg's half states, `dkms status` and the build log's last lines name the cause and the fix.

DKMS builds the module only for kernels whose headers are installed: a newer kernel that
unattended-upgrades installed without them is what the deploy's own reboot boots, with no module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qwen27b.plan.hostfacts_parse import FactParseError, numbered_lines

# --- DriverBuild -------------------------------------------------------------------------------

SECTIONS = ("dpkg", "dkms", "log")
_SECTION = re.compile(r"^== (dpkg|dkms|log)(?: (?P<path>/\S+))?$")
# dpkg-query ${db:Status-Abbrev}: want, status, error flag. The half states: U unpacked, F
# half-configured, H half-installed, W triggers-awaited, t triggers-pending; R: reinstall required.
_DPKG_HALF = re.compile(r"^(?P<want>[uihrp])(?P<status>[ncHUFWti])(?P<err>[ R]) "
                        r"(?P<package>[a-z0-9][a-z0-9+.-]*) ?(?P<version>\S*)$")
HALF_STATES = {"U": "unpacked, not configured", "F": "half-configured", "H": "half-installed",
               "W": "awaiting triggers", "t": "triggers pending"}
# dkms status, DKMS 3 ("nvidia/535.183.01, 6.8.0-45-generic, x86_64: installed") and 2
# ("nvidia, 470.74, 5.4.0-89-generic, x86_64: installed"); "nvidia/390.157: added" has no kernel.
_DKMS3 = re.compile(r"^(?P<module>[\w.+-]+)/(?P<version>[\w.+~-]+)(?:, (?P<kernel>[\w.+~-]+), (?P<arch>\w+))?: "
                    r"(?P<status>[\w ]+?)(?: \(.*\))?$")
_DKMS2 = re.compile(r"^(?P<module>[\w.+-]+), (?P<version>[\w.+~-]+)(?:, (?P<kernel>[\w.+~-]+), (?P<arch>\w+))?: "
                    r"(?P<status>[\w ]+?)(?: \(.*\))?$")


def parse_driver_build(output: list[str]) -> dict | None:
    """{"half": [{package, version, state}], "dkms": [{module, version, kernel, status}], "log":
    {"path", "lines"} | None} from the DriverBuild command's three sections; None for no output."""
    fact = "DriverBuild"
    lines = numbered_lines(output)
    if not lines:
        return None
    found: dict = {"half": [], "dkms": [], "log": None}
    section = None
    for n, line in lines:
        head = _SECTION.match(line)
        if head:
            section = head[1]
            if section == "log":
                found["log"] = {"path": head["path"], "lines": []}
            continue
        if section is None:
            raise FactParseError(fact, n, "'== dpkg' first", line)
        if section == "dpkg":
            match = _DPKG_HALF.match(line)
            if not match:
                raise FactParseError(fact, n, "'<Status-Abbrev> <package> <version>'", line)
            if match["status"] in HALF_STATES or match["err"] == "R":
                found["half"].append({"package": match["package"], "version": match["version"] or None,
                                      "state": HALF_STATES.get(match["status"], "reinstall required")})
        elif section == "dkms":
            match = _DKMS3.match(line.strip()) or _DKMS2.match(line.strip())
            if match and match["module"].startswith("nvidia"):
                found["dkms"].append({"module": match["module"], "version": match["version"],
                                      "kernel": match["kernel"], "status": match["status"]})
            # other modules' lines and dkms's own warnings are not the driver's: skipped
        else:
            found["log"]["lines"].append(line)
    return found


@dataclass(frozen=True)
class BuildFailure:
    """A driver build left broken on the host: what, why (read from the log) and how to repair it."""

    what: str
    cause: str
    fix: str


# The build log's words for each cause, first match wins (make.log of nvidia-dkms; the lines are
# genuine ones from public issues, tests/fixtures/public-v100/README.md lists them).
_LOG_CAUSES = (
    # not "ERROR (dkms apport): kernel package linux-headers-X is not supported": apport prints it after
    # any failed build on a kernel Ubuntu did not ship (pop-os/beta#310), headers present or not
    ("headers", re.compile(r"[Kk]ernel headers for kernel \S+ cannot be found")),
    ("compiler", re.compile(r"unrecognized command[- ]line option|(?:gcc|cc)(?:-[0-9]+)?: (?:command )?not found|"
                            r"the compiler differs from the one used to build the kernel")),
    ("kernel", re.compile(r"error: (?:implicit declaration of function|too (?:few|many) arguments to function|"
                          r"'struct [a-z_]+' has no member named|initialization of .* from incompatible pointer type|"
                          r"unknown type name)")),
)
_COMPILER_WAS = re.compile(r"The kernel was built by: .*?\b(?:gcc|x86_64-linux-gnu-gcc)(?:-([0-9]+))?\b.*?\b([0-9]+)\.[0-9]+")


def _log_cause(lines: list[str], kernel: str | None, branch: int) -> tuple[str, str]:
    """(cause, fix) from the build log's last lines."""
    text = "\n".join(lines)
    last_error = next((line.strip() for line in reversed(lines) if "error" in line.lower()), None)
    for cause, pattern in _LOG_CAUSES:
        if not pattern.search(text):
            continue
        if cause == "compiler" and "the compiler differs" in text and not re.search(
                r"unrecognized command[- ]line option|not found", text):
            continue  # the warning alone is harmless: the build failed for another reason
        if cause == "headers":
            return (f"the build log says the kernel headers are missing ({pattern.search(text)[0]})",
                    f"`sudo apt-get install linux-headers-{kernel or '$(uname -r)'}` then `sudo dpkg --configure -a`")
        if cause == "compiler":
            was = _COMPILER_WAS.search(text)
            gcc = f"gcc-{was[1] or was[2]}" if was else "the gcc the kernel was built with ('The kernel was built by:' in the log)"
            shown = re.search(r"\S*: error: unrecognized command[- ]line option \S+|\S+: (?:command )?not found", text)
            return (f"the compiler does not match the kernel's ({shown[0] if shown else pattern.search(text)[0]})",
                    f"`sudo apt-get install {gcc}` (the compiler the kernel was built with), then `sudo dpkg --configure -a`")
        return (f"the R{branch} source does not compile against kernel {kernel or '?'} ({pattern.search(text)[0]}): "
                "the kernel is newer than the branch supports",
                f"boot the release's GA kernel (`sudo apt-get install linux-generic`, pick it in GRUB, remove the newer "
                f"one) or an R{branch} update that supports this kernel, then `sudo dpkg --configure -a`")
    if last_error:
        return f"the build log's last error: {last_error[:200]}", "fix that, then `sudo dpkg --configure -a`"
    said = "the build log's last lines name no error" if lines else "no build log was read"
    return said, "run `sudo dpkg --configure -a` and read /var/lib/dkms/nvidia*/*/build/make.log for the cause"


def failed_build(build: dict | None, kernel: str | None, branch: int) -> BuildFailure | None:
    """A failed driver build on the host, or None. The stack's own branch half-configured is refused
    (the same install would fail the same way); another branch's half-configured packages must be
    purged first (apt cannot purge around a package whose postinst fails)."""
    if not build:
        return None
    half = [h for h in build["half"] if h["package"].startswith(("nvidia-", "libnvidia-", "cuda-drivers"))]
    failed = [d for d in build["dkms"] if d["kernel"] in (None, kernel) and d["status"] not in ("installed", "built")]
    if not half and not failed:
        return None
    names = ", ".join(f"{h['package']} {h['version']} ({h['state']})" if h["version"] else f"{h['package']} ({h['state']})"
                      for h in half)
    dkms = ", ".join(f"{d['module']}/{d['version']}: {d['status']}" + (f" for {d['kernel']}" if d["kernel"] else "")
                     for d in failed)
    what = "; ".join(x for x in (f"dpkg: {names}" if names else "", f"dkms status: {dkms}" if dkms else "") if x)
    own = [h for h in half if re.search(rf"-{branch}(?:-server)?(?:-open)?$", h["package"])]
    log = build.get("log") or {}
    cause, fix = _log_cause(log.get("lines") or [], kernel, branch)
    where = f" ({log['path']})" if log.get("path") else ""
    if half and not own:
        others = " ".join(sorted({h["package"] for h in half}))
        return BuildFailure(what, f"an earlier driver install failed to build{where}: {cause}",
                            f"purge the half-configured packages (`sudo apt-get purge {others}`), then re-run the deploy: "
                            f"it installs R{branch}")
    return BuildFailure(what, f"the R{branch} driver build failed{where}: {cause}; the same install would fail the "
                        "same way", f"{fix}; then re-run the deploy")


# --- InstalledKernels ----------------------------------------------------------------------------

_KERNEL_LINE = re.compile(r"^(?P<want>[uihrp])(?P<status>[ncHUFWti])(?P<err>[ R]) "
                          r"linux-(?P<kind>image|headers)-(?P<release>[0-9][\w.+~-]*) ?(?P<version>\S*)$")
_GRUB_DEFAULT = re.compile(r"^GRUB_DEFAULT=(?P<value>.*)$")


def parse_installed_kernels(output: list[str]) -> dict | None:
    """{"images": [release], "headers": [release], "grub_default": str | None}: the installed
    linux-image-<release> and linux-headers-<release> packages (dpkg status i only) and the last
    GRUB_DEFAULT= line read; None for no output."""
    fact = "InstalledKernels"
    lines = numbered_lines(output)
    if not lines:
        return None
    found: dict = {"images": [], "headers": [], "grub_default": None}
    for n, line in lines:
        grub = _GRUB_DEFAULT.match(line.strip())
        if grub:
            found["grub_default"] = grub["value"].strip().strip("\"'")
            continue
        match = _KERNEL_LINE.match(line)
        if not match:
            raise FactParseError(fact, n, "'<Status-Abbrev> linux-image|headers-<release> <version>' or 'GRUB_DEFAULT=...'",
                                 line)
        listed = found["images" if match["kind"] == "image" else "headers"]
        if match["status"] == "i" and match["release"] not in listed:
            listed.append(match["release"])
    return found


def kernel_key(release: str) -> tuple:
    """The order GRUB's version sort gives Ubuntu kernel releases: 5.15.0-125-generic after
    5.15.0-60-generic, 6.8.0-45 after both (numbers compared as numbers)."""
    return tuple(int(p) if p.isdigit() else p for p in re.findall(r"[0-9]+|[a-z]+", release))


@dataclass(frozen=True)
class BootKernels:
    """Which kernel the deploy's reboot boots, and the headers DKMS needs for it."""

    boots: str | None  # None: GRUB_DEFAULT picks an entry this cannot read
    headers: tuple[str, ...]  # linux-headers-<release> to install beside the running kernel's
    reason: str  # which kernel the reboot boots, and why

    @property
    def planned(self) -> str:
        """The plan's words when the driver is installed with these headers."""
        if not self.headers:
            return f"{self.reason}; its headers are installed, so DKMS builds the driver for it too"
        return (f"{self.reason}; DKMS builds the driver only for kernels with headers, so {', '.join(self.headers)} "
                f"{'is' if len(self.headers) == 1 else 'are'} installed with the driver")


def boot_kernels(kernels: dict | None, running: str | None) -> BootKernels | None:
    """None when nothing but the running kernel is installed (or the fact was not read). GRUB_DEFAULT
    0 (Ubuntu's default) boots the newest installed kernel; any other value may pick any of them, so
    headers are planned for every installed kernel newer than the running one."""
    if not kernels or not running:
        return None
    newer = sorted((k for k in kernels["images"] if kernel_key(k) > kernel_key(running)), key=kernel_key)
    if not newer:
        return None
    default = kernels.get("grub_default")
    missing = lambda ks: tuple(f"linux-headers-{k}" for k in ks if k not in kernels["headers"])  # noqa: E731
    if default in (None, "", "0"):
        boots = newer[-1]
        headers = missing([boots])
        said = (f"the reboot boots {boots}, the newest installed kernel (GRUB_DEFAULT={default or '0'}), not the "
                f"running {running}")
    else:
        boots = None
        headers = missing(newer)
        said = (f"GRUB_DEFAULT={default}: the reboot may boot any installed kernel; {', '.join(newer)} "
                f"{'is' if len(newer) == 1 else 'are'} newer than the running {running}")
    return BootKernels(boots, headers, said)
