"""Engine choices (qwen27b/plan/engine.py): KV dtype, speculative method and depth, agent parsers."""

import dataclasses

from qwen27b.plan import engine
from qwen27b.plan.checkpoint import load_shape, shape_from_config
from qwen27b.plan.stack import checkpoint_metadata_dir, load_stack, resolve_stack
from tests.support.metrics_text import _counters, _text

STACK = load_stack()


def resolved(profile="sm70", overrides=None):
    rs = resolve_stack(STACK, profile, overrides)
    return rs, load_shape(checkpoint_metadata_dir(rs.model))


def radixark():
    """What V100 owners run (a named alternative): one MTP layer, a quantized lm_head, an FP8-KV directive."""
    rs = resolve_stack(STACK, "sm70", None, model="qwen3.8-27b-nvfp4-radixark")
    return rs, load_shape(checkpoint_metadata_dir(rs.model))


def test_sm70_sets_the_vendors_fp8_e5m2_kv_explicitly_with_its_reason():
    """Issue 49: the engine vendor's release profile runs fp8_e5m2 KV, its DFlash2 path built on it."""
    rs, target = resolved()
    value, why = engine.kv_cache_dtype(rs, target, on_gpu=True)
    assert value == "fp8_e5m2" and "never 'auto'" in why and "[1cat-release-profile, 1cat-fp8-kv-dflash2]" in why
    assert "fp8_e5m2" in rs.source_text("1cat-release-profile") and "0.5-1.2%" in rs.source_text("1cat-fp8-kv-dflash2")


def test_sm70_sets_its_kv_over_a_checkpoint_that_asks_for_fp8_kv_and_says_so():
    rs, target = radixark()
    assert target.kv_cache_quant == "FP8"
    value, why = engine.kv_cache_dtype(rs, target, on_gpu=True)
    assert value == "fp8_e5m2" and "asks for FP8 KV, overridden" in why
    fp16 = resolve_stack(STACK, "sm70", {"serve": {"kv_cache_dtype": "float16"}}, model="qwen3.8-27b-nvfp4-radixark")
    value, why = engine.kv_cache_dtype(fp16, target, on_gpu=True)
    assert value == "float16" and "slower scalar paged-attention path" in why


def test_other_profiles_keep_auto_and_say_what_auto_follows():
    rs, target = resolved("sm75plus")
    assert engine.kv_cache_dtype(rs, target, on_gpu=True) == ("auto", "KV in the model dtype")
    value, why = engine.kv_cache_dtype(rs, dataclasses.replace(target, kv_cache_quant="FP8"), on_gpu=True)
    assert value == "auto" and "follows the checkpoint's FP8 KV directive" in why


def test_the_checkpoint_kv_directive_is_read_from_its_quantization_config():
    base = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 10}
    assert shape_from_config(base, 1).kv_cache_quant is None
    algo = shape_from_config({**base, "quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}, 1)
    scheme = shape_from_config({**base, "quantization_config": {"kv_cache_scheme": {"type": "float", "num_bits": 8}}}, 1)
    assert (algo.kv_cache_quant, scheme.kv_cache_quant) == ("FP8", "float8")


def test_sm70_auto_picks_the_vendors_dflash2_with_the_pinned_draft():
    """Issue 49: the vendor's route (QUASAR NVFP4 + DFlash2 at TP 4), its draft at the profile's revision."""
    rs, target = resolved()
    assert rs.model["id"] == "QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4" and not target.lm_head_quantized
    assert rs.draft["revision"] == "dedf8df68adfb1afeaf7b7480c0a0243108177b4"
    choice = engine.choose_speculative(rs, target, "auto", tp=4, max_model_len=262144)
    assert (choice.method, choice.depth) == ("dflash2", 7) and "[dflash2]" in choice.reason
    assert engine.speculative_config(rs, choice, "/d") == {
        "method": "dflash", "model": "/d", "num_speculative_tokens": 7, "draft_sample_method": "probabilistic",
        "kv_cache_dtype": "auto", "attention_backend": "FLASH_ATTN_V100"}


def test_mtp_k7_then_k3_from_the_stack_long_context_threshold():
    rs, target = radixark()
    threshold = STACK["speculative"]["mtp"]["long_context"]["from_max_model_len"]
    assert engine.choose_speculative(rs, target, "mtp", 4, threshold - 1).depth == 7
    long = engine.choose_speculative(rs, target, "mtp", 4, threshold)
    assert long.depth == 3 and f">= {threshold}" in long.reason and "v100-skinny-mtp" in long.reason
    assert engine.speculative_config(rs, long, None) == {"method": "mtp", "num_speculative_tokens": 3}


def test_dflash2_beside_a_quantized_lm_head_needs_the_builds_switch():
    """1Cat PR 451: 1.5.1 opts in with VLLM_SM70_DFLASH2_QUANT_LM_HEAD; 1.5.0 is refused with the reason."""
    rs, target = radixark()
    assert target.lm_head_quantized and engine.quant_lm_head_switch(rs)["env"] == "VLLM_SM70_DFLASH2_QUANT_LM_HEAD"
    assert engine.choose_speculative(rs, target, "auto", 4, 8192).method == "dflash2"
    old = resolve_stack(STACK, "sm70", {"vllm": {"version": "1.5.0"}}, model="qwen3.8-27b-nvfp4-radixark")
    assert engine.quant_lm_head_switch(old) is None
    auto = engine.choose_speculative(old, target, "auto", 4, 8192)
    assert auto.method == "mtp" and "quantizes its lm_head" in dict(auto.skipped)["dflash2"]
    assert ">=1.5.1 opts in with VLLM_SM70_DFLASH2_QUANT_LM_HEAD [1cat-pr451], this profile has 1.5.0" \
        in dict(auto.skipped)["dflash2"]
    try:
        engine.choose_speculative(old, target, "dflash2", 4, 8192)
    except engine.SpecRefused as refused:
        assert "quantizes its lm_head" in refused.cause
    else:
        raise AssertionError("dflash2 with a quantized lm_head on 1.5.0 must be refused")


def test_no_planning_rule_from_one_open_report_but_evidence_still_skips_and_is_printed():
    """1Cat#478 (acceptance 0 at TP 4) is gone from the stack (the measured fallback covers it); a
    no_accept entry still works the same way where the stack has one."""
    assert STACK["speculative"]["no_accept"] == []
    rs, target = resolved()
    rule = {"method": "dflash2", "build": "1cat", "versions": "<=1.5.1", "min_tp": 4, "why": "acceptance 0", "source": "1cat-478"}
    ruled = dataclasses.replace(rs, speculative={**rs.speculative, "no_accept": [rule]})
    assert engine.choose_speculative(ruled, target, "auto", 2, 8192).method == "dflash2"
    off = engine.choose_speculative(ruled, target, "auto", 4, 8192)
    assert off.method == "off" and "no MTP layers" in off.reason and "[1cat-478]" in off.reason
    forced = engine.choose_speculative(ruled, target, "dflash2", 4, 8192)
    assert forced.method == "dflash2" and "WARNING, asked for despite: acceptance 0" in forced.reason


def test_a_named_method_that_cannot_run_is_refused():
    rs, target = resolved()
    try:
        engine.choose_speculative(rs, target, "mtp", 4, 8192)
    except engine.SpecRefused as refused:
        assert "has no MTP layers" in refused.cause and "qwen27b_speculative to auto" in refused.fix
    else:
        raise AssertionError("mtp without MTP layers must be refused")
    assert engine.choose_speculative(rs, target, "off", 4, 8192) == engine.OFF


def test_the_cpu_profile_has_nothing_to_speculate_with_and_says_so():
    rs, target = resolved("cpu-smoke")
    choice = engine.choose_speculative(rs, target, "auto", 1, 2048)
    assert choice.method == "off" and "no MTP layers" in choice.reason and "no DFlash2 draft" in choice.reason


# --- agent parsers -------------------------------------------------------------------------------

def test_v100_profiles_turn_the_qwen3_parsers_on_with_the_names_the_build_registers():
    for profile, source in (("sm70", "[1cat-parsers]"), ("sm75plus", "[vllm-parsers]")):
        rs, _ = resolved(profile)
        agent = engine.agent_parsers(rs, None)
        assert (agent.reasoning, agent.tool_call) == ("qwen3", "qwen3_coder") and agent.on
        assert "on by default" in agent.reason and source in agent.reason
    assert "'qwen3_coder'" in STACK["sources"]["1cat-parsers"] and "'qwen3'" in STACK["sources"]["1cat-parsers"]


def test_agent_parsers_false_turns_them_off_and_true_is_refused_where_they_cannot_work():
    rs, _ = resolved()
    off = engine.agent_parsers(rs, False)
    assert not off.on and "qwen27b_agent_parsers is false" in off.reason
    assert "qwen27b_agent_parsers true" in engine.agent_parsers(rs, True).reason
    cpu = resolve_stack(STACK, "cpu-smoke")
    agent = engine.agent_parsers(cpu, None)
    assert not agent.on and "SmolLM2" in agent.reason and "[cpu-parsers-recorded]" in agent.reason
    try:
        engine.agent_parsers(cpu, True)
        raise AssertionError("not refused")
    except engine.AgentRefused as refused:
        assert "qwen27b_agent_parsers" in refused.fix


def test_a_build_the_stack_does_not_list_gets_no_parsers():
    rs, _ = resolved()
    other = dataclasses.replace(rs, profile={**rs.profile, "vllm": {**rs.profile["vllm"], "build": "elsewhere"}})
    agent = engine.agent_parsers(other, None)
    assert not agent.on and "'elsewhere' is not known to register the qwen3 parsers" in agent.reason


# --- the measured fallback, on real /metrics texts ---------------------------------------------------

def test_spec_counters_read_the_real_ngram_recording_and_nothing_from_a_server_without_speculation():
    after = _text("metrics-cpu-0.32.0-ngram-2-after-hot.txt")
    assert engine.spec_counters(after) == _counters(after)
    assert engine.spec_counters(_text("metrics-cpu-0.32.0.txt")) is None


def test_judge_keeps_a_method_above_the_floor_and_drops_one_below_it_from_real_counters():
    rs, _ = resolved()
    start, greedy, hot = (_text(f"metrics-cpu-0.32.0-ngram-{n}.txt") for n in ("0-start", "1-after-greedy", "2-after-hot"))
    floor = engine.floors(rs, "mtp")
    (d0, a0), (d1, a1) = _counters(start), _counters(greedy)
    rate = (a1 - a0) / (d1 - d0)
    verdict = engine.judge_acceptance(rs, "mtp", start, greedy)
    assert d1 - d0 >= floor["min_draft_tokens"]
    assert verdict.acceptance == rate and verdict.keep == (rate >= floor["min_acceptance"])
    assert f"{a1 - a0:.0f} of {d1 - d0:.0f} drafted" in verdict.reason
    # the sampled requests matched no n-gram: nothing drafted, no verdict
    assert _counters(hot)[0] - _counters(greedy)[0] < floor["min_draft_tokens"]
    assert engine.judge_acceptance(rs, "mtp", greedy, hot).keep is None
    # the same counters against a floor above what was measured: dropped
    (d0, a0), (d1, a1) = _counters(start), _counters(greedy)
    high = dataclasses.replace(rs, speculative={**rs.speculative, "mtp": {**rs.speculative["mtp"],
                                                                          "min_acceptance": (a1 - a0) / (d1 - d0) + 0.01}})
    assert engine.judge_acceptance(high, "mtp", start, greedy).keep is False


def test_no_verdict_without_enough_drafted_tokens_or_without_counters():
    rs, _ = resolved()
    start = _text("metrics-cpu-0.32.0-ngram-0-start.txt")
    assert engine.judge_acceptance(rs, "mtp", start, start).keep is None
    assert engine.judge_acceptance(rs, "mtp", "", _text("metrics-cpu-0.32.0.txt")).keep is None


def test_fallback_walks_the_profile_order_then_off():
    rs, quasar = resolved()
    target = dataclasses.replace(quasar, mtp_layers=1)  # a checkpoint with an MTP layer: both methods can run
    zero = _text("../journals/v100x4-spec-acceptance-zero/metrics.txt")
    dflash = engine.choose_speculative(rs, target, "auto", 4, 8192)
    assert dflash.method == "dflash2"  # the vendor's order: DFlash2 first
    nxt, verdict = engine.fallback(rs, target, dflash, [], 4, 8192, "", zero)
    assert verdict.keep is False and verdict.acceptance == 0.0
    assert nxt.method == "mtp" and "below the floor" in nxt.reason
    # MTP failing after DFlash2 was dropped: off
    nxt, _ = engine.fallback(rs, target, engine.choose_speculative(rs, target, "mtp", 4, 8192), ["dflash2"], 4, 8192, "", zero)
    assert nxt.method == "off"
    # the default checkpoint has no MTP layer: after DFlash2, off it is, saying why
    nxt, _ = engine.fallback(rs, quasar, engine.choose_speculative(rs, quasar, "auto", 4, 8192), [], 4, 8192, "", zero)
    assert nxt.method == "off" and "no MTP layers" in nxt.reason
    mtp = engine.choose_speculative(rs, target, "mtp", 2, 8192)
    healthy = _text("../journals/v100x4-healthy/metrics.txt")
    keep, verdict = engine.fallback(rs, target, mtp, [], 2, 8192, "", healthy)
    assert keep is None and verdict.keep is True
