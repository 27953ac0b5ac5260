"""What the planner needs to know about a checkpoint, read from its config.json and index.

Sizes come from the checkpoint's own files (never hard-coded): weights from the safetensors
index (or the files themselves), KV bytes per token from the attention layers, recurrent state
from the Gated DeltaNet (linear attention) layers of hybrid models like Qwen3.5/3.8.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "auto": 2, "fp8": 1, "fp8_e5m2": 1, "fp8_e4m3": 1}


class CheckpointError(ValueError):
    """The checkpoint's config.json or index cannot be read or lacks a field the plan needs."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    full_attention_layers: int
    linear_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    weight_bytes: int
    multimodal: bool
    quant_method: str | None
    quant_algo: str | None
    lm_head_quantized: bool
    gdn_value_heads: int = 0
    gdn_key_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_dim: int = 0
    gdn_conv_kernel: int = 0
    # per layer, "full_attention" or "linear_attention", in order: which stage of a pipeline holds
    # which kind (qwen27b/plan/multinode.py); empty when the config gives no layout
    layer_types: tuple = ()
    tied_embeddings: bool = False  # lm_head shares the embedding matrix (one copy in the checkpoint)
    # the KV-cache quantization the checkpoint asks for (ModelOpt kv_cache_quant_algo / kv_cache_scheme),
    # which vLLM's `--kv-cache-dtype auto` follows; None: none declared
    kv_cache_quant: str | None = None
    mtp_layers: int = 0  # native MTP layers in the checkpoint (Qwen3.5/3.8 mtp_num_hidden_layers): method 'mtp'

    @property
    def hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    def kv_bytes_per_token(self, tp: int, kv_dtype_bytes: int) -> int:
        """KV for the full-attention layers only, per GPU: K and V, kv heads split over TP.

        With more GPUs than kv heads vLLM replicates each head, so a GPU never holds less than one.
        """
        heads_per_gpu = max(1, self.num_kv_heads // tp)
        return self.full_attention_layers * heads_per_gpu * self.head_dim * 2 * kv_dtype_bytes

    def recurrent_state_bytes(self, tp: int) -> int:
        """Gated DeltaNet state per sequence per GPU: fp32 [v_heads, k_dim, v_dim] per layer + conv state."""
        if not self.hybrid:
            return 0
        heads = max(1, self.gdn_value_heads // tp)
        ssm = self.linear_attention_layers * heads * self.gdn_key_dim * self.gdn_value_dim * 4
        conv_channels = (2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim) // tp
        conv = self.linear_attention_layers * conv_channels * max(0, self.gdn_conv_kernel - 1) * 2
        return ssm + conv


def _weight_bytes(model_dir: Path) -> int:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            return int(json.loads(index.read_text())["metadata"]["total_size"])
        except (KeyError, ValueError, TypeError) as error:
            raise CheckpointError(f"{index}: no metadata.total_size ({error})") from None
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: neither model.safetensors.index.json nor *.safetensors found")
    return sum(f.stat().st_size for f in files)


def _lm_head_quantized(quant: dict) -> bool:
    if not quant:
        return False
    excluded = quant.get("exclude_modules") or quant.get("ignore") or quant.get("modules_to_not_convert") or []
    return not any(name == "lm_head" or name.endswith(".lm_head") or name == "*lm_head*" for name in excluded)


def _kv_cache_quant(quant: dict) -> str | None:
    algo = quant.get("kv_cache_quant_algo") or quant.get("kv_cache_scheme")
    if isinstance(algo, dict):
        return f"{algo.get('type', '')}{algo.get('num_bits', '')}" or None
    return str(algo) if algo else None


def shape_from_config(config: dict, weight_bytes: int) -> ModelShape:
    """Pure: config.json (as a dict) + total weight bytes -> ModelShape."""
    text = config.get("text_config") or config
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        layer_types = text.get("layer_types")
        if layer_types:
            full = sum(1 for kind in layer_types if kind == "full_attention")
        elif text.get("full_attention_interval"):
            full = layers // int(text["full_attention_interval"])
        else:
            full = layers
        interval = int(text.get("full_attention_interval") or 1)
        kinds = tuple(layer_types) if layer_types else tuple(
            "full_attention" if (n + 1) % interval == 0 else "linear_attention" for n in range(layers))
        quant = config.get("quantization_config") or {}
        return ModelShape(
            architecture=(config.get("architectures") or ["unknown"])[0],
            hidden_size=hidden,
            intermediate_size=int(text.get("intermediate_size", 4 * hidden)),
            num_layers=layers,
            full_attention_layers=full,
            linear_attention_layers=layers - full,
            num_attention_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads", heads)),
            head_dim=int(text.get("head_dim") or hidden // heads),
            vocab_size=int(text["vocab_size"]),
            max_position_embeddings=text.get("max_position_embeddings"),
            weight_bytes=int(weight_bytes),
            multimodal="vision_config" in config,
            quant_method=quant.get("quant_method"),
            quant_algo=quant.get("quant_algo"),
            lm_head_quantized=_lm_head_quantized(quant),
            gdn_value_heads=int(text.get("linear_num_value_heads", 0)),
            gdn_key_heads=int(text.get("linear_num_key_heads", 0)),
            gdn_key_dim=int(text.get("linear_key_head_dim", 0)),
            gdn_value_dim=int(text.get("linear_value_head_dim", 0)),
            gdn_conv_kernel=int(text.get("linear_conv_kernel_dim", 0)),
            layer_types=kinds,
            tied_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            kv_cache_quant=_kv_cache_quant(quant),
            mtp_layers=int(text.get("mtp_num_hidden_layers") or config.get("mtp_num_hidden_layers") or 0),
        )
    except KeyError as missing:
        raise CheckpointError(f"config.json lacks {missing}, which the memory plan needs") from None
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"config.json has a field of the wrong type: {error}") from None


def load_shape(model_dir: Path | str) -> ModelShape:
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{config_path} not found") from None
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{config_path} is not valid JSON: {error}") from None
    return shape_from_config(config, _weight_bytes(model_dir))
