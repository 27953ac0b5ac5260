"""The CUDA repository's driver (cuda-drivers from NVIDIA's repository, issue 24): the plan says the
driver source changes and lists everything apt removes; its neighbours."""

from __future__ import annotations

from qwen27b.plan.gate import decide
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts


def run(host: str, **facts):
    return decide(host, recorded_facts(host, **facts), load_stack(), Settings())


def test_recorded_cuda_drivers_host_lists_every_removal_and_the_source_change():
    d = run("v100x2-cuda-drivers")
    assert d.driver.action == "replace"
    assert {"cuda-drivers", "cuda-drivers-570", "nvidia-driver-570", "libnvidia-compute-570",
            "xserver-xorg-video-nvidia-570", "cuda", "cuda-12-8", "cuda-runtime-12-8"} <= set(d.driver.remove)
    assert not any(p.startswith("cuda-toolkit") or "580" in p for p in d.driver.remove)
    assert "the driver source changes: NVIDIA's CUDA repository (cuda-drivers 570.195.03-1" in d.driver.reason
    assert "cuda-toolkit-12-8 stays" in d.driver.reason and "[cuda-repo-driver]" in d.driver.reason


def test_neighbours():
    packages = recorded_facts("v100x2-cuda-drivers").packages
    # the same R570 from Ubuntu's archive (no cuda-drivers): the old list, no source change said
    ubuntu = {p: v for p, v in packages.items() if not p.startswith("cuda-drivers")}
    d = run("v100x2-cuda-drivers", packages=ubuntu)
    assert "source changes" not in d.driver.reason and "cuda-12-8" not in d.driver.remove
    assert "nvidia-driver-570" in d.driver.remove and "libnvidia-compute-570" not in d.driver.remove
    # cuda-drivers of the stack's branch, loaded and answering: kept, nothing removed
    keep = run("v100x2-pcie", packages={**recorded_facts("v100x2-pcie").packages, "cuda-drivers-580": "580.95.05-1"})
    assert keep.driver.action == "keep" and keep.driver.remove == ()
