"""The GPU readings of one health check: NVML per GPU (pynvml, imported lazily: CPU-only hosts have
no NVML) and new ``NVRM: Xid`` kernel lines from the journal or dmesg. Parsers take plain text so
they are unit-tested on recorded output."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess

from .statusfile import iso

# NVML clocks-event ("throttle") reason bits; stable across NVML versions (nvml.h).
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


# Reasons that mean cooling or power delivery is failing; idle / power cap / sync boost are normal.
THROTTLE_BAD = {"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}


XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+),\s*(?P<rest>.*)$")


XID_PID_RE = re.compile(r"pid=(?P<pid>'?[^,]*'?),\s*name=(?P<name>[^,]*),\s*(?P<msg>.*)$")


TS_RE = re.compile(r"^(?:\[)?(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def decode_throttle(mask: int) -> list[str]:
    """NVML clocks-event bitmask -> reason names (unknown bits kept as hex, never dropped)."""
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_BITS)
    if unknown:
        names.append(hex(unknown))
    return names


def _parse_ts(text: str) -> float | None:
    m = TS_RE.match(text)
    if not m:
        return None
    ts = m.group("ts").replace(",", ".")
    try:
        when = dt.datetime.fromisoformat(ts)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.astimezone()  # journal/dmesg without offset: local time
    return when.timestamp()


def parse_xids(text: str, since: float | None = None) -> list[dict]:
    """``NVRM: Xid`` kernel lines -> [{time, pci, xid, pid, name, message}].

    Accepts journalctl ``short-iso`` and ``dmesg --time-format=iso`` lines (and bare kernel lines).
    With ``since`` (epoch s), only lines stamped after it are kept: dmesg cannot filter by time
    itself and would repeat every Xid since boot on each run.  Lines that do not parse are
    skipped, never raised on: a strange kernel line must not break the check.
    """
    out = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if not m:
            continue
        when = _parse_ts(line)
        # strictly before: a line stamped in the same second as the last check is reported
        # twice rather than never (journal stamps have 1 s resolution)
        if since is not None and (when is None or when < int(since)):
            continue
        rest = m.group("rest").strip()
        pm = XID_PID_RE.match(rest)
        out.append({
            "time": iso(when) if when is not None else None,
            "pci": m.group("pci"),
            "xid": int(m.group("xid")),
            "pid": pm.group("pid").strip("'") if pm else None,
            "name": pm.group("name").strip() if pm else None,
            "message": (pm.group("msg") if pm else rest).strip(),
        })
    return out


def read_gpus(nvml=None, only=None, others: list | None = None) -> tuple[list[dict] | None, str | None]:
    """Per-GPU NVML readings -> (gpus, why_none).  No pynvml or no driver: (None, reason) - a
    CPU-only host is not an error.  Fields NVML reports "Not Supported" are None; a GPU that
    fails otherwise (e.g. "GPU is lost") gets an ``error`` and a CRITICAL finding.  ``only``: the
    NVML indices to read (a copy's own GPUs; another copy's lost GPU is that copy's finding); the PCI
    addresses of the others go to ``others`` (their Xid lines are theirs: :func:`own_xids`)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "pynvml not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return None, str(e)

    def opt(fn, *args):
        try:
            return fn(*args)
        except nvml.NVMLError_NotSupported:
            return None

    throttle_fn = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    gpus = []
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            if only is not None and i not in only:
                if others is not None:
                    try:
                        pci = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId
                        others.append(pci.decode() if isinstance(pci, bytes) else pci)
                    except nvml.NVMLError:
                        pass
                continue
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(h)
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                pci = opt(nvml.nvmlDeviceGetPciInfo, h)
                mask = opt(throttle_fn, h)
                pending = opt(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
                retired = opt(_retired_pages, nvml, h)
                gpus.append({
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "pci": (pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId) if pci else None,
                    "memory_used_mib": mem.used // 2**20,
                    "memory_total_mib": mem.total // 2**20,
                    "temperature_c": opt(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                    "ecc_uncorrected": opt(nvml.nvmlDeviceGetTotalEccErrors, h,
                                           nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
                    "retired_pages_pending": None if pending is None else bool(pending),
                    "retired_pages": retired,
                    "throttle": None if mask is None else {"mask": hex(mask), "reasons": decode_throttle(mask)},
                })
            except nvml.NVMLError as e:
                gpus.append({"index": i, "error": str(e)})
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return gpus, None


def pci_key(address: str | None) -> tuple | None:
    """A PCI address as (domain, bus, device): NVML writes 00000000:3B:00.0, the kernel's Xid line
    0000:3b:00. None when it does not parse."""
    parts = re.findall(r"[0-9A-Fa-f]+", address or "")
    return tuple(int(p, 16) for p in parts[:3]) if len(parts) >= 3 else None


def own_xids(xids: list[dict] | None, others: list[str]) -> list[dict] | None:
    """The Xid lines not on another copy's GPU (``others``: their PCI addresses). A line whose address
    names no other copy's GPU stays: a lost GPU of this copy may have no address NVML still reads."""
    theirs = {pci_key(a) for a in others} - {None}
    return None if xids is None else [x for x in xids if pci_key(x.get("pci")) not in theirs]


def _retired_pages(nvml, h) -> int:
    """Pages retired for ECC (single-bit storms and double-bit errors); Volta retires pages,
    Ampere+ remaps rows instead and answers Not Supported (None)."""
    return sum(len(nvml.nvmlDeviceGetRetiredPages(h, cause)) for cause in (
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))


def read_kernel_log(since: float) -> tuple[str | None, str | None]:
    """Kernel lines since ``since`` -> (text, source).  journalctl filters by time itself;
    dmesg (hosts without a persistent journal) returns the whole ring buffer, filtered later.
    Neither present or both failing: (None, None), i.e. "unknown", not a finding."""
    if shutil.which("journalctl"):
        cmd = ["journalctl", "_TRANSPORT=kernel", "-o", "short-iso", "--no-pager", "-q",
               f"--since=@{int(since)}"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, errors="replace")
            if p.returncode == 0:
                return p.stdout, "journalctl"
        except (OSError, subprocess.SubprocessError):
            pass
    if shutil.which("dmesg"):
        try:
            p = subprocess.run(["dmesg", "--time-format=iso"], capture_output=True, text=True,
                               timeout=20, errors="replace")
            if p.returncode == 0:
                return p.stdout, "dmesg"
        except (OSError, subprocess.SubprocessError):
            pass
    return None, None


def read_xids(since: float) -> tuple[list[dict] | None, str | None]:
    text, source = read_kernel_log(since)
    if text is None:
        return None, None
    try:
        return parse_xids(text, since=since), source
    except Exception:  # noqa: BLE001 - a parse bug must not take the check down
        return None, source
