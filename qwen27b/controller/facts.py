"""Host facts the gate and the planner read, written the way pyinfra writes its own facts.

Each fact is a command plus a pure parser that turns the command's output lines into plain
JSON-able data: the parsers live in qwen27b/plan/hostfacts_parse.py and gpufacts_parse.py (no
pyinfra), each class here names its own as `parser`. A parser that cannot make sense of its
output raises FactParseError; `process` re-raises it as this module's FactParseError, a pyinfra
FactProcessError, which pyinfra reports as "could not process fact" and fails that host.

SNAPSHOT_NAMES names the file each fact's output is kept under: in doctor's snapshot of a host and
in a recorded host (tests/fixtures/hosts/<host>/). How a pyinfra @fake host answers a fact's
command is the tests' business (tests/support/recorded.py), not the fact's (issue 31).
"""

from __future__ import annotations

import copy
import shlex
from typing import Any, Callable

from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.facts import FactBase

from qwen27b.plan import hostfacts_parse
from qwen27b.plan.gpubound import bounded, hung_line, hung_problem, nvidia_smi, stack_bound
from qwen27b.plan.driverbuild import parse_driver_build, parse_installed_kernels
from qwen27b.plan.foreignunit import parse_unit_files, units_command
from qwen27b.plan.hostlayout import TAKEOVER_SUBDIR, UNIT_DIR
from qwen27b.plan.occupants import parse_occupants
from qwen27b.plan.mokstate import parse_mok_requests
from qwen27b.plan.driversource import parse_driver_source, source_command
from qwen27b.plan.gpufacts_parse import (P2P_MARKER, kernel_module_not_loaded, parse_gpu_topology, parse_nouveau_loaded,
                                         parse_nvidia_gpus, parse_nvidia_kernel_module, parse_nvidia_pci_devices,
                                         parse_xid_errors, parse_gpu_wear, WEAR_FIELDS, WEAR_REMAP_MARKER)
from qwen27b.plan.hostfacts_parse import (parse_disk_free, parse_glibc_version, parse_libstdcxx_version, parse_held_packages,
                                          parse_kernel_headers, parse_kernel_release, parse_memory_info, parse_models_on_disk,
                                          parse_nvidia_cuda_packages, parse_os_release, parse_python_versions,
                                          parse_secure_boot)


class FactParseError(hostfacts_parse.FactParseError, FactProcessError):
    """A fact's output did not have the shape its parser expects (garbled or truncated), as the
    FactProcessError pyinfra catches. host_facts.py raises it directly."""


class _ParsedFact(FactBase):
    """A fact whose output its `parser` (a pure function of qwen27b/plan) reads as a terminal would
    show it (escape sequences and carriage returns applied: hostfacts_parse.terminal_text), and whose
    command is its `_command` unless it builds one from an argument (DiskFree, ModelsOnDisk)."""

    _command: str
    parser: Callable[[list[str]], Any]
    requires: str | None = None  # the binary pyinfra checks for first; absent, the fact answers `empty`
    empty: Any = None  # the answer to an empty output or a missing binary (a fresh copy each time)
    bounded_commands = 0  # how many bounded GPU commands (plan/gpubound.py) the command holds

    def hung(self, message: str) -> Any:
        """The answer when a bounded GPU command timed out (the output's gpubound.MARKER line)."""
        return self.default()

    def command(self) -> str:
        return self._command

    def requires_command(self, *args, **kwargs) -> str | None:
        return self.requires

    @classmethod
    def default(cls) -> Any:
        return copy.deepcopy(cls.empty)

    def process(self, output: list[str]) -> Any:
        text = hostfacts_parse.terminal_text(output)
        if self.bounded_commands and (message := hung_line(text)) is not None:
            return self.hung(message)
        try:
            return self.parser(text)
        except hostfacts_parse.FactParseError as error:
            raised = FactParseError(error.fact, error.lineno, error.expected, error.got)
            raise raised.with_traceback(error.__traceback__) from None


# --- OS and kernel -----------------------------------------------------------------------------

class OsRelease(_ParsedFact):
    """The distribution and release pick the CUDA repo path, driver packages and Python route."""

    _command = "cat /etc/os-release"
    parser = staticmethod(parse_os_release)

    empty = {"id": None, "version_id": None, "pretty_name": None, "codename": None, "id_like": None}


class GlibcVersion(_ParsedFact):
    """The host's glibc: a wheel whose shared objects need a newer GLIBC_ symbol version fails at
    import, mid-deploy; the gate compares (qwen27b/plan/installs.py binary_needs_check) before any change."""

    _command = "getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1"
    parser = staticmethod(parse_glibc_version)


class LibstdcxxVersion(_ParsedFact):
    """The highest GLIBCXX_ version the host's libstdc++ defines: a wheel needing a newer one fails at
    import like a glibc one (installs.binary_needs_check). Its version names read from the library itself
    with grep, since binutils (strings, readelf) may not be installed yet; the first library found
    (Debian/Ubuntu's multiarch dir, then the others); none: no output."""

    _command = ("for f in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6 /usr/lib/libstdc++.so.6; "
                "do if [ -e \"$f\" ]; then grep -ao 'GLIBCXX_[0-9][0-9.]*[0-9]' \"$f\" | sort -u; break; fi; done")
    parser = staticmethod(parse_libstdcxx_version)


class KernelRelease(_ParsedFact):
    """DKMS builds the driver for the running kernel; its headers package is named after it."""

    _command = "uname -r"
    parser = staticmethod(parse_kernel_release)


# --- NVIDIA GPUs and driver --------------------------------------------------------------------

BOUND = stack_bound()  # every nvidia-smi below runs under it (plan/gpubound.py)

_GPU_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,compute_cap,driver_version,pcie.link.gen.current,"
    "pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,persistence_mode,ecc.mode.current"
)


class NvidiaGpus(_ParsedFact):
    """What the driver sees: count, memory, compute capability, link health, persistence, ECC,
    and nvidia-smi's failure lines as "problem" entries (parse_nvidia_gpus says which)."""

    _command = nvidia_smi(f"--query-gpu={_GPU_FIELDS} --format=csv,noheader,nounits", BOUND) + "; true"
    parser = staticmethod(parse_nvidia_gpus)

    requires = "nvidia-smi"
    bounded_commands = 1

    empty = []

    def hung(self, message: str) -> list:
        return [hung_problem(message)]  # the gate's refusal (gpustate.gpu_troubles)


class GpuWear(_ParsedFact):
    """Each GPU's wear before it serves (issue 27): ECC counts (volatile: since the driver loaded;
    aggregate: the card's life), retired pages and pending ones, persistence and ECC mode, the power
    limit and its range, then row remapping where the GPU has it (plan/gpuwear.py judges them)."""

    _command = (nvidia_smi(f"--query-gpu={','.join(WEAR_FIELDS)} --format=csv,noheader,nounits", BOUND) + "; "
                f"echo '{WEAR_REMAP_MARKER}'; "
                + nvidia_smi("--query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,"
                             "remapped_rows.pending,remapped_rows.failure --format=csv,noheader", BOUND) + "; true")
    parser = staticmethod(parse_gpu_wear)

    requires = "nvidia-smi"
    bounded_commands = 2

    empty = None


class GpuTopology(_ParsedFact):
    """How the GPUs reach each other (NVLink, one PCIe switch, across sockets) and whether P2P reads
    work: the planner decides the custom all-reduce and NCCL's P2P per TP group from it
    (qwen27b/plan/topology.py). parse_gpu_topology gives the shape; None without a driver."""

    # `topo -p2p r` (R450+) may be missing on an old driver: its usage text then parses as "not read".
    _command = (nvidia_smi("topo -m", BOUND) + f"; echo '{P2P_MARKER}'; " + nvidia_smi("topo -p2p r", BOUND)
                + "; true")
    parser = staticmethod(parse_gpu_topology)

    requires = "nvidia-smi"
    bounded_commands = 2

    empty = None


class NvidiaPciDevices(_ParsedFact):
    """The GPUs on the bus whether or not a driver is loaded: the gate's view of a bare host."""

    _command = "lspci -nn -D -d 10de:"
    parser = staticmethod(parse_nvidia_pci_devices)

    requires = "lspci"

    empty = []


class NvidiaKernelModule(_ParsedFact):
    """Volta needs the proprietary module: the open one refuses GPUs without GSP."""

    _command = "cat /proc/driver/nvidia/version 2>/dev/null || true"
    parser = staticmethod(parse_nvidia_kernel_module)

    default = staticmethod(kernel_module_not_loaded)


class NouveauLoaded(_ParsedFact):
    """nouveau holds the GPUs: it must be blacklisted (and the initramfs rebuilt) before the driver."""

    _command = "grep -c '^nouveau ' /proc/modules || true"
    parser = staticmethod(parse_nouveau_loaded)

    empty = False


_SB_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


class SecureBoot(_ParsedFact):
    """With Secure Boot on, an unsigned DKMS nvidia.ko will not load: the driver needs MOK signing."""

    # One marker line per branch, so the parser knows which source answered.
    _command = (
        "if command -v mokutil >/dev/null 2>&1; then echo SB:mokutil; mokutil --sb-state 2>&1 || true; "
        f"elif [ -r {_SB_VAR} ]; then echo SB:efivar; od -An -t u1 {_SB_VAR}; "
        "else echo SB:none; fi"
    )
    parser = staticmethod(parse_secure_boot)


class MokRequests(_ParsedFact):
    """The MOK keys waiting for enrolment (`mokutil --list-new`): on a Secure-Boot host a reboot is
    then for the key enrolment, at the console (plan/mokstate.py; issue 52 item 8)."""

    _command = "mokutil --list-new 2>&1 || true"
    parser = staticmethod(parse_mok_requests)
    requires = "mokutil"
    empty = None


class KernelHeaders(_ParsedFact):
    """DKMS needs linux-headers-<running kernel>: is it installed, or in a configured archive?

    parse_kernel_headers gives the shape; None when not read (no apt-cache).
    """

    _command = ('k=$(uname -r); echo "headers linux-headers-$k"; '
                'apt-cache policy "linux-headers-$k" 2>/dev/null || true')
    parser = staticmethod(parse_kernel_headers)

    requires = "apt-cache"

    empty = None


# --- Resources ---------------------------------------------------------------------------------

class DiskFree(_ParsedFact):
    """The checkpoint (~20 GiB NVFP4 + draft) and the wheels must fit where the model dir will be."""

    path_arg = "models"
    parser = staticmethod(parse_disk_free)

    def command(self, path: str) -> str:
        # The model dir may not exist yet: measure its nearest existing ancestor.
        return (
            f"p={shlex.quote(path)}; printf 'path %s\\n' \"$p\"; "
            'while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            "printf 'checked %s\\n' \"$p\"; "
            'df -P -B1 "$p"'
        )

    empty = {"path": None, "checked": None, "mount": None, "size_bytes": None, "free_bytes": None}


class ModelsOnDisk(_ParsedFact):
    """What is already under the models dir, per revision directory: bytes on disk (partial
    downloads included) and whether its hub manifest was written. The disk check then needs only
    the missing bytes: a converged host downloads nothing and needs no room for it."""

    parser = staticmethod(parse_models_on_disk)
    path_arg = "models"  # the stack path this fact takes (as DiskFree)

    def command(self, path: str) -> str:
        return (f"cd {shlex.quote(path)} 2>/dev/null || exit 0; "
                'for d in */; do [ -d "$d" ] && [ ! -L "${d%/}" ] || continue; '
                'b=$(du -sb -- "$d" | cut -f1); m=partial; [ -f "${d}qwen27b-manifest.sha256" ] && m=verified; '
                "printf '%s %s %s\\n' \"$b\" \"$m\" \"${d%/}\"; done")

    empty = {}


class MemoryInfo(_ParsedFact):
    """Host RAM bounds the loader (safetensors are staged through page cache) and swap space for KV."""

    _command = "cat /proc/meminfo"
    parser = staticmethod(parse_memory_info)

    empty = {"total_bytes": None, "available_bytes": None}


# --- Software ----------------------------------------------------------------------------------

_PY_VERSION = "import sys; print(\"%d.%d.%d\" % sys.version_info[:3])"


class PythonVersions(_ParsedFact):
    """The 1Cat-vLLM wheel needs Python 3.12: use one already there, or install our own under /opt."""

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
    parser = staticmethod(parse_python_versions)

    empty = {}


class XidErrors(_ParsedFact):
    """Recent Xid events (79 fell off the bus, 48 double-bit ECC, ...) explain an unhealthy GPU."""

    # Not `journalctl -k`: -k implies -b (this boot only), and the Xid that matters is often the
    # one from before the last reboot.
    # Bounded too (plan/gpubound.py): it is what the refusal of a wedged GPU quotes.
    _command = (
        f"({bounded('journalctl _TRANSPORT=kernel -o short-iso --no-pager -q --since=-7d', BOUND)} 2>/dev/null "
        f"|| {bounded('dmesg', BOUND)} 2>/dev/null) | grep -F 'NVRM: Xid' | tail -n 200 || true"
    )
    parser = staticmethod(parse_xid_errors)
    bounded_commands = 2

    empty = []


class NvidiaCudaPackages(_ParsedFact):
    """Installed driver and CUDA packages: what to keep, what to replace, what conflicts."""

    _command = (
        "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
        "'nvidia-*' 'libnvidia-*' 'cuda-*' 'cuda' 2>/dev/null || true"
    )
    parser = staticmethod(parse_nvidia_cuda_packages)

    empty = {}


class HeldPackages(_ParsedFact):
    """Driver and kernel are held after a verified install so unattended upgrades cannot swap them."""

    _command = "apt-mark showhold 2>/dev/null || true"
    parser = staticmethod(parse_held_packages)

    empty = []


class DriverSource(_ParsedFact):
    """Where the installed nvidia-driver-* comes from (apt-cache policy), the apt pins and the
    unattended-upgrades origins that would move it (plan/driversource.py; issue 52 item 5)."""

    _command = source_command()
    parser = staticmethod(parse_driver_source)

    empty = None


class DriverBuild(_ParsedFact):
    """A driver build that failed (issue 24): the NVIDIA packages dpkg left half-configured, `dkms
    status` and the newest nvidia make.log's last lines (plan/driverbuild.py reads them)."""

    _command = (
        "echo '== dpkg'; dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' 'nvidia-*' 'libnvidia-*' "
        "'cuda-drivers*' 2>/dev/null | grep -v '^.[inc] ' || true; "
        "echo '== dkms'; if command -v dkms >/dev/null 2>&1; then dkms status 2>/dev/null | grep '^nvidia' || true; fi; "
        "l=$(ls -t /var/lib/dkms/nvidia*/*/build/make.log 2>/dev/null | head -n 1); "
        'if [ -n "$l" ]; then echo "== log $l"; tail -n 25 "$l"; fi; true'
    )
    parser = staticmethod(parse_driver_build)

    empty = None


class InstalledKernels(_ParsedFact):
    """Kernels installed beside the running one, their headers, and GRUB_DEFAULT: which kernel the
    deploy's reboot boots, and whether DKMS can build the driver for it (issue 24)."""

    _command = (
        "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' 'linux-image-[0-9]*' 'linux-headers-[0-9]*' "
        "2>/dev/null | grep '^.i ' || true; grep -h '^GRUB_DEFAULT=' /etc/default/grub /etc/default/grub.d/*.cfg "
        "2>/dev/null || true"
    )
    parser = staticmethod(parse_installed_kernels)

    empty = None



class Occupants(_ParsedFact):
    """Who already listens on TCP ports and holds GPU memory, with each process's systemd unit (and
    each socket unit's port, for systemd's own listeners): an
    old vLLM or Ollama (container) on the port or the GPUs is named before anything is installed
    (plan/occupants.py; issue 24)."""

    _command = (
        "echo '== listen'; ss -Hltnp 2>/dev/null || true; "
        "echo '== gpu'; if command -v nvidia-smi >/dev/null 2>&1; then "
        # bounded without the marker: a hung nvidia-smi leaves the GPU section empty (NvidiaGpus says why)
        + bounded("nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_bus_id --format=csv,noheader,nounits",
                  BOUND) + " 2>/dev/null || true; fi; "
        "echo '== units'; for p in $( { ss -Hltnp 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2; "
        + bounded("nvidia-smi --query-compute-apps=pid --format=csv,noheader", BOUND)
        + " 2>/dev/null; } | grep -E '^[0-9]+$' | sort -u); "
        'do u=$(ps -o unit= -p "$p" 2>/dev/null | tr -d " "); c=$(ps -o comm= -p "$p" 2>/dev/null); '
        'printf \'%s %s %s\\n\' "$p" "${u:--}" "$c"; done; '
        # a socket unit's listener is systemd's (pid 1) in ss: which unit it is
        "echo '== sockets'; systemctl list-sockets --no-legend --full 2>/dev/null || true; true"
    )
    parser = staticmethod(parse_occupants)
    bounded_commands = 2

    empty = None


class UnitFiles(_ParsedFact):
    """The unit files named qwen27b* in systemd's unit dir (first line, ExecStart, EnvironmentFile,
    enabled/active) and a kept take-over's manifest: a lab's own unit on our names is not ours
    (plan/foreignunit.py; issue 52)."""

    path_arg = "state"
    parser = staticmethod(parse_unit_files)

    def command(self, path: str) -> str:
        return units_command(UNIT_DIR, f"{path}/{TAKEOVER_SUBDIR}")

    empty = None


ALL_FACTS: tuple[type[FactBase], ...] = (
    OsRelease,
    KernelRelease,
    NvidiaGpus,
    NvidiaPciDevices,
    NvidiaKernelModule,
    NouveauLoaded,
    SecureBoot,
    MokRequests,
    DriverSource,
    DiskFree,
    MemoryInfo,
    PythonVersions,
    XidErrors,
    NvidiaCudaPackages,
    HeldPackages,
    KernelHeaders,
    ModelsOnDisk,
    GpuTopology,
    GlibcVersion,
    LibstdcxxVersion,
    DriverBuild,
    InstalledKernels,
    Occupants,
    GpuWear,
    UnitFiles,
)


# The file each fact's output is kept under, in doctor's snapshot and in a recorded host (every fact of
# ALL_FACTS has one; tests/unit/test_recorded.py holds the two equal).
SNAPSHOT_NAMES: dict[type[FactBase], str] = {
    OsRelease: "os-release",
    GlibcVersion: "glibc-version.txt",
    LibstdcxxVersion: "libstdcxx-versions.txt",
    KernelRelease: "uname-r.txt",
    NvidiaGpus: "nvidia-smi-query-gpu.csv",
    GpuTopology: "nvidia-smi-topo.txt",
    NvidiaPciDevices: "lspci-nvidia.txt",
    NvidiaKernelModule: "proc-driver-nvidia-version.txt",
    NouveauLoaded: "nouveau-count.txt",
    SecureBoot: "secureboot.txt",
    MokRequests: "mok-list-new.txt",
    DriverSource: "driver-source.txt",
    KernelHeaders: "apt-cache-policy-headers.txt",
    DiskFree: "df-model-dir.txt",
    ModelsOnDisk: "models-on-disk.txt",
    MemoryInfo: "meminfo",
    PythonVersions: "python-versions.txt",
    XidErrors: "xid-errors.txt",
    NvidiaCudaPackages: "dpkg-nvidia-cuda.txt",
    HeldPackages: "apt-mark-showhold.txt",
    DriverBuild: "driver-build.txt",
    InstalledKernels: "installed-kernels.txt",
    Occupants: "occupants.txt",
    GpuWear: "nvidia-smi-wear.csv",
    UnitFiles: "unit-files.txt",
}
