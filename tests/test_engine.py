"""Engine choices (qwen27b/plan/engine.py): KV dtype, speculative method and depth, agent parsers."""

import dataclasses

from qwen27b.plan import engine
from qwen27b.plan.checkpoint import load_shape, shape_from_config
from qwen27b.plan.stack import checkpoint_metadata_dir, load_stack, resolve_stack

STACK = load_stack()


def resolved(profile="sm70", overrides=None):
    rs = resolve_stack(STACK, profile, overrides)
    return rs, load_shape(checkpoint_metadata_dir(rs.model))


def test_sm70_sets_fp16_kv_explicitly_with_the_measured_reason():
    rs, target = resolved()
    value, why = engine.kv_cache_dtype(rs, target, on_gpu=True)
    assert value == "float16" and "never 'auto'" in why and "[v100-skinny-kv, 1cat-kv-auto]" in why
    assert "+4.8 ms" in rs.source_text("v100-skinny-kv")


def test_sm70_overrides_a_checkpoint_that_asks_for_fp8_kv_and_says_so():
    rs, target = resolved()
    fp8 = dataclasses.replace(target, kv_cache_quant="FP8")
    value, why = engine.kv_cache_dtype(rs, fp8, on_gpu=True)
    assert value == "float16" and "asks for FP8 KV, overridden" in why


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


def test_sm70_auto_picks_native_mtp_k7_and_says_why_not_dflash2():
    rs, target = resolved()
    assert target.mtp_layers == 1 and target.lm_head_quantized
    choice = engine.choose_speculative(rs, target, "auto", tp=4, max_model_len=8192)
    assert (choice.method, choice.depth) == ("mtp", 7)
    assert "[1cat-mtp-config, v100-skinny-mtp]" in choice.reason
    assert engine.speculative_config(rs, choice, None) == {"method": "mtp", "num_speculative_tokens": 7}


def test_mtp_drops_to_k3_from_the_stack_long_context_threshold():
    rs, target = resolved()
    threshold = STACK["speculative"]["mtp"]["long_context"]["from_max_model_len"]
    assert engine.choose_speculative(rs, target, "auto", 4, threshold - 1).depth == 7
    long = engine.choose_speculative(rs, target, "auto", 4, threshold)
    assert long.depth == 3 and f">= {threshold}" in long.reason and "v100-skinny-mtp" in long.reason


def test_auto_skips_dflash2_where_1cat_478_says_it_accepts_nothing():
    """The ModelOpt checkpoint (dense lm_head, no MTP layer): DFlash2 at TP 2, not at TP 4 on 1Cat <= 1.5.0."""
    rs, target = resolved(overrides=None)
    rs = resolve_stack(STACK, "sm70", None, model="qwen3.8-27b-nvfp4")
    target = load_shape(checkpoint_metadata_dir(rs.model))
    assert engine.choose_speculative(rs, target, "auto", 2, 8192).method == "dflash2"
    off = engine.choose_speculative(rs, target, "auto", 4, 8192)
    assert off.method == "off" and "no MTP layers" in off.reason and "[1cat-478]" in off.reason
    assert [m for m, _ in off.skipped] == ["mtp", "dflash2"]
    newer = resolve_stack(STACK, "sm70", {"vllm": {"version": "1.6.0"}}, model="qwen3.8-27b-nvfp4")
    assert engine.choose_speculative(newer, target, "auto", 4, 8192).method == "dflash2"  # evidence is per version


def test_a_named_method_is_obeyed_with_the_evidence_printed_or_refused_when_it_cannot_run():
    rs = resolve_stack(STACK, "sm70", None, model="qwen3.8-27b-nvfp4")
    target = load_shape(checkpoint_metadata_dir(rs.model))
    forced = engine.choose_speculative(rs, target, "dflash2", 4, 8192)
    assert forced.method == "dflash2" and "WARNING, asked for despite: acceptance 0 at TP4" in forced.reason
    try:
        engine.choose_speculative(rs, target, "mtp", 4, 8192)
    except engine.SpecRefused as refused:
        assert "has no MTP layers" in refused.cause and "qwen27b_speculative to auto" in refused.fix
    else:
        raise AssertionError("mtp without MTP layers must be refused")
    radix, radix_target = resolved()
    try:
        engine.choose_speculative(radix, radix_target, "dflash2", 4, 8192)
    except engine.SpecRefused as refused:
        assert "quantizes its lm_head" in refused.cause
    else:
        raise AssertionError("dflash2 with a quantized lm_head must be refused")
    assert engine.choose_speculative(radix, radix_target, "off", 4, 8192) == engine.OFF


def test_the_cpu_profile_has_nothing_to_speculate_with_and_says_so():
    rs, target = resolved("cpu-smoke")
    choice = engine.choose_speculative(rs, target, "auto", 1, 2048)
    assert choice.method == "off" and "no MTP layers" in choice.reason and "no DFlash2 draft" in choice.reason
