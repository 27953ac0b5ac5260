"""A card whose PCI id does not say its memory (Tesla PG500-216), no driver yet (issue 24): too small
at the smallest V100 size, so the driver first and the serving planned after its reboot."""

from __future__ import annotations

import pytest

from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts


def run(host: str, **facts):
    return decide(host, recorded_facts(host, **facts), load_stack(), Settings())


def test_one_pg500_without_driver_installs_the_driver_first():
    d = run("v100x1-pg500")
    assert d.driver_first and d.driver.action == "install"
    assert d.warnings[0].startswith("the memory of GV100GL [Tesla PG500-216] is unknown until the driver answers")
    assert "re-run the deploy after the reboot" in d.warnings[0] and "32510 MiB" in d.warnings[0]


def test_neighbours():
    # four of them fit even at 16 GB: planned at once, as before
    assert not run("v100x4-pg500").driver_first
    # the driver answers with the real size: planned on it, no driver-first
    answered = [{"index": 0, "name": "Tesla PG500-216", "memory_mib": 32768, "compute_capability": "7.0",
                 "bus_id": "00000000:18:00.0", "uuid": "GPU-0", "driver_version": "580.95.05"}]
    d = run("v100x1-pg500", gpus=answered, kernel_module={"loaded": True, "flavor": "proprietary", "version": "580.95.05"},
            packages={"nvidia-driver-580-server": "580.95.05-0ubuntu0.22.04.1"})
    assert not d.driver_first and d.gpus[0].memory_mib == 32768
    # a card whose name says 16 GB is refused for memory, as before: its size is known
    with pytest.raises(RefusedHost, match="too little memory"):
        run("v100x1-pg500", pci_gpus=[{**recorded_facts("v100x1-pg500").pci_gpus[0], "device_id": "1db4",
                                       "description": "GV100GL [Tesla V100 PCIe 16GB]"}])
