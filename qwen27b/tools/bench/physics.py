"""The physical ceilings beside each figure: GPU bandwidth and fp16 peak from the stack's
``gpus:`` table, weight bytes and parameter count from the checkpoint metadata."""

from __future__ import annotations

import json
from typing import Mapping

from qwen27b.tools.bench.common import BenchError


def gpu_row(stack: dict, key: str) -> dict:
    """The stack's ``gpus:`` row by key (or an nvidia-smi name); refuses an unknown one."""
    for row in stack["gpus"]:
        if key == row["key"] or key in row.get("names", ()):
            return row
    keys = ", ".join(row["key"] for row in stack["gpus"])
    raise BenchError(f"unknown --gpu {key!r}; the stack's gpus: table has: {keys}")


def params_from_config(config: Mapping) -> int | None:
    """Parameter count of the text model, estimated from config.json shapes.

    Dense (Llama/Qwen-style) MLP, full attention (with Qwen3.5's output gate when
    ``attn_output_gate``), Gated DeltaNet linear attention, embeddings and an untied lm_head.
    Norms, biases and conv kernels (<0.1%) are left out. None for MoE configs (active
    parameters per token are not the total): pass --params there.
    """
    t = config.get("text_config") or config
    if any(k in t for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        return None
    try:
        h = int(t["hidden_size"])
        layers = int(t["num_hidden_layers"])
        inter = int(t.get("intermediate_size", 4 * h))
        nq = int(t["num_attention_heads"])
        nkv = int(t.get("num_key_value_heads", nq))
        hd = int(t.get("head_dim") or h // nq)
        vocab = int(t["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kinds = t.get("layer_types")
    if kinds:
        full = sum(1 for k in kinds if k == "full_attention")
    elif t.get("full_attention_interval"):
        full = layers // int(t["full_attention_interval"])
    else:
        full = layers
    linear = layers - full
    gate = 2 if t.get("attn_output_gate") else 1
    attn = h * nq * hd * gate + 2 * h * nkv * hd + nq * hd * h
    lin = 0
    if linear:
        nk, nv = int(t.get("linear_num_key_heads", 0)), int(t.get("linear_num_value_heads", 0))
        dk, dv = int(t.get("linear_key_head_dim", 0)), int(t.get("linear_value_head_dim", 0))
        lin = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h  # qkvz, ba, out
    tied = t.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    emb = vocab * h * (1 if tied else 2)
    return full * attn + linear * lin + layers * 3 * h * inter + emb


def stack_model_facts(stack: dict, key: str) -> dict:
    """Weights bytes (safetensors index total_size) and estimated params of a stack model."""
    from qwen27b.plan.checkpoint import CheckpointError, load_shape
    from qwen27b.plan.stack import checkpoint_metadata_dir
    if key not in stack["models"]:
        raise BenchError(f"unknown stack model {key!r}; stack models: {', '.join(stack['models'])}")
    folder = checkpoint_metadata_dir(stack["models"][key])
    try:
        shape = load_shape(folder)
        config = json.loads((folder / "config.json").read_text())
    except (CheckpointError, OSError, ValueError) as error:
        raise BenchError(f"stack model {key}: cannot read its checkpoint metadata: {error}") from None
    return {"key": key, "weights_bytes": shape.weight_bytes, "params": params_from_config(config),
            "source": f"checkpoint metadata qwen27b/plan/checkpoints/{folder.name}"}


def stack_model_for_served(stack: dict, served: str | None) -> str | None:
    for key, model in stack["models"].items():
        if served and served in (model.get("served_name"), model.get("id"), key):
            return key
    return None


def ceilings(gpu: dict | None, tp: int, weights_bytes: int | None, params: int | None) -> dict | None:
    """The two physical ceilings, or None without a GPU (never an invented number).

    decode_tok_s: per sequence, one token per target forward pass, each pass streaming all
    weights once: bandwidth x TP / weight bytes (batching shares the pass, so this holds per
    request at any concurrency; speculation emits several tokens per pass and can exceed it).
    prefill_tok_s: fp16 tensor peak x TP / (2 x params) FLOP per token (compute-bound).
    """
    if gpu is None:
        return None
    out = {"gpu": gpu["key"], "bandwidth_gbs": gpu["bandwidth_gbs"],
           "fp16_tensor_tflops": gpu["fp16_tensor_tflops"], "tp": tp,
           "weights_bytes": weights_bytes, "params": params,
           "decode_tok_s": None, "decode_floor_ms": None, "prefill_tok_s": None}
    if weights_bytes:
        out["decode_tok_s"] = gpu["bandwidth_gbs"] * 1e9 * tp / weights_bytes
        out["decode_floor_ms"] = 1000.0 / out["decode_tok_s"]
    if params:
        out["prefill_tok_s"] = gpu["fp16_tensor_tflops"] * 1e12 * tp / (2.0 * params)
    return out



def resolve_physics(args, stack: dict, served: str) -> dict:
    """GPU row, weights bytes and params with where each came from; refuses a guess."""
    out = {"gpu": None, "weights_bytes": args.weights_bytes, "weights_source": None,
           "params": args.params, "params_source": "--params" if args.params else None, "stack_model": None}
    if args.weights_bytes:
        out["weights_source"] = "--weights-bytes"
    key = args.stack_model or stack_model_for_served(stack, served)
    if key:
        facts = stack_model_facts(stack, key)
        out["stack_model"] = key
        if not out["weights_bytes"]:
            out["weights_bytes"] = facts["weights_bytes"]
            out["weights_source"] = (f"{facts['source']}: safetensors total_size (an upper bound on the "
                                     "bytes read per token: it includes embeddings/vision; --weights-bytes to refine)")
        if not out["params"] and facts["params"]:
            out["params"] = facts["params"]
            out["params_source"] = f"estimated from {facts['source']} config.json"
    if args.gpu:
        out["gpu"] = gpu_row(stack, args.gpu)
        if not out["weights_bytes"]:
            known = ", ".join(stack["models"])
            raise BenchError(f"--gpu needs the weight bytes read per token and {served!r} is no stack model: "
                             f"pass --weights-bytes B or --stack-model KEY ({known})")
    return out
