"""Issue 49 item 6: DFlash2 beside a target whose lm_head is quantized (the RadixArk checkpoint) is
allowed on the 1Cat builds that carry PR 451's switch, with its environment variable in the unit's
env (stack: vllm_builds.1cat.quant_lm_head_dflash2), and refused with the reason on older builds.
tests/unit/test_engine.py holds the method choice itself, tests/unit/test_gate.py the named method refused by
host; these hold the whole plan of the recorded 4x V100 host on each side of the version line, and
the line itself."""

from __future__ import annotations

import json

import pytest

from qwen27b.plan import engine
from qwen27b.plan.stack import load_stack, resolve_stack
from tests.support.gate_run import run

RADIX = {"qwen27b_model": "qwen3.8-27b-nvfp4-radixark"}
SWITCH = "VLLM_SM70_DFLASH2_QUANT_LM_HEAD"


def on(version: str, **data) -> dict:
    return {**RADIX, "qwen27b_stack_overrides": {"vllm": {"version": version}}, **data}


def test_a_build_with_the_switch_serves_dflash2_with_its_env_and_says_why():
    d = run("v100x4-2204-fresh", on("1.5.1"))
    assert d.serve.spec.method == "dflash2" and json.loads(d.serve.value("--speculative-config"))["method"] == "dflash"
    assert d.serve.env[SWITCH] == "1"
    assert f"{SWITCH}=1: DFlash2 beside the target's quantized lm_head [1cat-pr451]" in d.serve.notes
    assert not any("acceptance will be ~0" in note for note in d.serve.notes)


def test_an_older_build_plans_mtp_and_the_plan_says_why_not_dflash2():
    """auto on 1.5.0: DFlash2 skipped with the reason and the version that would allow it; no switch."""
    d = run("v100x4-2204-fresh", on("1.5.0"))
    assert d.serve.spec.method == "mtp" and SWITCH not in d.serve.env
    reason = next(f.reason for f in d.serve.flags if f.name == "--speculative-config")
    assert reason.startswith("auto: mtp, ") and "; not dflash2: RadixArk/Qwen3.8-27B-NVFP4 quantizes its lm_head" in reason
    assert f"vLLM build '1cat' >=1.5.1 opts in with {SWITCH} [1cat-pr451], this profile has 1.5.0" in reason


def test_the_dense_head_checkpoint_needs_no_switch_on_either_build():
    """QUASAR's lm_head is fp16: DFlash2 on 1.5.0 too, and the switch is never set for it."""
    for version in ("1.5.0", "1.5.1"):
        d = run("v100x4-2204-fresh", {"qwen27b_stack_overrides": {"vllm": {"version": version}}})
        assert d.serve.spec.method == "dflash2" and SWITCH not in d.serve.env


@pytest.mark.parametrize("version, carries", [("1.5.0", False), ("1.5.1rc1", False), ("1.5.1", True),
                                              ("1.5.2", True), ("1.6.0", True)])
def test_the_version_line_is_the_stacks(version, carries):
    """>=1.5.1 (the release that carries PR 451): a release candidate of 1.5.1 is before it."""
    rs = resolve_stack(load_stack(), "sm70", {"vllm": {"version": version}}, model="qwen3.8-27b-nvfp4-radixark")
    assert (engine.quant_lm_head_switch(rs) is not None) is carries


def test_a_build_without_the_switch_at_all_refuses_without_naming_a_version():
    """A build entry with no quant_lm_head_dflash2 (as the upstream and CPU builds have none): the reason
    is the quantized head alone, no opt-in to point at."""
    stack = load_stack()
    del stack["vllm_builds"]["1cat"]["quant_lm_head_dflash2"]
    rs = resolve_stack(stack, "sm70", None, model="qwen3.8-27b-nvfp4-radixark")
    from qwen27b.plan.checkpoint import load_shape
    from qwen27b.plan.stack import checkpoint_metadata_dir
    why = engine.cannot_run("dflash2", rs, load_shape(checkpoint_metadata_dir(rs.model)))
    assert why.startswith("RadixArk/Qwen3.8-27B-NVFP4 quantizes its lm_head, which the DFlash2 draft shares: ")
    assert "opts in" not in why and SWITCH not in why
