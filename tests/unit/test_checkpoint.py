"""Model shapes read from config.json: the numbers FACTS.md gives for Qwen3.8-27B."""

import json

import pytest

from qwen27b.plan.checkpoint import CheckpointError, load_shape, shape_from_config
from qwen27b.plan.stack import CHECKPOINTS_DIR


def test_qwen38_27b_shape():
    shape = load_shape(CHECKPOINTS_DIR / "nvidia--Qwen3.8-27B-NVFP4")
    assert (shape.num_layers, shape.full_attention_layers, shape.linear_attention_layers) == (64, 16, 48)
    assert shape.kv_bytes_per_token(tp=1, kv_dtype_bytes=2) == 64 * 1024  # 16 x 4 x 256 x 2 x 2 B
    assert shape.kv_bytes_per_token(tp=4, kv_dtype_bytes=2) == 16 * 1024
    assert shape.kv_bytes_per_token(tp=8, kv_dtype_bytes=2) == 16 * 1024  # a kv head is never split below one
    ssm = 48 * 48 * 128 * 128 * 4
    assert ssm <= shape.recurrent_state_bytes(tp=1) < ssm * 1.05  # ~151 MB per sequence
    assert shape.multimodal and shape.hybrid and not shape.lm_head_quantized
    assert shape.quant_algo == "NVFP4" and round(shape.weight_bytes / 2**30, 1) == 20.4


def test_tiny_model_shape():
    shape = load_shape(CHECKPOINTS_DIR / "HuggingFaceTB--SmolLM2-135M-Instruct")
    assert shape.kv_bytes_per_token(1, 2) == 30 * 3 * 64 * 2 * 2
    assert not shape.hybrid and shape.recurrent_state_bytes(1) == 0 and not shape.multimodal


def test_quantized_lm_head_is_detected():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 10,
              "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": []}}
    assert shape_from_config(config, 1).lm_head_quantized


def test_broken_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(CheckpointError, match="model.safetensors.index.json nor"):
        load_shape(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"0" * 10)
    with pytest.raises(CheckpointError, match="lacks 'num_hidden_layers'"):
        load_shape(tmp_path)
