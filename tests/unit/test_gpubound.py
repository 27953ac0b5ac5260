"""plan/gpubound.py (issue 52 item 2): the one builder of bounded GPU commands, the controller's
bound and the verdict of a wedged GPU (its refusal names the hang, the Xid lines and the fix)."""

from __future__ import annotations

import re

import pytest

from qwen27b.controller import facts as F
from qwen27b.controller.factcache import fact_timeout
from qwen27b.plan import gpubound
from qwen27b.plan.gatetypes import HostFacts
from qwen27b.plan.gpubound import HUNG, MARKER, Bound, bounded, controller_timeout, hang_cause, nvidia_smi
from qwen27b.plan.gpustate import gpu_troubles
from qwen27b.plan.stack import load_stack

B = Bound(20, 5, 15)


def test_the_bound_comes_from_the_stack_with_its_sources():
    stack = load_stack()
    entry = stack["gpu_command_bound"]
    assert set(entry["source"]) <= set(stack["sources"])
    assert gpubound.stack_bound() == Bound(entry["seconds"], entry["kill_after_s"], entry["margin_s"])
    with pytest.raises(ValueError, match="gpu_command_bound"):
        Bound.of({"gpu_command_bound": {"seconds": 0, "kill_after_s": 5, "margin_s": 1}})


def test_builder_wraps_with_timeout_and_marks_a_timeout():
    assert bounded("dmesg", B) == "timeout -k 5 20 dmesg"
    command = nvidia_smi("topo -m", B)
    assert command.startswith("timeout -k 5 20 nvidia-smi topo -m 2>&1; q=$?; ")
    assert '[ "$q" = 124 ] || [ "$q" = 137 ]' in command and "exit 0" in command
    assert "nvidia-smi topo" in command and MARKER in command


def test_every_nvidia_smi_of_every_fact_is_bounded():
    """A new fact running nvidia-smi without the builder fails here (it would hang a wedged host)."""
    for cls in F.ALL_FACTS:
        fact = cls()
        command = fact.command("/var/lib/qwen27b/models") if getattr(cls, "path_arg", None) else fact.command()
        runs = [m.start() for m in re.finditer(r"(?<![-\w'])nvidia-smi (?=-|topo)", command)]
        for at in runs:
            assert command[:at].endswith(f"timeout -k {F.BOUND.kill_after_s} {F.BOUND.seconds} "), (cls, command[at - 30:at + 30])
        assert bool(runs) <= bool(cls.bounded_commands), cls


def test_controller_waits_for_each_bounded_command_plus_a_margin():
    assert controller_timeout(2, B) == 2 * 25 + 15
    assert fact_timeout(F.NvidiaGpus) == controller_timeout(1, F.BOUND)
    assert fact_timeout(F.GpuTopology) == controller_timeout(2, F.BOUND)
    assert fact_timeout(F.OsRelease) is None  # unbounded facts keep pyinfra's (no) timeout


def test_a_timed_out_fact_answers_the_hang():
    line = f"{MARKER} nvidia-smi --query-gpu did not return within 20 s (timeout exit 124)"
    assert F.NvidiaGpus().process([line]) == [{"problem": HUNG, "bus_id": None,
                                               "message": "nvidia-smi --query-gpu did not return within 20 s (timeout exit 124)"}]
    assert F.GpuTopology().process([line]) is None
    assert F.GpuWear().process([line]) is None


def _facts(**kw) -> HostFacts:
    base = dict(os={"id": "ubuntu", "version_id": "22.04"}, kernel="5.15.0-130-generic", gpus=[], pci_gpus=[],
                kernel_module={"version": "580.95.05", "flavor": "proprietary"}, nouveau_loaded=False,
                secure_boot="disabled", disk={}, memory={}, pythons={})
    return HostFacts(**(base | kw))


def test_verdict_names_the_hang_the_xids_and_the_fix():
    hung = {"problem": HUNG, "bus_id": None, "message": "nvidia-smi --query-gpu did not return within 20 s (timeout exit 137)"}
    xids = [{"time": "2026-12-06T22:41:17+0000", "pci": "0000:86:00", "xid": 62, "text": "..."}]
    troubles = gpu_troubles(_facts(gpus=[hung], xids=xids))
    assert [t.kind for t in troubles] == [HUNG] and troubles[0].blocks
    assert "did not return within 20 s" in troubles[0].cause and "Xid 62 on 0000:86:00" in troubles[0].cause
    assert "nvidia-smi -r" in troubles[0].fix and "reboot" in troubles[0].fix
    assert "no Xid line" in gpu_troubles(_facts(gpus=[hung]))[0].cause
    assert hang_cause([], xids) is None
    assert all(t.kind != HUNG for t in gpu_troubles(_facts()))


def test_a_read_the_controller_stopped_names_the_fact_its_wait_and_the_xid_read():
    cause = gpubound.unanswered("NvidiaGpus", 40)
    assert "NvidiaGpus fact did not answer within 40 s" in cause and "journalctl -k | grep Xid" in cause
