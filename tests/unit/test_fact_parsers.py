"""Garbled or truncated output never escapes a fact parser (qwen27b/plan/hostfacts_parse.py,
gpufacts_parse.py) as anything but FactParseError; the fact classes hand it to pyinfra as its own."""

import json
import pickle
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyinfra.api.exceptions import FactProcessError

from qwen27b.controller import facts as F
from qwen27b.controller.facts import ALL_FACTS, SNAPSHOT_NAMES
from qwen27b.plan.mokstate import parse_mok_requests
from qwen27b.plan.driversource import parse_driver_source
from qwen27b.plan import driverbuild as D
from qwen27b.plan import gpufacts_parse as G
from qwen27b.plan import foreignunit as U
from qwen27b.plan import occupants as O
from qwen27b.plan import hostfacts_parse as H
from qwen27b.plan.hostfacts_parse import FactParseError
from fuzz_budget import examples
from tests.support.paths import TESTS

HOSTS = TESTS / "fixtures" / "hosts"
NOCMD = "##PYINFRA_NOCMD##"

V100_ROW = (
    "0, Tesla V100-SXM2-32GB, GPU-4d7c5599-9e86-8796-7b19-6e94ae5b9529, 00000000:18:00.0, 32768, 7.0, "
    "580.95.05, 3, 3, 16, 16, Enabled, Enabled"
)
V100_PCI = (
    "0000:18:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB] [10de:1db5] (rev a1)"
)
DF_HEADER = "Filesystem         1-blocks        Used   Available Capacity Mounted on"
DF_ROW = "/dev/sda2   960197124096 512187269120 400000000000       57% /"

GARBLED = [
    # OsRelease
    (H.parse_os_release, []),
    (H.parse_os_release, ["garbage"]),
    (H.parse_os_release, ['PRETTY_NAME="Ubuntu 22.04.5 LTS"', 'NAME="Ubuntu"']),  # truncated before ID=
    (H.parse_os_release, ['ID="ubuntu']),  # cut inside the quotes
    (H.parse_os_release, ["ID=ubuntu", "VERSION_ID=22.04 LTS"]),  # unquoted spaces
    (H.parse_os_release, ["cat: /etc/os-release: No such file or directory"]),
    # KernelRelease
    (H.parse_kernel_release, []),
    (H.parse_kernel_release, ["5.15.0-125-generic", "5.15.0-126-generic"]),
    (H.parse_kernel_release, ["uname: invalid option -- 'x'"]),
    # NvidiaGpus
    (G.parse_nvidia_gpus, [V100_ROW.rsplit(",", 6)[0]]),  # truncated row
    (G.parse_nvidia_gpus, [V100_ROW, V100_ROW[:40]]),
    (G.parse_nvidia_gpus, ["Failed to initialize NVML"]),  # cut before the reason (the whole line is a "problem" entry)
    (G.parse_nvidia_gpus, ["Unable to determine the device handle for GPU 0000:3b"]),  # cut inside the bus id
    (G.parse_nvidia_gpus, [V100_ROW.replace("0, Tesla", "x, Tesla", 1)]),
    (G.parse_nvidia_gpus, [V100_ROW.replace("32768", "32 GB")]),
    (G.parse_nvidia_gpus, [V100_ROW.replace(", 7.0,", ", seven,")]),
    (G.parse_nvidia_gpus, [V100_ROW.replace("Enabled, Enabled", "Yes, Enabled")]),
    (G.parse_nvidia_gpus, [V100_ROW.replace(", 3, 3,", ", 3, gen3,")]),
    (G.parse_nvidia_gpus, [V100_ROW.replace("0, Tesla V100-SXM2-32GB", "[N/A], Tesla V100-SXM2-32GB")]),
    # NvidiaPciDevices
    (G.parse_nvidia_pci_devices, [V100_PCI[:70]]),
    (G.parse_nvidia_pci_devices, [V100_PCI.replace("[10de:1db5]", "[10de:1db]")]),
    (G.parse_nvidia_pci_devices, ["pcilib: Cannot open /proc/bus/pci"]),
    # NvidiaKernelModule
    (G.parse_nvidia_kernel_module, ["GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) "]),
    (G.parse_nvidia_kernel_module, ["NVRM version: NVIDIA UNIX"]),
    (G.parse_nvidia_kernel_module, ["NVRM version: NVIDIA UNIX x86_64 Kernel Module  "]),
    # NouveauLoaded
    (G.parse_nouveau_loaded, ["yes"]),
    (G.parse_nouveau_loaded, ["1", "2"]),
    (G.parse_nouveau_loaded, ["-1"]),
    # SecureBoot
    (H.parse_secure_boot, []),
    (H.parse_secure_boot, ["SB:mokutil"]),
    (H.parse_secure_boot, ["SB:mokutil", "Failed to read SecureBoot"]),
    (H.parse_secure_boot, ["SB:efivar"]),
    (H.parse_secure_boot, ["SB:efivar", "   6   0   0"]),
    (H.parse_secure_boot, ["SB:efivar", "   6   0   0   0   7"]),
    (H.parse_secure_boot, ["SecureBoot enabled"]),  # no marker
    (H.parse_secure_boot, ["SB:bios"]),
    # DiskFree
    (H.parse_disk_free, []),
    (H.parse_disk_free, ["path /var/lib/qwen27b/models", "checked /var/lib", DF_HEADER]),  # truncated
    (H.parse_disk_free, ["checked /var/lib", DF_HEADER, DF_ROW]),
    (H.parse_disk_free, ["path /var/lib/qwen27b/models", "checked /var/lib", "df: /var/lib: No such file", DF_ROW]),
    (H.parse_disk_free, ["path /x", "checked /", DF_HEADER, "/dev/sda2 960197124096 512187269120"]),
    (H.parse_disk_free, ["path /x", "checked /", DF_HEADER, DF_ROW, DF_ROW]),
    # MemoryInfo
    (H.parse_memory_info, []),
    (H.parse_memory_info, ["MemTotal:       lots kB"]),
    (H.parse_memory_info, ["MemFree:        60000000 kB", "MemAvailable:   61000000 kB"]),  # no MemTotal
    (H.parse_memory_info, ["MemTotal:       65843000 kB"]),  # truncated after the first line
    (H.parse_memory_info, ["MemTotal:       65843000 kB", "MemAvailable:   610000"[:-3] + " MB"]),
    # PythonVersions
    (H.parse_python_versions, ["/usr/bin/python3"]),
    (H.parse_python_versions, ["python3 3.10.12"]),
    (H.parse_python_versions, ["/usr/bin/python3 Python 3.10.12"]),
    (H.parse_python_versions, ["/usr/bin/python3 3"]),
    # XidErrors
    (G.parse_xid_errors, ["2026-11-30T10:12:01+0000 v100-node4 kernel: NVRM: Xid (PCI:0000:86"]),
    (G.parse_xid_errors, ["2026-11-30T10:12:01+0000 v100-node4 kernel: something else entirely"]),
    (G.parse_xid_errors, ["NVRM: Xid (PCI:0000:3b:00): seventy-nine, GPU has fallen off the bus."]),
    # NvidiaCudaPackages
    (H.parse_nvidia_cuda_packages, ["ii"]),
    (H.parse_nvidia_cuda_packages, ["xx  nvidia-driver-580-server 580.95.05-0ubuntu0.22.04.1"]),
    (H.parse_nvidia_cuda_packages, ["ii  nvidia-driver-580-server"]),  # installed but no version
    (H.parse_nvidia_cuda_packages, ["ii  nvidia-driver-580-server 580.95.05 extra"]),
    # HeldPackages
    (H.parse_held_packages, ["E: Could not open lock file /var/lib/dpkg/lock-frontend"]),
    (H.parse_held_packages, ["nvidia driver"]),
    # KernelHeaders
    (H.parse_kernel_headers, ["linux-headers-5.15.0-125-generic:"]),  # no marker line
    (H.parse_kernel_headers, ["headers linux-headers-"]),  # uname -r printed nothing
    (H.parse_kernel_headers, ["headers linux-headers-5.15.0-125-generic", "linux-headers-5.15.0-125-generic:",
                       "  Installed: (none)"]),  # cut before Candidate
    (H.parse_kernel_headers, ["headers linux-headers-5.15.0-125-generic", "E: Could not open lock file"]),
    # ModelsOnDisk
    (H.parse_models_on_disk, ["du: cannot read directory 'x@main/': Permission denied"]),
    (H.parse_models_on_disk, ["21904347136 verified"]),  # cut before the name
    (H.parse_models_on_disk, ["12 verified a@main", "13 partial a@main"]),
    # GlibcVersion
    (H.parse_glibc_version, ["glibc 2"]),
    (H.parse_glibc_version, ["getconf: Unrecognized variable `GNU_LIBC_VERSION'"]),
    (H.parse_glibc_version, ["glibc 2.35", "glibc 2.36"]),
    (H.parse_glibc_version, ["ldd (Ubuntu GLIBC 2.35-0ubuntu3.8)"]),  # cut before the version
    # LibstdcxxVersion
    (H.parse_libstdcxx_version, ["GLIBCXX_3.4.30", "grep: /usr/lib/libstdc++.so.6: binary file matches"]),
    (H.parse_libstdcxx_version, ["GLIBCXX_3."]),  # cut inside a name
    # GpuTopology
    (G.parse_gpu_topology, ["Segmentation fault"]),  # neither a matrix nor nvidia-smi's own failure
    (G.parse_gpu_topology, ["\tGPU0\tGPU1\tCPU Affinity", "GPU0\t X \tNV2\t0-15"]),  # cut before GPU1's row
    (G.parse_gpu_topology, ["\tGPU0\tGPU1\tCPU Affinity", "GPU0\t X \tNV2\t0-15", "GPU1\tNVX\t X \t0-15"]),
    (G.parse_gpu_topology, ["\tGPU0\tGPU1\tCPU Affinity", "GPU0\tPIX\t X \t0-15", "GPU1\tPIX\t X \t0-15"]),
    (G.parse_gpu_topology, ["\tGPU0\tGPU1", "GPU0\t X \tPHB", "GPU1\tPHB\t X ", G.P2P_MARKER,
                            " \tGPU0\tGPU1", " GPU0\tX\tOK", " GPU1\tMAYBE\tX"]),
    (G.parse_gpu_topology, ["\tGPU0\tGPU1", "GPU0\t X \tPHB", "GPU1\tPHB\t X ", G.P2P_MARKER,
                            " \tGPU0\tGPU2", " GPU0\tX\tOK", " GPU2\tOK\tX"]),  # another GPU set
    # DriverBuild
    (D.parse_driver_build, ["iF nvidia-dkms-580-server 580.95.05-0ubuntu0.22.04.1"]),  # no '== dpkg' first
    (D.parse_driver_build, ["== dpkg", "iF"]),  # cut before the package name
    (D.parse_driver_build, ["== dpkg", "Segmentation fault"]),
    # Occupants
    (O.parse_occupants, ["LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:*"]),  # no '== listen' first
    (O.parse_occupants, ["== listen", "LISTEN 0 4096 0.0.0.0"]),  # cut before the port
    (O.parse_occupants, ["== gpu", "4242, python3"]),  # cut after the name
    (O.parse_occupants, ["== units", "pid 4242"]),
    (O.parse_occupants, ["== listen", "== sockets", "/run/dbus/system_bus_socket"]),  # no unit
    # UnitFiles (issue 52): a unit's lines before its head, a head not on our names
    (U.parse_unit_files, ["[Unit]", "== kept"]),
    (U.parse_unit_files, ["== unit vllm.service enabled active", "[Unit]"]),
    # InstalledKernels
    (D.parse_installed_kernels, ["ii  linux-image-"]),
    (D.parse_installed_kernels, ["linux-image-6.8.0-45-generic"]),  # no status
    (D.parse_installed_kernels, ["ii  linux-modules-6.8.0-45-generic 6.8.0-45.45~22.04.1"]),
    # issue 27: GpuWear's 16 query fields, then its remapped-rows section
    (G.parse_gpu_wear, ["0, 00000000:3B:00.0, Enabled, Enabled, Enabled, 0, 0"]),  # cut short
    (G.parse_gpu_wear, ["0, 00000000:3B:00.0, Maybe, Enabled, Enabled, 0, 0, 0, 0, 0, 0, No, 300.00, 150.00, 300.00, 300.00"]),
    (G.parse_gpu_wear, ["0, 00000000:3B:00.0, Enabled, Enabled, Enabled, 0, 0, 0, 0, 0, 0, No, lots, 150.00, 300.00, 300.00"]),
    (G.parse_gpu_wear, ["##REMAPPED-ROWS", "00000000:3B:00.0, 0, x, No, No"]),
    # issue 52 item 8: MokRequests (mokutil --list-new)
    (parse_mok_requests, ["garbage"]),
    (parse_mok_requests, ["SHA1 Fingerprint: 5c:1f"]),  # a key's lines without its [key N]
    # issue 52 item 5: DriverSource (apt-cache policy, pins, unattended-upgrades origins)
    (parse_driver_source, ["garbage"]),
    (parse_driver_source, ["== policy", "  Installed: 580.95.05"]),  # no package line
    (parse_driver_source, ["== policy", "nvidia-driver-580:", "what is this"]),
]


FACT_OF = {fact.parser: fact for fact in ALL_FACTS}  # each class names its parser
GARBLED_IDS = [f"{FACT_OF[parser].__name__}-{i}" for i, (parser, _) in enumerate(GARBLED)]


@pytest.mark.parametrize("parser, output", GARBLED, ids=GARBLED_IDS)
def test_garbled_output_raises_fact_parse_error(parser, output):
    with pytest.raises(FactParseError) as error:
        parser(output)
    assert str(error.value).startswith(f"{FACT_OF[parser].__name__}: "), str(error.value)
    assert "expected" in str(error.value)


@pytest.mark.parametrize("parser, output", GARBLED, ids=GARBLED_IDS)
def test_the_fact_class_raises_it_as_pyinfras_error(parser, output):
    with pytest.raises(FactParseError) as pure:
        parser(output)
    with pytest.raises(FactProcessError) as error:
        FACT_OF[parser]().process(output)
    assert isinstance(error.value, F.FactParseError) and str(error.value) == str(pure.value)


def test_every_fact_has_garbled_cases():
    assert {FACT_OF[parser] for parser, _ in GARBLED} == set(ALL_FACTS)


def test_fact_parse_error_is_pyinfras_fact_process_error():
    # pyinfra catches FactProcessError to report "could not process fact" and fail only that host.
    assert issubclass(F.FactParseError, FactProcessError) and issubclass(F.FactParseError, FactParseError)
    error = F.FactParseError("NvidiaGpus", 3, "13 comma-separated --query-gpu fields", "0, Tesla")
    assert str(error) == "NvidiaGpus: line 3: expected 13 comma-separated --query-gpu fields, got '0, Tesla'"
    assert (error.fact, error.lineno) == ("NvidiaGpus", 3)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_error_names_the_offending_line():
    output = [V100_ROW, V100_ROW, "Segmentation fault (core dumped) nvidia-smi"]
    with pytest.raises(FactParseError, match=r"^NvidiaGpus: line 3: .*Segmentation fault"):
        G.parse_nvidia_gpus(output)


def test_driver_message_wins_over_other_lines():
    output = [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.",
    ]
    assert G.parse_nvidia_gpus(output) == []


# --- fuzzing -------------------------------------------------------------------------------------

GPU_KEYS = {
    "index", "name", "uuid", "bus_id", "memory_mib", "compute_capability", "driver_version",
    "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max", "persistence_mode",
    "ecc_enabled",
}  # fmt: skip


def _check_shape(fact, value):
    """A result that is not an error must still have the documented shape."""
    json.dumps(value)
    if fact is F.OsRelease:
        assert set(value) == {"id", "version_id", "pretty_name", "codename", "id_like"} and value["id"]
    elif fact is F.KernelRelease:
        assert isinstance(value, str) and value
    elif fact is F.NvidiaGpus:  # GPUs, and nvidia-smi's failure lines as "problem" entries (see the gate)
        gpus = [gpu for gpu in value if "problem" not in gpu]
        assert all(set(gpu) == GPU_KEYS and isinstance(gpu["index"], int) for gpu in gpus)
        assert all(set(p) - {"library_version"} == {"problem", "bus_id", "message"} for p in value if "problem" in p)
        assert all(p["problem"] == "driver-library-mismatch" for p in value if "library_version" in p)
    elif fact is F.NvidiaPciDevices:
        assert all(set(d) == {"slot", "class", "device_id", "description"} for d in value)
        assert all(d["class"] in ("0300", "0302") for d in value)
    elif fact is F.NvidiaKernelModule:
        assert set(value) == {"loaded", "flavor", "version"}
        assert value["flavor"] in (None, "open", "proprietary")
    elif fact is F.NouveauLoaded:
        assert isinstance(value, bool)
    elif fact is F.SecureBoot:
        assert value in ("enabled", "disabled", "unsupported")
    elif fact is F.DiskFree:
        assert set(value) == {"path", "checked", "mount", "size_bytes", "free_bytes"}
        assert isinstance(value["size_bytes"], int) and isinstance(value["free_bytes"], int)
    elif fact is F.MemoryInfo:
        assert isinstance(value["total_bytes"], int) and isinstance(value["available_bytes"], int)
    elif fact is F.PythonVersions:
        assert all(isinstance(k, str) and v.startswith("/") for k, v in value.items())
    elif fact is F.XidErrors:
        assert all(set(e) == {"time", "pci", "xid", "text"} and isinstance(e["xid"], int) for e in value)
    elif fact is F.NvidiaCudaPackages:
        assert all(isinstance(k, str) and v for k, v in value.items())
    elif fact is F.HeldPackages:
        assert value == sorted(value)
    elif fact is F.ModelsOnDisk:
        assert all(set(v) == {"bytes", "verified"} and isinstance(v["bytes"], int) for v in value.values())
    elif fact is F.GlibcVersion:
        assert value is None or (isinstance(value, str) and all(p.isdigit() for p in value.split(".")))
    elif fact is F.LibstdcxxVersion:
        assert value is None or (isinstance(value, str) and all(p.isdigit() for p in value.split(".")))
    elif fact is F.GpuWear:  # issue 27: None, or the GPUs' wear and the remapped rows by bus id
        assert value is None or (set(value) == {"gpus", "remapped_rows"} and all(
            isinstance(g["index"], int) and isinstance(g.get("retired_pending"), (bool, type(None))) for g in value["gpus"]))
    elif fact is F.GpuTopology:
        if value is not None:
            n = len(value["gpus"])
            assert set(value) == {"gpus", "links", "p2p_read"} and all(isinstance(g, int) for g in value["gpus"])
            for matrix in [value["links"]] + ([value["p2p_read"]] if value["p2p_read"] is not None else []):
                assert len(matrix) == n and all(len(row) == n and row[i] == "X" for i, row in enumerate(matrix))
    elif fact is F.KernelHeaders:
        assert set(value) == {"package", "installed", "candidate"} and value["package"].startswith("linux-headers-")
        assert all(v is None or (isinstance(v, str) and v and v != "(none)") for v in (value["installed"], value["candidate"]))
    elif fact is F.DriverBuild:
        if value is not None:
            assert set(value) == {"half", "dkms", "log"}
            assert all(set(h) == {"package", "version", "state"} and h["state"] for h in value["half"])
            assert all(set(d) == {"module", "version", "kernel", "status"} and d["module"].startswith("nvidia")
                       for d in value["dkms"])
            assert value["log"] is None or all(isinstance(line, str) for line in value["log"]["lines"])
    elif fact is F.InstalledKernels:
        if value is not None:
            assert set(value) == {"images", "headers", "grub_default"}
            assert all(k and k[0].isdigit() for k in value["images"] + value["headers"])
    elif fact is F.Occupants:
        if value is not None:
            assert set(value) == {"listen", "gpu", "units", "sockets"}
            assert all(isinstance(port, int) and units and all(u.endswith(".socket") for u in units)
                       for port, units in value["sockets"].items())
            assert all(set(e) == {"address", "port", "process", "pid"} and isinstance(e["port"], int) for e in value["listen"])
            assert all(set(a) == {"pid", "process", "used_mib", "bus_id"} for a in value["gpu"])
            assert all(isinstance(pid, int) and set(u) == {"unit", "comm"} for pid, u in value["units"].items())
    elif fact is F.DriverSource:
        if value is not None:
            assert set(value) == {"policy", "pins", "origins"}
            assert all(set(p) == {"installed", "candidate", "versions"} for p in value["policy"].values())
            assert all(set(p) == {"file", "package", "pin", "pin_priority"} for p in value["pins"])
    elif fact is F.MokRequests:
        if value is not None:
            assert all(set(k) == {"fingerprint", "subject"} for k in value)
    elif fact is F.UnitFiles:
        if value is not None:
            assert set(value) == {"units", "kept"} and all(isinstance(line, str) for line in value["kept"])
            assert all(set(u) == {"name", "first", "exec_start", "env_files", "enabled", "active"}
                       and u["name"].startswith("qwen27b") and isinstance(u["env_files"], list) for u in value["units"])
    else:  # pragma: no cover - a new fact needs a shape here
        raise AssertionError(f"no shape check for {fact.__name__}")


def _parse_or_error(fact, output):
    try:
        value = fact().process(output)  # the parser as pyinfra and doctor reach it
    except FactParseError:
        return
    _check_shape(fact, value)


def _recorded_outputs():
    outputs = []
    for fact in ALL_FACTS:
        for recorded in sorted(HOSTS.glob(f"*/{SNAPSHOT_NAMES[fact]}")):
            lines = recorded.read_text(encoding="utf-8").splitlines()
            if lines and lines != [NOCMD]:
                outputs.append((fact, lines))
    return outputs


RECORDED = _recorded_outputs()

# Genuine outputs of real machines from public issues (tests/fixtures/public-v100/README.md names each).
PUBLIC = TESTS / "fixtures" / "public-v100"
PUBLIC_OUTPUTS = {p.name: p.read_text(encoding="utf-8").splitlines() for p in sorted(PUBLIC.iterdir())
                  if p.name != "README.md"}
# every parser gets every genuine output, not only its own command's: a wrong file is refused clearly
FED = RECORDED + [(fact, lines) for fact in ALL_FACTS for lines in PUBLIC_OUTPUTS.values()]

# Text that looks like the outputs: digits, separators, brackets, words the parsers look for.
TOKENS = st.sampled_from([
    "0", "1", "7.0", "32768", " MiB", ", ", ",", "[N/A]", "N/A", "Enabled", "Disabled", "[0302]", "[0300]",
    "[10de:1db5]", " (rev a1)", "0000:3b:00.0", "NVRM version: NVIDIA UNIX ", "Open Kernel Module for x86_64",
    "x86_64 Kernel Module", "  580.95.05  ", "SB:mokutil", "SB:efivar", "SB:none", "SecureBoot ", "enabled",
    "path ", "checked ", "Filesystem", "/", " kB", "MemTotal:", "MemAvailable:", ":", "=", '"', "'", "ID",
    "/usr/bin/python3", " 3.10.12", "NVRM: Xid (PCI:0000:3b:00): ", "79, ", "pid=1, ", "name=x, ",
    "ii ", "hi ", "un ", " ", "\t", "%", "-", "\\", "Failed to initialize NVML: ", "Driver/library version mismatch",
    "NVML library version: ", "580.105", "[key 1]", "SHA1 Fingerprint: ", "MokNew is empty", "Subject: CN = x", "Unable to determine the device handle for GPU", "WARNING: infoROM is corrupted at gpu ", ": Unknown Error",
    'Field "compute_cap" is not a valid field to query.', "headers linux-headers-", "5.15.0-125-generic",
    "linux-headers-5.15.0-125-generic:", "  Installed: ", "  Candidate: ", "(none)", " verified ", " partial ",
    "nvidia--Qwen3.8-27B-NVFP4@main", "GPU0", "GPU1", "\tGPU0\tGPU1", " X ", "\tNV2", "\tPIX", "\tOK", "##P2P-READ", "glibc ", "2.35", "ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) ",
    "GLIBCXX_", "3.4.30",
])  # fmt: skip
TOKEN_LINE = st.lists(TOKENS, max_size=14).map("".join)
ANY_LINE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
LINES = st.lists(st.one_of(TOKEN_LINE, ANY_LINE), max_size=8)


@st.composite
def mutated_recordings(draw):
    """A real recorded output (ours or a public issue's), truncated, with lines dropped, duplicated,
    cut short, garbled or with a field replaced by N/A."""
    fact, lines = draw(st.sampled_from(FED))
    lines = list(lines[: draw(st.integers(0, len(lines)))])
    for _ in range(draw(st.integers(0, 3))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["cut", "drop", "replace", "insert", "swap-char", "duplicate", "na-field"]))
        if action == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif action == "drop":
            del lines[i]
        elif action == "replace":
            lines[i] = draw(st.one_of(TOKEN_LINE, ANY_LINE))
        elif action == "insert":
            lines.insert(i, draw(st.one_of(TOKEN_LINE, ANY_LINE)))
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "na-field":  # nvidia-smi's way of not knowing: a field becomes N/A, [N/A] or ERR!
            words = re.split(r"(\s+|,\s*|:\s*)", lines[i])
            j = draw(st.integers(0, len(words) - 1))
            words[j] = draw(st.sampled_from(["N/A", "[N/A]", "ERR!", "[Not Supported]", "?", ""]))
            lines[i] = "".join(words)
        elif lines[i]:
            j = draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:j] + draw(st.sampled_from(string.printable)) + lines[i][j + 1 :]
    return fact, lines


FUZZ = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fact", ALL_FACTS, ids=lambda fact: fact.__name__)
@FUZZ
@given(output=LINES)
def test_arbitrary_text_is_parsed_or_refused(fact, output):
    _parse_or_error(fact, output)


@FUZZ
@given(case=mutated_recordings())
def test_mutated_recordings_are_parsed_or_refused(case):
    fact, output = case
    _parse_or_error(fact, output)


def test_unmutated_recordings_parse():
    for fact, lines in RECORDED:
        _check_shape(fact, fact().process(lines))


# --- GpuTopology on genuine texts (tests/fixtures/topology/README.md names each source) ----------

TOPOLOGY = TESTS / "fixtures" / "topology"


def _topology(name: str) -> dict:
    return G.parse_gpu_topology((TOPOLOGY / name).read_text(encoding="utf-8").splitlines())


def test_dgx1_hybrid_cube_mesh_space_separated():
    topo = _topology("dgx1-8x-v100-sxm2-16gb.txt")
    assert topo["gpus"] == list(range(8)) and topo["p2p_read"] is None
    assert topo["links"][0] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]  # the NIC column is dropped
    assert topo["links"][7] == ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"]
    assert all(topo["links"][a][b] == topo["links"][b][a] for a in range(8) for b in range(8))


def test_r580_columns_and_a_mixed_box():
    topo = _topology("mixed-rtx3090-2x-v100-sxm2-nv6.txt")
    assert topo == {"gpus": [0, 1, 2], "links": [["X", "NODE", "NODE"], ["NODE", "X", "NV6"], ["NODE", "NV6", "X"]],
                    "p2p_read": None}


def test_pcie_paths_and_the_p2p_matrix():
    assert _topology("pcie-4x-pxb-pix-sys.txt")["links"][2] == ["SYS", "SYS", "X", "PIX"]
    topo = _topology("pcie-2x-phb-p2p-gns.txt")
    assert topo["links"] == [["X", "PHB"], ["PHB", "X"]] and topo["p2p_read"] == [["X", "GNS"], ["GNS", "X"]]


def test_no_driver_is_not_read_and_an_old_driver_without_p2p_is_links_only():
    assert G.parse_gpu_topology([]) is None
    assert G.parse_gpu_topology(["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                                 "Make sure that the latest NVIDIA driver is installed and running.", G.P2P_MARKER,
                                 "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."]) is None
    old = ["\tGPU0\tGPU1\tCPU Affinity", "GPU0\t X \tSOC\t0-7", "GPU1\tSOC\t X \t0-7", G.P2P_MARKER,
           "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."]
    assert G.parse_gpu_topology(old) == {"gpus": [0, 1], "links": [["X", "SOC"], ["SOC", "X"]], "p2p_read": None}


@pytest.mark.parametrize("fact", ALL_FACTS, ids=lambda fact: fact.__name__)
@pytest.mark.parametrize("name", sorted(PUBLIC_OUTPUTS))
def test_public_outputs_are_parsed_or_refused(fact, name):
    _parse_or_error(fact, PUBLIC_OUTPUTS[name])


def test_public_outputs_read_as_their_owners_saw_them():
    """Where a genuine output is the fact's own command, the parser reads what its owner saw."""
    assert G.parse_nvidia_gpus(PUBLIC_OUTPUTS["nvml-mismatch-570.txt"]) == [{
        "problem": "driver-library-mismatch", "bus_id": None,
        "message": "Failed to initialize NVML: Driver/library version mismatch", "library_version": "570.124"}]
    assert G.parse_nvidia_gpus(PUBLIC_OUTPUTS["nvml-mismatch-580.txt"])[0]["library_version"] == "580.178"
    assert G.parse_nvidia_gpus(PUBLIC_OUTPUTS["nvml-mismatch-460-unattended-upgrade.txt"])[0]["problem"] == \
        "driver-library-mismatch"
    assert G.parse_nvidia_kernel_module(PUBLIC_OUTPUTS["proc-version-open-525.60.11.txt"]) == {
        "loaded": True, "flavor": "open", "version": "525.60.11"}
    xids = G.parse_xid_errors(PUBLIC_OUTPUTS["xid-dmesg-ctime-r535.txt"])
    assert [(x["xid"], x["pci"]) for x in xids] == [(43, "0000:00:05"), (43, "0000:00:05"), (31, "0000:00:07"),
                                                    (94, "0000:00:08")]
    assert xids[0]["time"] == "[Wed Jul 31 23:14:18 2024]" and xids[0]["text"] == "Ch 00000008"
    assert xids[3]["text"].startswith("Contained: SM")
    assert [x["xid"] for x in G.parse_xid_errors(PUBLIC_OUTPUTS["xid-syslog-48-dbe.txt"])] == [48, 64]
    assert G.parse_xid_errors(PUBLIC_OUTPUTS["xid-79-fallen-off.txt"])[0]["text"] == "GPU has fallen off the bus"
    # a query with other fields, lspci without -nn -D, an nvidia-smi table where CSV rows belong: refused
    for parser, name in ((G.parse_nvidia_gpus, "query-gpu-3-fields-pg500-216.csv"),
                         (G.parse_nvidia_pci_devices, "lspci-no-slot-pg500-216.txt"),
                         (G.parse_nvidia_gpus, "smi-570.211.01-2x-v100-sxm2-16gb.txt"),
                         (G.parse_nvidia_kernel_module, "smi-q-390.30-v100-sxm2-16gb.txt")):
        with pytest.raises(FactParseError):
            parser(PUBLIC_OUTPUTS[name])


def test_gpu_wear_reads_each_gpu_and_the_remap_rows():
    """GpuWear (issue 27): a V100 prints no remapped rows (an error line there is skipped); [N/A] where
    ECC is off; an old driver that lacks a field gives None (the wear is then not read)."""
    wear = G.parse_gpu_wear((HOSTS / "v100x4-converged-nopm" / "nvidia-smi-wear.csv").read_text().splitlines()
                            + ["This query is not supported on this GPU."])
    assert [g["index"] for g in wear["gpus"]] == [0, 1, 2, 3] and wear["remapped_rows"] == {}
    assert wear["gpus"][1]["ecc_enabled"] is False and wear["gpus"][1]["ecc_corrected_aggregate"] is None
    assert wear["gpus"][0]["power_min_w"] == 150.0 and wear["gpus"][0]["persistence_mode"] is False
    worn = G.parse_gpu_wear((HOSTS / "v100x2-pcie-worn" / "nvidia-smi-wear.csv").read_text().splitlines())
    assert worn["gpus"][0]["retired_pending"] is True and worn["gpus"][0]["ecc_uncorrected_volatile"] == 3
    ampere = G.parse_gpu_wear(["##REMAPPED-ROWS", "00000000:00:06.0, 0, 1, Yes, No"])
    assert ampere["remapped_rows"] == {"00000000:00:06.0": {"correctable": 0, "uncorrectable": 1, "pending": True,
                                                            "failure": False}}
    assert G.parse_gpu_wear(['Field "retired_pages.sbe" is not a valid field to query.']) is None
    assert G.parse_gpu_wear(["Failed to initialize NVML: Driver/library version mismatch"]) is None


@pytest.mark.parametrize("name", ["nvml-mismatch-580.txt", "nvml-mismatch-570.txt",
                                  "nvml-mismatch-460-unattended-upgrade.txt"])
def test_every_gpu_fact_reads_the_mismatch_in_both_forms(name):
    """Issue 52 item 3: R535+ print the mismatch on two lines (`NVML library version: 580.178` after
    it; genuine R580 and R570 outputs, tests/fixtures/public-v100/README.md), R460 on one. Every fact
    that runs nvidia-smi reads both as "not read, NvidiaGpus says why", never a parse error: the
    topology and occupants facts refused the host as "could not be parsed" before."""
    from qwen27b.plan.occupants import parse_occupants
    said = PUBLIC_OUTPUTS[name]
    assert G.parse_nvidia_gpus(said)[0]["problem"] == "driver-library-mismatch"
    assert G.parse_gpu_topology(said) is None
    assert G.parse_gpu_topology(said + [G.P2P_MARKER] + said) is None
    assert G.parse_gpu_wear(said + [G.WEAR_REMAP_MARKER] + said) is None
    found = parse_occupants(["== listen", "== gpu", *said, "== units", "== sockets"])
    assert found["gpu"] == [] and found["listen"] == []
    # the version line alone, where a GPU row belongs, is still no GPU row
    with pytest.raises(FactParseError):
        G.parse_gpu_topology(["GPU0\tGPU1", "NVML library version: 580.105", "junk"])


# --- what a real host prints around the text (issue 57) -------------------------------------------

def _host_outputs():
    """(host, fact, lines) for every fact file of every recorded host that has output to parse."""
    for host_dir in sorted(d for d in HOSTS.iterdir() if d.is_dir()):
        for fact in ALL_FACTS:
            path = host_dir / SNAPSHOT_NAMES[fact]
            if path.is_file():
                lines = path.read_bytes().decode("utf-8").split("\n")
                lines = lines[:-1] if lines and lines[-1] == "" else lines
                if lines and lines != [NOCMD]:
                    yield host_dir.name, fact, lines


RECORDED_OUTPUTS = list(_host_outputs())
# What terminals and tools add that a person never sees: underline/bold/colour around a line or a word
# (nvidia-smi R580's `topo -m` header), CRLF line ends, an OSC window title, trailing blanks.
DRESSINGS = {
    "underlined": lambda line: f"\x1b[4m{line}\x1b[0m" if line else line,
    "coloured words": lambda line: re.sub(r"(\S+)", "\x1b[1;32m\\1\x1b[m", line, count=1),
    "crlf": lambda line: line + "\r",
    "osc title": lambda line: "\x1b]0;nvidia-smi\x07" + line,
    "trailing blanks": lambda line: line + " \t ",
}


@pytest.mark.parametrize("dressing", DRESSINGS)
def test_every_recorded_output_parses_the_same_however_it_is_dressed(dressing):
    """Every fact of every recorded host reads the same value from its output with escape sequences,
    carriage returns or trailing blanks added to every line: no real host's bytes fail a fact."""
    dress = DRESSINGS[dressing]
    checked = 0
    for host, fact, lines in RECORDED_OUTPUTS:
        plain = fact().process(lines)
        assert fact().process([dress(line) for line in lines]) == plain, (host, fact.__name__)
        checked += 1
    assert checked > 400  # every host's facts, not an empty set


def test_the_topology_reads_tabs_and_spaces_alike():
    """`topo -m` separates its cells with tabs; text copied out of a web page has spaces: both read."""
    for host, fact, lines in RECORDED_OUTPUTS:
        if fact is F.GpuTopology:
            spaced = [re.sub(r"\t", "    ", line) for line in lines]
            tabbed = [re.sub(r"(?<=\S) {2,}(?=\S)", "\t", line) for line in lines]
            assert fact().process(spaced) == fact().process(tabbed) == fact().process(lines), host


def test_terminal_text_applies_what_a_terminal_shows():
    assert H.terminal_text(["\t\x1b[4mGPU0\tCPU Affinity\x1b[0m", "a\r", "50%\r100%", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"]) \
        == ["\tGPU0\tCPU Affinity", "a", "100%", "link"]
