"""plan/gpustate.py: the one reading of GPU trouble the gate refuses on and doctor reports (issue 24)."""

from __future__ import annotations

from qwen27b.plan.gate import HostFacts
from qwen27b.plan.gpufacts_parse import gpu_problem_line, parse_nvidia_gpus
from qwen27b.plan.gpustate import LOST, MISMATCH, MISSING, NVML, gpu_troubles

UBUNTU = {"id": "ubuntu", "version_id": "22.04"}
MODULE = {"loaded": True, "flavor": "proprietary", "version": "580.95.05"}
PCI = [{"slot": f"0000:{b}:00.0", "class": "0302", "device_id": "1db5", "description": "V100"} for b in ("18", "3b")]
GPU = {"index": 0, "name": "Tesla V100-SXM2-32GB", "bus_id": "00000000:18:00.0"}


def facts(lines: list[str], xids=(), pci=PCI) -> HostFacts:
    return HostFacts(os=UBUNTU, gpus=parse_nvidia_gpus(lines), pci_gpus=list(pci), kernel_module=MODULE,
                     xids=list(xids))


def test_a_mismatch_is_a_reboot_and_hides_the_missing_gpus():
    found = gpu_troubles(facts(["Failed to initialize NVML: Driver/library version mismatch",
                                "NVML library version: 570.124"]))
    assert [t.kind for t in found] == [MISMATCH] and found[0].blocks
    assert "580.95.05 still loaded" in found[0].cause and found[0].fix.startswith("reboot")
    assert "Xid" not in found[0].fix
    # the two-line form names the user space installed, in the cause and in the fix (issue 52 item 3)
    assert "(NVML library 570.124 installed, kernel module 580.95.05 still loaded)" in found[0].cause
    assert found[0].fix.startswith("reboot to load the new driver (570.124)")
    # doctor adds the table's line (no version): the query's reading, with the version, stays
    table = gpu_problem_line("Failed to initialize NVML: Driver/library version mismatch")
    assert "570.124 installed" in gpu_troubles(facts(["Failed to initialize NVML: Driver/library version mismatch",
                                                      "NVML library version: 570.124"]), [table])[0].cause
    one_line = gpu_troubles(facts(["Failed to initialize NVML: Driver/library version mismatch"]))[0]
    assert "(kernel module 580.95.05 still loaded)" in one_line.cause
    assert one_line.fix.startswith("reboot to load the new driver, then")


def test_nvml_failing_otherwise():
    found = gpu_troubles(facts(["Failed to initialize NVML: Unknown Error"]))
    assert [t.kind for t in found] == [NVML] and "dmesg" in found[0].fix


def test_a_lost_gpu_gets_the_xid_79_advice_only_with_an_xid_79():
    line = "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    row = ("0, Tesla V100-SXM2-32GB, GPU-4d7c5599, 00000000:18:00.0, 32768, 7.0, 580.95.05, 3, 3, 16, 16, "
           "Enabled, Enabled")
    plain = gpu_troubles(facts([row, line]))
    assert [t.kind for t in plain] == [LOST] and "Above 4G" not in plain[0].fix and plain[0].blocks
    xid = {"xid": 79, "pci": "0000:3b:00", "time": None, "text": "GPU has fallen off the bus."}
    with79 = gpu_troubles(facts([row, line], xids=[xid]))
    assert "Above 4G" in with79[0].fix and "fallen off the bus" in with79[0].cause


def test_a_gpu_missing_from_nvidia_smi_does_not_block_and_the_table_counts_once():
    row = ("0, Tesla V100-SXM2-32GB, GPU-4d7c5599, 00000000:18:00.0, 32768, 7.0, 580.95.05, 3, 3, 16, 16, "
           "Enabled, Enabled")
    missing = gpu_troubles(facts([row]))
    assert [(t.kind, t.blocks) for t in missing] == [(MISSING, False)] and "lspci lists 2" in missing[0].cause
    line = "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    twice = gpu_troubles(facts([row, line]), [gpu_problem_line(line)])  # the query and the table both print it
    assert "cannot reach 1 GPU(s)" in twice[0].cause
    assert gpu_troubles(facts([row], pci=PCI[:1])) == []
