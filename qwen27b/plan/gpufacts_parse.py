"""Pure parsers of the GPU and driver facts' output: nvidia-smi, lspci, /proc/driver/nvidia,
/proc/modules, the kernel log's Xids. Same rules as hostfacts_parse.py (FactParseError, no pyinfra)."""

from __future__ import annotations

import re

from qwen27b.plan.hostfacts_parse import FactParseError, numbered_lines

# --- nvidia-smi --query-gpu ---------------------------------------------------------------------

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
# R535 and later print the library's version on a second line after the mismatch (R580:
# "NVML library version: 580.105"; tests/fixtures/public-v100/nvml-mismatch-580.txt): part of the failure.
_NVML_LIBRARY = re.compile(r"^NVML library version: (?P<version>[0-9]+(?:\.[0-9]+){1,2})\s*$")
_INFOROM = re.compile(
    r"^WARNING: infoROM is corrupted at gpu (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$"
)


def nvml_library_version(line: str) -> str | None:
    """The version on the second line of the mismatch form ("NVML library version: 580.105"), else None."""
    match = _NVML_LIBRARY.match(line.strip())
    return match["version"] if match else None


def smi_failed(lines: list[tuple[int, str]]) -> bool:
    """Every line is nvidia-smi's own failure (no driver, no devices, NVML not initialized, in its
    one-line or its two-line mismatch form), or nothing: the fact is then not read (NvidiaGpus says why)."""
    return all(line.strip().startswith(_SMI_FAILED) or nvml_library_version(line) is not None for _, line in lines)


def gpu_problem_line(line: str) -> dict | None:
    """A failure line of nvidia-smi's (query or table) as a "problem" entry; None for anything else."""
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


def _gpu_row(n: int, line: str, fields: list[str]) -> dict:
    """One GPU from a row's 13 --query-gpu fields ("[N/A]" and "Not Supported" become None)."""
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


def parse_nvidia_gpus(output: list[str]) -> list[dict]:
    """The GPU dicts, plus one {"problem", "bus_id", "message"} dict per failure line nvidia-smi printed.

    "driver-library-mismatch" (the driver was upgraded, the old kernel module is still loaded),
    "nvml-init" (NVML failed for another reason), "driver-too-old" (no compute_cap field: R470 and
    older), "device-handle" (a GPU that does not answer: Unknown Error / GPU is lost), "inforom" (a
    corrupted infoROM; the GPU is still listed). gate.HostFacts keeps them apart from the GPUs.
    """
    lines = numbered_lines(output)
    if any(line.startswith(_NO_DRIVER) or line.strip() == _NO_DEVICES for _, line in lines):
        return []
    gpus = []
    for at, (n, line) in enumerate(lines):
        problem = gpu_problem_line(line.strip())
        if problem is not None:
            if problem["problem"] in ("driver-library-mismatch", "nvml-init", "driver-too-old"):
                library = next((nvml_library_version(rest) for _, rest in lines[at + 1:at + 2]), None)
                if problem["problem"] == "driver-library-mismatch" and library:
                    problem["library_version"] = library  # the two-line form: the user space installed
                return [problem]  # nothing else nvidia-smi printed is a GPU row
            gpus.append(problem)
            continue
        fields = [field.strip() for field in line.split(",")]
        if fields[0] == "index":  # a header row, if --format lost "noheader"
            continue
        if len(fields) != 13:
            raise FactParseError("NvidiaGpus", n, "13 comma-separated --query-gpu fields", line)
        gpus.append(_gpu_row(n, line, fields))
    return gpus


# --- the PCI bus, the kernel modules, the kernel log ---------------------------------------------

_LSPCI_LINE = re.compile(
    r"^(?P<slot>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*?\[(?P<class>[0-9a-f]{4})\]: "
    r"(?P<description>.*) \[10de:(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]{2}\))?$",
    re.IGNORECASE,
)
_GPU_PCI_CLASSES = {"0300", "0302"}  # VGA compatible controller, 3D controller


def parse_nvidia_pci_devices(output: list[str]) -> list[dict]:
    """The NVIDIA GPU functions on the bus (class 0300/0302), whether or not a driver is loaded."""
    devices = []
    for n, line in numbered_lines(output):
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


def kernel_module_not_loaded() -> dict:
    """NvidiaKernelModule without /proc/driver/nvidia/version (also the fact's default)."""
    return {"loaded": False, "flavor": None, "version": None}


def parse_nvidia_kernel_module(output: list[str]) -> dict:
    """Loaded or not, and which flavour: Volta needs the proprietary module, not the open one."""
    lines = numbered_lines(output)
    if not lines:
        return kernel_module_not_loaded()
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


def parse_nouveau_loaded(output: list[str]) -> bool:
    """grep -c '^nouveau ' /proc/modules: is nouveau loaded?"""
    lines = numbered_lines(output)
    if len(lines) != 1 or not re.fullmatch(r"[0-9]+", lines[0][1].strip()):
        n, line = lines[-1] if lines else (None, None)
        raise FactParseError("NouveauLoaded", n, "one count from grep -c", line)
    return int(lines[0][1]) > 0


_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"(?P<xid>[0-9]+),\s*(?P<text>.*)$"
)
_ISO_TIME = re.compile(
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)\s"
)
_DMESG_TIME = re.compile(r"^\[([^\]]+)\]")


def parse_xid_errors(output: list[str]) -> list[dict]:
    """{"time", "pci", "xid", "text"} per NVRM Xid line, journalctl's ISO or dmesg's [seconds] time."""
    events = []
    for n, line in numbered_lines(output):
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


# --- nvidia-smi topo -m / topo -p2p r ------------------------------------------------------------

P2P_MARKER = "##P2P-READ"  # the GpuTopology command prints it between its two nvidia-smi calls
_GPU_LABEL = re.compile(r"^GPU([0-9]{1,3})$")
# topo -m cells between GPUs: NV<n> (a bonded set of n NVLinks), or the PCIe path; SOC is the
# pre-R384 name of SYS.
_LINK = re.compile(r"^(?:NV[0-9]{1,2}|PIX|PXB|PHB|NODE|SYS|SOC)$")
_P2P_STATUS = {"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}  # topo -p2p's legend
_SMI_FAILED = (_NO_DRIVER, _NO_DEVICES, "Failed to initialize NVML")


def _gpu_matrix(fact: str, lines: list[tuple[int, str]], cell: re.Pattern | set, what: str):
    """(GPU indices, square matrix of cells) from nvidia-smi's `topo` table in `lines`: a header of
    GPU<i> columns (NIC and affinity columns after them are ignored), then one row per GPU. Tabs
    or spaces alike (text copied out of an issue loses its tabs). None when there is no header."""
    header = None
    for at, (n, line) in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X"):
            header = at
            break
    if header is None:
        return None
    labels = []
    for token in lines[header][1].split():
        match = _GPU_LABEL.match(token)
        if not match:
            break
        labels.append(int(match[1]))
    if len(set(labels)) != len(labels):
        raise FactParseError(fact, lines[header][0], f"{what}: each GPU column once", lines[header][1])
    rows: dict[int, list[str]] = {}
    for n, line in lines[header + 1:]:
        tokens = line.split()
        match = _GPU_LABEL.match(tokens[0]) if tokens else None
        if not match:
            if len(rows) == len(labels):
                break  # the legend, the NIC rows
            raise FactParseError(fact, n, f"{what}: a row for each of GPU{', GPU'.join(map(str, labels))}", line)
        index, cells = int(match[1]), tokens[1:1 + len(labels)]
        ok = len(cells) == len(labels) and index in labels and index not in rows and all(
            (c == "X") == (labels[i] == index) and (c == "X" or (cell.match(c) if isinstance(cell, re.Pattern)
                                                                 else c in cell)) for i, c in enumerate(cells))
        if not ok:
            raise FactParseError(fact, n, f"{what}: GPU<i> then {len(labels)} cells, X on the diagonal", line)
        rows[index] = cells
        if len(rows) == len(labels):
            break
    if len(rows) != len(labels):
        n, line = lines[-1]
        raise FactParseError(fact, n, f"{what}: a row for each of the {len(labels)} GPU(s)", line)
    return labels, [rows[i] for i in labels]


def parse_gpu_topology(output: list[str]) -> dict | None:
    """`nvidia-smi topo -m`, then the P2P_MARKER line and `nvidia-smi topo -p2p r`:
    {"gpus": [nvidia-smi indices], "links": matrix of "X"/"NV2"/"PIX"/.../"SYS" in that order,
    "p2p_read": matrix of "X"/"OK"/"NS"/... or None where the driver printed none}.
    None when nvidia-smi printed only its own failure (no driver: NvidiaGpus reports that)."""
    fact = "GpuTopology"
    lines = numbered_lines(output)
    cut = next((i for i, (_, line) in enumerate(lines) if line.strip() == P2P_MARKER), len(lines))
    topo, p2p = lines[:cut], lines[cut + 1:]
    found = _gpu_matrix(fact, topo, _LINK, "topo -m")
    if found is None:
        if smi_failed(topo):
            return None
        n, line = topo[0] if topo else (None, None)
        raise FactParseError(fact, n, "nvidia-smi topo -m's matrix: a GPU0 GPU1 ... header, one row per GPU", line)
    labels, links = found
    p2p_found = _gpu_matrix(fact, p2p, _P2P_STATUS, "topo -p2p r")
    if p2p_found is not None and p2p_found[0] != labels:
        raise FactParseError(fact, p2p[0][0], f"topo -p2p r over the same GPUs as topo -m ({labels})", p2p[0][1])
    return {"gpus": labels, "links": links, "p2p_read": p2p_found[1] if p2p_found else None}


# --- nvidia-smi wear fields (issue 27) ------------------------------------------------------------

# The order of GpuWear's --query-gpu fields (controller/facts.py builds its command from this tuple).
WEAR_FIELDS = (
    "index", "pci.bus_id", "persistence_mode", "ecc.mode.current", "ecc.mode.pending",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.sbe", "retired_pages.dbe", "retired_pages.pending",
    "power.limit", "power.min_limit", "power.max_limit", "power.default_limit",
)
WEAR_REMAP_MARKER = "##REMAPPED-ROWS"  # GpuWear prints it before its --query-remapped-rows call
_WEAR_KEYS = ("index", "bus_id", "persistence_mode", "ecc_enabled", "ecc_pending",
              "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
              "ecc_uncorrected_aggregate", "retired_sbe", "retired_dbe", "retired_pending",
              "power_limit_w", "power_min_w", "power_max_w", "power_default_w")
_ENABLED = {"Enabled": True, "Disabled": False, "Yes": True, "No": False}


def _wear_value(n: int, line: str, key: str, field: str):
    """One wear field: None for [N/A]/[Not Supported] (no ECC on a GeForce, no page retirement on
    an Ampere that remaps rows instead), bool for Enabled/Disabled/Yes/No, float for watts, int else."""
    if field in _NOT_A_VALUE or (field.startswith("[") and field.endswith("]")):
        return None
    if key == "bus_id":
        return field
    if key in ("persistence_mode", "ecc_enabled", "ecc_pending", "retired_pending"):
        if field not in _ENABLED:
            raise FactParseError("GpuWear", n, f"{key} Enabled/Disabled or Yes/No", line)
        return _ENABLED[field]
    if key.endswith("_w"):
        if not re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", field.removesuffix(" W")):
            raise FactParseError("GpuWear", n, f"{key} in watts", line)
        return float(field.removesuffix(" W"))
    if not re.fullmatch(r"[0-9]+", field):
        raise FactParseError("GpuWear", n, f"{key} as a count", line)
    return int(field)


def parse_gpu_wear(output: list[str]) -> dict | None:
    """GpuWear: {"gpus": [per GPU: index, bus_id, persistence_mode, ecc_enabled, ecc_pending, the four
    ECC totals, retired_sbe/dbe (pages), retired_pending, power_limit_w/min/max/default],
    "remapped_rows": {bus_id: {"correctable", "uncorrectable", "pending", "failure"}}}.

    Row remapping is Ampere's and later: on a V100 `--query-remapped-rows` prints an error line
    and the mapping stays empty. None when nvidia-smi printed only its own failure (NvidiaGpus says
    why), or a query field the driver does not know (an old driver: the wear is then not read)."""
    lines = numbered_lines(output)
    cut = next((i for i, (_, line) in enumerate(lines) if line.strip() == WEAR_REMAP_MARKER), len(lines))
    query, remap = lines[:cut], lines[cut + 1:]
    gpus = []
    for n, line in query:
        text = line.strip()
        if text.startswith(_SMI_FAILED) or gpu_problem_line(text) is not None or nvml_library_version(text):
            if gpu_problem_line(text) and gpu_problem_line(text)["problem"] in ("device-handle", "inforom"):
                continue  # a lost GPU among answering ones: NvidiaGpus reports it
            return None
        fields = [f.strip() for f in text.split(",")]
        if len(fields) != len(WEAR_FIELDS):
            raise FactParseError("GpuWear", n, f"{len(WEAR_FIELDS)} comma-separated --query-gpu fields", line)
        gpus.append({key: _wear_value(n, line, key, field) for key, field in zip(_WEAR_KEYS, fields)})
    rows = {}
    for n, line in remap:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5 or not re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", fields[0]):
            continue  # "This query is not supported on this GPU", or no such query on an old driver
        try:
            rows[fields[0]] = {"correctable": int(fields[1]), "uncorrectable": int(fields[2]),
                               "pending": _ENABLED[fields[3]], "failure": _ENABLED[fields[4]]}
        except (KeyError, ValueError):
            raise FactParseError("GpuWear", n, "bus id, two counts, Yes/No, Yes/No", line) from None
    return {"gpus": gpus, "remapped_rows": rows}
