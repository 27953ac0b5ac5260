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
