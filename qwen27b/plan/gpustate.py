"""One reading of a host's GPU trouble, shared by the deploy's gate and doctor (issue 24).

Before, doctor read "Failed to initialize NVML: Driver/library version mismatch" as a lost GPU and
gave Xid-79 hardware advice while the gate knew it means "reboot". Now both ask `gpu_troubles`, a
pure function of the GPU facts (nvidia-smi's failure lines as gpufacts_parse's "problem" entries,
the kernel module, the Xids, the GPUs nvidia-smi and lspci list), and print its cause and fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen27b.plan.gpubound import HUNG, RESET_FIX, hang_cause

SEED_XID79_ADVICE = (
    "Xid 79 means a GPU fell off the PCIe bus. The seed's advice for V100s in workstation boards "
    "(e.g. X99): enable Above 4G Decoding and set the PCIe link speed in the BIOS, check the slot "
    "seating and that the board/PSU delivers enough PCIe power, and keep the driver matched to the kernel"
)
BOARD_FIX = ("check the board: reseat the card and its power cables, try another slot, update the BIOS; "
             "if it persists, RMA the card")

# kinds, most telling first: a driver that cannot answer explains every GPU missing after it
MISMATCH, NVML, LOST, MISSING = "driver-library-mismatch", "nvml-init", "gpu-lost", "gpu-missing"


@dataclass(frozen=True)
class GpuTrouble:
    """What is wrong with the GPUs, why, and the fix. `blocks`: the GPU facts cannot be planned on
    (the gate refuses); a GPU missing from nvidia-smi while others answer does not block."""

    kind: str
    cause: str
    fix: str
    blocks: bool = True


def _xid79(facts) -> bool:
    return any(x.get("xid") == 79 for x in facts.xids or [])


def gpu_troubles(facts, extra_problems: list[dict] = ()) -> list[GpuTrouble]:
    """Every GPU trouble the facts show, most telling first. `facts` is gate.HostFacts (or anything
    with its gpu_problems, gpus, pci_gpus, kernel_module, xids); `extra_problems`: more "problem"
    entries, e.g. doctor's from nvidia-smi's table (gpufacts_parse.gpu_problem_line)."""
    # the same line read twice (the query and the table) is one problem
    # (the query's entry keeps the library version its second line gave, which the table's lacks)
    merged: dict = {}
    for p in list(facts.gpu_problems or []) + list(extra_problems):
        key = (p.get("problem"), p.get("message"))
        if key not in merged or len(p) > len(merged[key]):
            merged[key] = p
    problems = list(merged.values())
    kinds = {p.get("problem") for p in problems}
    loaded = (facts.kernel_module or {}).get("version")
    out: list[GpuTrouble] = []
    hung = hang_cause(problems, facts.xids)
    if hung is not None:  # nvidia-smi never returned (issue 52 item 2): nothing else of the GPUs was read
        return [GpuTrouble(HUNG, hung, RESET_FIX)]
    if MISMATCH in kinds:
        found = next(p for p in problems if p.get("problem") == MISMATCH)
        library = found.get("library_version")  # R535+'s second line: the user space now installed
        versions = ", ".join(part for part in (f"NVML library {library} installed" if library else "",
                                               f"kernel module {loaded} still loaded" if loaded else "") if part)
        out.append(GpuTrouble(MISMATCH, f"nvidia-smi: {found['message']}: the NVIDIA driver was upgraded without a reboot"
                              + (f" ({versions})" if versions else "") + ", so no GPU can be used",
                              "reboot to load the new driver" + (f" ({library})" if library else "")
                              + ", then re-run the deploy (a deploy with "
                              "qwen27b_skip_reboot leaves the host like this until it is rebooted)"))
        return out  # the GPUs are fine: nothing else can be read until the reboot
    if "nvml-init" in kinds:
        message = next(p["message"] for p in problems if p.get("problem") == NVML)
        out.append(GpuTrouble(NVML, f"nvidia-smi: {message}",
                              "check `dmesg | grep -i nvrm` and that the loaded nvidia module matches the installed "
                              "driver; reinstall the driver or reboot, then re-run the deploy"))
        return out
    xid79 = _xid79(facts)
    lost = [p for p in problems if p.get("problem") == "device-handle"]
    if lost:
        out.append(GpuTrouble(LOST, f"nvidia-smi cannot reach {len(lost)} GPU(s): "
                              + "; ".join(p["message"] for p in lost)
                              + (" (Xid 79 in the kernel log: fallen off the bus)" if xid79 else ""),
                              "a reboot may bring it back for a while; " + BOARD_FIX
                              + (f". {SEED_XID79_ADVICE}" if xid79 else "")))
    answering = [g for g in facts.gpus or [] if "problem" not in g]
    on_bus = len(facts.pci_gpus or [])
    if not lost and loaded and on_bus > len(answering):  # without a module loaded nvidia-smi sees none
        out.append(GpuTrouble(MISSING, f"lspci lists {on_bus} NVIDIA GPU(s), nvidia-smi only {len(answering)}: "
                              "a GPU is lost" + (" (Xid 79 in the kernel log: fallen off the bus)" if xid79 else ""),
                              "reboot; if it stays lost, " + BOARD_FIX + (f". {SEED_XID79_ADVICE}" if xid79 else ""),
                              blocks=False))
    return out
