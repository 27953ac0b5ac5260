"""doctor on issue 24's recorded host states: it reads the same facts as the deploy and runs the
same gate, so it names the same cause and fix (and never tracebacks)."""

from __future__ import annotations


import pytest

from qwen27b.tools.doctor import FAIL, HostSnapshot, context, diagnose
from qwen27b.plan.stack import load_stack
from tests.support.paths import TESTS

HOSTS = TESTS / "fixtures" / "hosts"
STACK = load_stack()


def snapshot(name: str) -> HostSnapshot:
    files = {p.name: p.read_text(encoding="utf-8") for p in (HOSTS / name).iterdir()
             if p.is_file() and p.name not in ("README.md", "extra.yaml")}
    return HostSnapshot(name, outputs=files)


@pytest.mark.parametrize("name, cause", [
    ("v100x4-dkms-failed", "the R580 driver build failed"),
    ("v100x2-old-vllm", "port 8000 is already served by docker-proxy"),
    ("v100x4-wedged", "nvidia-smi --query-gpu did not return within 20 s"),  # issue 52 item 2
])
def test_doctor_names_the_gates_cause(name, cause):
    ctx = context.Ctx(snapshot(name), STACK)
    assert ctx.refusal is not None and cause in str(ctx.refusal)
    rep = diagnose(snapshot(name), STACK)
    assert any(c.verdict == FAIL and cause in c.evidence for c in rep.checks), [c.evidence for c in rep.checks]


def test_doctor_reads_the_new_kernel_and_the_driver_first_host():
    assert "the reboot boots 5.15.0-130-generic" in context.Ctx(snapshot("v100x4-newer-kernel"), STACK).decision.driver.reason
    assert context.Ctx(snapshot("v100x1-pg500"), STACK).decision.driver_first


def test_doctor_judges_a_host_against_its_engine_profile_entry():
    """qwen27b_engine_profile reaches doctor's stack (its parameter checks compare the host with the
    entry the deploy planned, issue 49), and the gate's plan inside doctor names it."""
    snap = snapshot("v100x4-2204-fresh")
    snap.data = {"qwen27b_engine_profile": "radixark-mtp"}
    ctx = context.Ctx(snap, STACK)
    assert ctx.rs.profile["vllm"]["version"] == "1.5.0" and ctx.rs.model["id"] == "RadixArk/Qwen3.8-27B-NVFP4"
    assert ctx.decision.entry.name == "radixark-mtp"
    assert context.Ctx(snapshot("v100x4-2204-fresh"), STACK).rs.profile["vllm"]["version"] == "1.5.1"
