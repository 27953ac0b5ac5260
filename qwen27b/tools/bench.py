"""`qwen27b bench`: the seed's bench matrix (section 4.2), measured honestly.

    qwen27b bench --url http://HOST:PORT [--api-key-file F] [--model NAME] [--tokenizer DIR]
                  [--prompt-tokens 512] [--output-tokens 256] [--concurrency 1,4,8]
                  [--max-model-len-label 4096] [--gpu KEY --tp N --weights-bytes B]
                  [--spec on|off|auto] [--requests-per-level N] [--warmup N] [--out DIR]
                  [--ab OTHER_RESULT.json]
    qwen27b bench --load RUN.json [--ab OTHER_RESULT.json] [--out DIR]   (no server: re-print/compare)

The seed fixes the test so numbers can be compared: prompt 512 tokens, output 256, batch 1/4/8,
max-model-len 4096 and 8192. This module:

- builds each prompt to exactly --prompt-tokens tokens *as the server counts them* (chat
  template included): with the model's own tokenizer when ``transformers`` is importable and
  --tokenizer is given, else through the server's ``/tokenize`` (vLLM serves it); then checks
  that count against the ``usage.prompt_tokens`` the server reports, and records both;
- sends streamed requests (``ignore_eos``, ``max_tokens`` = --output-tokens,
  ``stream_options.include_usage``) with at most C in flight per concurrency level C, after
  warm-up requests that are not timed (the first request on a V100 compiles for minutes);
- per level: TTFT p50/p90, decode tok/s per request and aggregate, end-to-end p50/p90, prefill
  tok/s (prompt / TTFT), and from ``/metrics`` deltas (counters are cumulative) the speculative
  acceptance rate / length and the prefix-cache hit rate;
- puts each figure beside its physical ceiling: decode against GPU bandwidth x TP / weight bytes
  read per token, prefill against fp16 tensor peak x TP / (2 x params), both from the stack's
  ``gpus:`` table (--gpu) and the checkpoint metadata; with no --gpu it prints "n/a (no GPU)";
- ``--ab other.json`` prints the ratio per cell with the physics ceiling beside the seed's
  "3x decode / 15x prefill" claims (FACTS.md "Physics of the seed's claims");
- writes bench.json, bench.csv, bench.txt (the table) and bench.png (tok/s and TTFT per
  concurrency, matplotlib Agg) to --out.

The controller package needs only httpx here (matplotlib for the chart); ``transformers`` /
``tokenizers`` are used when importable, never required.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import io
import json
import math
import random
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

SCHEMA = 1
NO_GPU = "n/a (no GPU)"

# FACTS.md, "Physics of the seed's claims (batch 1, one V100, 900 GB/s HBM2)".
SEED_DECODE_CLAIM = 3.0
SEED_PREFILL_CLAIM = 15.0
FP16_27B_GB_PER_TOKEN = 51.0   # fp16 27B: ~51 GB of weights read per decoded token
FP4_27B_GB_PER_TOKEN = 16.0    # 4.5 bit/weight incl. scales, lm_head fp16: ~16 GB per token

# The seed's matrix (section 4.2).
SEED_PROMPT_TOKENS = 512
SEED_OUTPUT_TOKENS = 256
SEED_CONCURRENCY = (1, 4, 8)
SEED_MAX_MODEL_LENS = (4096, 8192)

# Words for the prompt filler: common, short, mostly one token each in BPE vocabularies. Each
# request draws its own random sequence (seeded per run), so requests share no prefix beyond the
# chat template and a rerun does not hit the prefix cache of an earlier run.
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education river stone garden "
    "window light music paper table green blue small large early late open short long simple"
).split()
PAD = " a"  # appended to close the last few tokens of the gap; one token in BPE vocabularies


class BenchError(Exception):
    """The bench cannot run or cannot be trusted; str() says why and what to do."""


# ============================================================================ statistics

def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); None if empty."""
    data = sorted(float(v) for v in values if v is not None)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


# ============================================================================ /metrics

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def counter(metrics: Mapping[str, float], name: str) -> float | None:
    """A counter by its base name: exposed as ``name_total`` (prometheus_client) or bare."""
    for key in (f"{name}_total", name):
        if key in metrics:
            return metrics[key]
    return None


COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "spec_drafts": "vllm:spec_decode_num_drafts",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "preemptions": "vllm:num_preemptions",
}


#: Server-side histograms: the mean between two scrapes is delta(_sum) / delta(_count). Beside the
#: client's figures they separate what the engine did from what the client and network added.
HISTOGRAMS = {
    "server_ttft": "vllm:time_to_first_token_seconds",
    "server_itl": "vllm:inter_token_latency_seconds",
    "server_queue": "vllm:request_queue_time_seconds",
    "server_prefill": "vllm:request_prefill_time_seconds",
}


def histogram_mean(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    if f"{name}_sum" not in after or count <= 0:
        return None
    return (after[f"{name}_sum"] - before.get(f"{name}_sum", 0.0)) / count


def metric_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
    """Counter deltas between two scrapes and the rates built from them (None when absent).

    - prefix-cache hit rate = hits / queries (both in tokens), as FACTS.md says;
    - speculative acceptance rate = accepted / drafted tokens;
    - acceptance length = 1 + accepted / drafts: tokens emitted per target forward pass
      (vLLM's "mean acceptance length"), the most speculation can multiply decode by.
    """
    d: dict = {}
    for key, name in COUNTERS.items():
        a, b = counter(before, name), counter(after, name)
        if b is None:
            d[key] = None
        else:  # a labelled counter absent before its first increment started at 0
            d[key] = b - (a or 0.0)
    for key, name in HISTOGRAMS.items():
        d[f"{key}_mean_s"] = histogram_mean(before, after, name)
    d["prefix_cache_hit_rate"] = ratio(d["prefix_cache_hits"], d["prefix_cache_queries"]) \
        if d["prefix_cache_queries"] else None
    d["spec_acceptance_rate"] = ratio(d["spec_accepted_tokens"], d["spec_draft_tokens"]) \
        if d["spec_draft_tokens"] else None
    d["spec_acceptance_length"] = (1 + d["spec_accepted_tokens"] / d["spec_drafts"]) \
        if d["spec_drafts"] and d["spec_accepted_tokens"] is not None else None
    return d


def spec_exported(metrics: Mapping[str, float]) -> bool:
    """vLLM exports the spec-decode counters only when a speculative config is loaded."""
    return counter(metrics, COUNTERS["spec_draft_tokens"]) is not None


# ============================================================================ physics

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


# ============================================================================ per-level summary

def request_figures(r: dict) -> dict:
    """Derived per-request figures (TTFT, decode rate as vllm bench serve defines TPOT)."""
    out = dict(r)
    ttft, latency = r.get("ttft_s"), r.get("latency_s")
    ct, pt = r.get("completion_tokens"), r.get("prompt_tokens")
    out["decode_tok_s"] = ((ct - 1) / (latency - ttft)
                           if ct and ct > 1 and ttft is not None and latency and latency > ttft else None)
    out["prefill_tok_s"] = pt / ttft if pt and ttft else None
    return out


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def summarize_level(concurrency: int, results: Sequence[dict], wall_s: float, deltas: dict | None,
                    ceil: dict | None, prompt_tokens: int, output_tokens: int) -> dict:
    ok = [request_figures(r) for r in results if r.get("ok")]
    errors = [r.get("error") for r in results if not r.get("ok")]

    def p(key, q, scale=1.0):
        v = percentile((r[key] for r in ok if r.get(key) is not None), q)
        return None if v is None else v * scale

    out_tokens = sum(r.get("completion_tokens") or 0 for r in ok)
    in_tokens = sum(r.get("prompt_tokens") or 0 for r in ok)
    deltas = deltas or {}
    level = {
        "concurrency": concurrency,
        "requests": len(results),
        "ok": len(ok),
        "errors": len(errors),
        "error_samples": errors[:3],
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "usage_prompt_tokens": sorted({r.get("prompt_tokens") for r in ok if r.get("prompt_tokens") is not None}),
        "usage_completion_tokens": sorted({r.get("completion_tokens") for r in ok
                                           if r.get("completion_tokens") is not None}),
        "wall_s": wall_s,
        "ttft_p50_ms": p("ttft_s", 50, 1000), "ttft_p90_ms": p("ttft_s", 90, 1000),
        "e2e_p50_s": p("latency_s", 50), "e2e_p90_s": p("latency_s", 90),
        "decode_tok_s_p50": p("decode_tok_s", 50), "decode_tok_s_p10": p("decode_tok_s", 10),
        "prefill_tok_s_p50": p("prefill_tok_s", 50),
        "aggregate_output_tok_s": out_tokens / wall_s if wall_s > 0 and ok else None,
        "aggregate_total_tok_s": (out_tokens + in_tokens) / wall_s if wall_s > 0 and ok else None,
        "prefix_cache_hit_rate": deltas.get("prefix_cache_hit_rate"),
        "spec_acceptance_rate": deltas.get("spec_acceptance_rate"),
        "spec_acceptance_length": deltas.get("spec_acceptance_length"),
        "preemptions": deltas.get("preemptions"),
        "server_ttft_mean_ms": _scale(deltas.get("server_ttft_mean_s"), 1000),
        "server_queue_mean_ms": _scale(deltas.get("server_queue_mean_s"), 1000),
        "server_prefill_mean_ms": _scale(deltas.get("server_prefill_mean_s"), 1000),
        "server_decode_tok_s": 1.0 / deltas["server_itl_mean_s"] if deltas.get("server_itl_mean_s") else None,
        "metrics": {k: deltas.get(k) for k in COUNTERS},
        "decode_vs_ceiling": None,
        "prefill_vs_ceiling": None,
    }
    if ceil:
        level["decode_vs_ceiling"] = ratio(level["decode_tok_s_p50"], ceil.get("decode_tok_s"))
        level["prefill_vs_ceiling"] = ratio(level["prefill_tok_s_p50"], ceil.get("prefill_tok_s"))
    return level


def token_check(levels: Sequence[dict], prompt_tokens: int, output_tokens: int) -> dict:
    """Do the server's usage counts match what was requested?"""
    seen_p = sorted({v for lv in levels for v in lv["usage_prompt_tokens"]})
    seen_c = sorted({v for lv in levels for v in lv["usage_completion_tokens"]})
    return {"prompt_tokens_requested": prompt_tokens, "prompt_tokens_reported": seen_p,
            "prompt_tokens_match": seen_p == [prompt_tokens],
            "output_tokens_requested": output_tokens, "output_tokens_reported": seen_c,
            "output_tokens_match": seen_c == [output_tokens]}


# ============================================================================ A/B

def _run_desc(run: dict) -> str:
    gpu = (run.get("ceilings") or {}).get("gpu") or "no GPU"
    return (f"{run.get('model')} on {gpu} tp{run.get('tp', 1)}, spec {run.get('spec')}, "
            f"max-model-len {run.get('max_model_len_label')}, {run.get('url')}")


def _al(run: dict) -> float | None:
    """A run's tokens per target pass: 1 without speculation, the measured AL with it."""
    if run.get("spec") != "on":
        return 1.0
    measured = sorted((lv["concurrency"], lv["spec_acceptance_length"]) for lv in run.get("levels", [])
                      if lv.get("spec_acceptance_length") is not None)
    return measured[0][1] if measured else None  # the lowest concurrency level's


def ab_compare(a: dict, b: dict) -> dict:
    """B (this run) against A (the baseline): speedup per cell (>1 = B better) and the ceilings."""
    rows = []
    a_levels = {lv["concurrency"]: lv for lv in a.get("levels", [])}
    for lv in b.get("levels", []):
        base = a_levels.get(lv["concurrency"])
        if not base:
            continue
        rows.append({
            "concurrency": lv["concurrency"],
            "decode_tok_s": ratio(lv["decode_tok_s_p50"], base["decode_tok_s_p50"]),
            "aggregate_output_tok_s": ratio(lv["aggregate_output_tok_s"], base["aggregate_output_tok_s"]),
            "ttft_p50": ratio(base["ttft_p50_ms"], lv["ttft_p50_ms"]),
            "e2e_p50": ratio(base["e2e_p50_s"], lv["e2e_p50_s"]),
            "prefill_tok_s": ratio(lv["prefill_tok_s_p50"], base["prefill_tok_s_p50"]),
        })
    warnings = []
    for key in ("prompt_tokens", "output_tokens", "api"):
        if a.get(key) != b.get(key):
            warnings.append(f"not the same test: {key} {a.get(key)} (A) vs {b.get(key)} (B); the seed's "
                            "point is that ratios across different inputs mean nothing")
    if str(a.get("max_model_len_label")) != str(b.get("max_model_len_label")):
        warnings.append(f"max-model-len differs: {a.get('max_model_len_label')} (A) vs "
                        f"{b.get('max_model_len_label')} (B): this A/B measures that change")
    if not rows:
        warnings.append("no concurrency level in common: nothing to compare")

    ca, cb = a.get("ceilings"), b.get("ceilings")
    factors = {}
    wa, wb = a.get("weights_bytes"), b.get("weights_bytes")
    factors["weights"] = ratio(wa, wb) if wa and wb else None
    if ca and cb:
        factors["bandwidth_x_tp"] = ratio(cb["bandwidth_gbs"] * cb["tp"], ca["bandwidth_gbs"] * ca["tp"])
        factors["peak_x_tp"] = ratio(cb["fp16_tensor_tflops"] * cb["tp"], ca["fp16_tensor_tflops"] * ca["tp"])
    else:
        factors["bandwidth_x_tp"] = factors["peak_x_tp"] = None
    al_a, al_b = _al(a), _al(b)
    factors["speculation"] = ratio(al_b, al_a)
    pa, pb = a.get("params"), b.get("params")
    factors["params"] = ratio(pa, pb) if pa and pb else None

    def product(keys):
        vals = [factors[k] for k in keys]
        return math.prod(vals) if all(v is not None for v in vals) else None

    first = min(rows, key=lambda r: r["concurrency"]) if rows else None
    return {
        "a": _run_desc(a), "b": _run_desc(b), "rows": rows, "warnings": warnings, "factors": factors,
        "decode_ceiling": product(("weights", "bandwidth_x_tp", "speculation")),
        "prefill_ceiling": product(("peak_x_tp", "params")),
        "measured_decode_lowest_concurrency": first and first["decode_tok_s"],
        "measured_prefill_lowest_concurrency": first and first["prefill_tok_s"],
        "lowest_concurrency": first and first["concurrency"],
        "seed": {"decode_claim": SEED_DECODE_CLAIM, "prefill_claim": SEED_PREFILL_CLAIM,
                 "decode_weights_ceiling_27b": FP16_27B_GB_PER_TOKEN / FP4_27B_GB_PER_TOKEN,
                 "prefill_quantization_ceiling": 1.0},
    }


# ============================================================================ formatting

def _f(value, fmt: str, na: str = "-") -> str:
    return na if value is None else format(value, fmt)


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(run: dict) -> str:
    ceil = run.get("ceilings")
    tc = run.get("token_check") or {}
    head = [
        f"qwen27b bench: {run.get('model')} @ {run.get('url')} (vLLM {run.get('server_version') or '?'})",
        f"test: prompt {run['prompt_tokens']} tokens, output {run['output_tokens']} tokens (ignore_eos), "
        f"{run.get('api')} API, streamed; max-model-len {run.get('max_model_len_label')} "
        f"(server reports {run.get('server_max_model_len') or '?'}); spec {run.get('spec')}; "
        f"{run.get('warmup')} warm-up request(s) not timed",
        f"prompt tokens counted by {run.get('token_counter')}; server usage: prompt "
        f"{tc.get('prompt_tokens_reported')} ({'match' if tc.get('prompt_tokens_match') else 'MISMATCH'}), "
        f"completion {tc.get('output_tokens_reported')} "
        f"({'match' if tc.get('output_tokens_match') else 'MISMATCH'})",
    ]
    if ceil:
        w = ceil.get("weights_bytes")
        head.append(
            f"decode ceiling: {ceil['bandwidth_gbs']} GB/s x TP {ceil['tp']} / "
            + (f"{w / 1e9:.2f} GB weights per token = {ceil['decode_tok_s']:.1f} tok/s per sequence "
               f"(floor {ceil['decode_floor_ms']:.1f} ms/token) [{run.get('weights_source')}]"
               if w else "? (weights bytes unknown: pass --weights-bytes)"))
        pr = ceil.get("params")
        head.append(
            f"prefill ceiling: {ceil['fp16_tensor_tflops']} TFLOPS fp16 x TP {ceil['tp']} / "
            + (f"(2 x {pr / 1e9:.2f} B params) = {ceil['prefill_tok_s']:.0f} tok/s [{run.get('params_source')}]"
               if pr else "? (params unknown: pass --params)"))
    else:
        head.append(f"decode bandwidth floor: {NO_GPU}; prefill compute ceiling: {NO_GPU}")
    rows = [["conc", "ok/req", "TTFT p50/p90 ms", "decode tok/s/req", "aggr. tok/s",
             "e2e p50/p90 s", "prefill tok/s", "server queue/TTFT ms", "prefix hit", "spec accept (AL)",
             "decode/ceiling", "prefill/ceiling"]]
    for lv in run["levels"]:
        spec = "-"
        if lv.get("spec_acceptance_rate") is not None:
            spec = f"{lv['spec_acceptance_rate']:.0%} ({_f(lv.get('spec_acceptance_length'), '.2f')})"
        if ceil:
            dvc = _f(lv.get("decode_vs_ceiling"), ".0%", "n/a")
            pvc = _f(lv.get("prefill_vs_ceiling"), ".0%", "n/a")
        else:
            dvc = pvc = NO_GPU
        rows.append([
            str(lv["concurrency"]), f"{lv['ok']}/{lv['requests']}",
            f"{_f(lv['ttft_p50_ms'], '.0f')}/{_f(lv['ttft_p90_ms'], '.0f')}",
            _f(lv["decode_tok_s_p50"], ".1f"), _f(lv["aggregate_output_tok_s"], ".1f"),
            f"{_f(lv['e2e_p50_s'], '.2f')}/{_f(lv['e2e_p90_s'], '.2f')}",
            _f(lv["prefill_tok_s_p50"], ".0f"),
            f"{_f(lv.get('server_queue_mean_ms'), '.0f')}/{_f(lv.get('server_ttft_mean_ms'), '.0f')}",
            _f(lv.get("prefix_cache_hit_rate"), ".0%"), spec, dvc, pvc])
    foot = []
    for w in run.get("warnings", []):
        foot.append(f"warning: {w}")
    foot.append(hint_text(run))
    return "\n".join(head) + "\n\n" + _grid(rows) + "\n\n" + "\n".join(foot)


def hint_text(run: dict) -> str:
    label = run.get("max_model_len_label")
    others = [m for m in SEED_MAX_MODEL_LENS if str(m) != str(label)]
    other = others[0] if others else SEED_MAX_MODEL_LENS[-1]
    return (f"max-model-len: this run measured the '{label}' configuration; the seed's matrix measures "
            f"{' and '.join(map(str, SEED_MAX_MODEL_LENS))}. For {other}: redeploy with host data "
            f"qwen27b_serve_flags = {{\"--max-model-len\": {other}}} (pyinfra ... deploy.py -y), rerun "
            f"with --max-model-len-label {other}, and compare the two runs with --ab.")


def format_ab(ab: dict) -> str:
    rows = [["conc", "decode tok/s/req", "aggr. tok/s", "TTFT p50", "e2e p50", "prefill tok/s"]]
    for r in ab["rows"]:
        rows.append([str(r["concurrency"]), _x(r["decode_tok_s"]), _x(r["aggregate_output_tok_s"]),
                     _x(r["ttft_p50"]), _x(r["e2e_p50"]), _x(r["prefill_tok_s"])])
    f = ab["factors"]
    seed = ab["seed"]
    conc = ab.get("lowest_concurrency")

    def factor(name, value, why):
        return f"{name} {_x(value)}" if value is not None else f"{name} n/a ({why})"
    hw_why = "no GPU" if f["bandwidth_x_tp"] is None else ""
    decode_parts = [factor("weights A/B", f["weights"], "weights bytes unknown"),
                    factor("bandwidth x TP", f["bandwidth_x_tp"], hw_why or "no GPU"),
                    factor("speculation AL", f["speculation"], "no acceptance measured")]
    prefill_parts = [factor("fp16 peak x TP", f["peak_x_tp"], "no GPU"),
                     factor("params A/B", f["params"], "params unknown")]
    lines = [
        f"A/B: B = this run ({ab['b']})",
        f"     A = baseline ({ab['a']})",
        "speedup of B over A per cell (>1 = B better; TTFT and e2e as A/B):",
        "",
        _grid(rows),
        "",
        "physics beside the seed's claims (FACTS.md, 'Physics of the seed's claims'):",
        f"  decode \"{seed['decode_claim']:.0f}x\": batch-1 decode is bandwidth-bound; 4-bit vs fp16 weights "
        f"alone cap it at {FP16_27B_GB_PER_TOKEN:.0f}/{FP4_27B_GB_PER_TOKEN:.0f} = "
        f"{seed['decode_weights_ceiling_27b']:.1f}x for 27B (realistic 1.5-2.5x).",
        f"    this pair: {', '.join(decode_parts)} -> ceiling "
        + (_x(ab["decode_ceiling"]) if ab["decode_ceiling"] is not None else "n/a (a factor is unknown)")
        + (" (draft passes cost extra: an upper bound)" if f["speculation"] not in (None, 1.0) else "")
        + f"; measured {_x(ab['measured_decode_lowest_concurrency'])} at concurrency {conc}",
        f"  prefill \"{seed['prefill_claim']:.0f}x\": prefill is compute-bound and 4-bit weights are "
        "dequantized to fp16, so quantization gives <= ~1x; only more fp16 FLOPS move it.",
        f"    this pair: {', '.join(prefill_parts)} -> ceiling "
        + (_x(ab["prefill_ceiling"]) if ab["prefill_ceiling"] is not None else "n/a (a factor is unknown)")
        + f"; measured {_x(ab['measured_prefill_lowest_concurrency'])} at concurrency {conc}",
    ]
    mp = ab.get("measured_prefill_lowest_concurrency")
    pc = ab.get("prefill_ceiling")
    if mp is not None and mp > 2 and (pc is None or mp > 1.5 * pc):
        lines.append("    a prefill ratio this large points to a pathological baseline (a cold or compiling "
                     "server, queueing, a different prompt length), not to quantization")
    for w in ab["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


# ============================================================================ files

CSV_FIELDS = [
    "model", "url", "server_version", "api", "max_model_len_label", "spec", "gpu", "tp",
    "prompt_tokens", "output_tokens", "concurrency", "requests", "ok", "errors", "wall_s",
    "ttft_p50_ms", "ttft_p90_ms", "e2e_p50_s", "e2e_p90_s", "decode_tok_s_p50", "decode_tok_s_p10",
    "aggregate_output_tok_s", "aggregate_total_tok_s", "prefill_tok_s_p50", "prefix_cache_hit_rate",
    "spec_acceptance_rate", "spec_acceptance_length", "preemptions",
    "server_ttft_mean_ms", "server_queue_mean_ms", "server_prefill_mean_ms", "server_decode_tok_s",
    "decode_ceiling_tok_s", "decode_vs_ceiling", "prefill_ceiling_tok_s", "prefill_vs_ceiling",
]


def csv_text(run: dict) -> str:
    ceil = run.get("ceilings") or {}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for lv in run["levels"]:
        row = {k: run.get(k) for k in ("model", "url", "server_version", "api", "max_model_len_label",
                                       "spec", "tp", "prompt_tokens", "output_tokens")}
        row["gpu"] = ceil.get("gpu") or NO_GPU
        row.update({k: lv.get(k) for k in CSV_FIELDS if k in lv})
        row["decode_ceiling_tok_s"] = ceil.get("decode_tok_s") if ceil else NO_GPU
        row["prefill_ceiling_tok_s"] = ceil.get("prefill_tok_s") if ceil else NO_GPU
        if not ceil:
            row["decode_vs_ceiling"] = row["prefill_vs_ceiling"] = NO_GPU
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_chart(run: dict, path: Path, baseline: dict | None = None) -> Path | None:
    """tok/s and TTFT per concurrency (and the baseline's, dashed, in A/B mode)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [(run, "-", "")] + ([(baseline, "--", " (A)")] if baseline else [])
    for r, style, tag in series:
        xs = [lv["concurrency"] for lv in r["levels"]]
        ax1.plot(xs, [lv["decode_tok_s_p50"] for lv in r["levels"]], "o" + style, color="C0",
                 label=f"decode tok/s per request p50{tag}")
        ax1.plot(xs, [lv["aggregate_output_tok_s"] for lv in r["levels"]], "s" + style, color="C1",
                 label=f"aggregate output tok/s{tag}")
        ax2.plot(xs, [lv["ttft_p50_ms"] for lv in r["levels"]], "o" + style, color="C2", label=f"TTFT p50{tag}")
        ax2.plot(xs, [lv["ttft_p90_ms"] for lv in r["levels"]], "^" + style, color="C3", label=f"TTFT p90{tag}")
    ceil = run.get("ceilings")
    if ceil and ceil.get("decode_tok_s"):
        ax1.axhline(ceil["decode_tok_s"], color="grey", linestyle=":", label="bandwidth ceiling per sequence")
    for ax, ylabel in ((ax1, "tokens / s"), (ax2, "TTFT (ms)")):
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({lv["concurrency"] for lv in run["levels"]}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"{run.get('model')}  prompt {run['prompt_tokens']} / output {run['output_tokens']}  "
                 f"max-model-len {run.get('max_model_len_label')}  spec {run.get('spec')}  "
                 f"{(ceil or {}).get('gpu') or 'no GPU'}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(run: dict, out: Path, baseline: dict | None = None) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    from qwen27b.controller.report import write_private  # reports are 0600 (they name hosts and models)
    paths = {"json": out / "bench.json", "csv": out / "bench.csv", "txt": out / "bench.txt"}
    write_private(paths["json"], json.dumps(run, indent=2, ensure_ascii=False) + "\n")
    write_private(paths["csv"], csv_text(run))
    text = format_table(run)
    if run.get("ab"):
        text += "\n\n" + format_ab(run["ab"])
    write_private(paths["txt"], text + "\n")
    png = write_chart(run, out / "bench.png", baseline)
    if png:
        paths["png"] = png
    return paths


def load_run(path: Path | str) -> dict:
    try:
        run = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise BenchError(f"cannot read a bench result from {path}: {error}") from None
    if not isinstance(run, dict) or "levels" not in run:
        raise BenchError(f"{path} is not a qwen27b bench result (no 'levels')")
    return run


# ============================================================================ prompts

def filler_words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def fit_prompt(count: Callable[[str], int], words: Sequence[str], target: int, max_calls: int = 80) -> tuple[str, int]:
    """A text whose token count (as ``count`` measures it, template included) is exactly ``target``.

    Binary search on the number of filler words (the count grows with them), then close the
    last few tokens with one-token pads. ``count`` is the tokenizer or the server's /tokenize.
    """
    calls = 0
    cache: dict[str, int] = {}

    def n(text: str) -> int:
        nonlocal calls
        if text not in cache:
            calls += 1
            if calls > max_calls:
                raise BenchError(f"could not fit a prompt of {target} tokens in {max_calls} tokenizer calls")
            cache[text] = count(text)
        return cache[text]

    def text_of(k: int, pads: int = 0) -> str:
        return " ".join(words[:k]) + PAD * pads

    base = n(text_of(0))
    if base > target:
        raise BenchError(f"the chat template alone is {base} tokens: more than --prompt-tokens {target}")
    lo, hi = 0, min(len(words), max(1, target - base))
    while n(text_of(hi)) < target and hi < len(words):
        lo, hi = hi, min(len(words), hi * 2)
    if n(text_of(hi)) < target:
        raise BenchError(f"{len(words)} filler words give only {n(text_of(hi))} tokens < {target}")
    while hi - lo > 1:  # invariant: n(lo) <= target (or lo == 0), n(hi) >= target
        mid = (lo + hi) // 2
        if n(text_of(mid)) <= target:
            lo = mid
        else:
            hi = mid
    if n(text_of(hi)) == target:
        return text_of(hi), target
    for k in (lo, lo - 1, lo - 2):
        if k < 0:
            break
        pads = target - n(text_of(k))
        for _ in range(6):
            if pads < 0:
                break
            got = n(text_of(k, pads))
            if got == target:
                return text_of(k, pads), target
            pads += target - got
    raise BenchError(f"could not build a prompt of exactly {target} tokens (the tokenizer merges the pads)")


class TokenCounter:
    """Counts prompt tokens the way the server will: local tokenizer or the server's /tokenize."""

    def __init__(self, api: str, model: str, client=None, base: str = "", headers: dict | None = None,
                 tokenizer_dir: str | None = None):
        self.api, self.model, self.client, self.base = api, model, client, base
        self.headers = headers or {}
        self.local = None
        self.name = "server /tokenize"
        if tokenizer_dir:
            self._load_local(tokenizer_dir)

    def _load_local(self, directory: str) -> None:
        try:
            from transformers import AutoTokenizer  # optional: never a controller requirement
            tok = AutoTokenizer.from_pretrained(directory)
            if self.api == "chat":
                def count(text):
                    ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                                  add_generation_prompt=True, tokenize=True)
                    if hasattr(ids, "keys"):
                        ids = ids["input_ids"]
                    return len(ids)
            else:
                def count(text):
                    return len(tok(text)["input_ids"])
            self.local, self.name = count, f"transformers tokenizer ({directory})"
            return
        except ImportError:
            pass
        if self.api == "completions":
            try:
                from tokenizers import Tokenizer
                tok = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
                self.local = lambda text: len(tok.encode(text).ids)
                self.name = f"tokenizers ({directory})"
                return
            except Exception:  # noqa: BLE001 - not importable or no tokenizer.json: use the server
                pass
        self.name = ("server /tokenize (transformers not importable here: the chat template needs it)"
                     if self.api == "chat" else "server /tokenize (no local tokenizer importable)")

    def __call__(self, text: str) -> int:
        if self.local:
            return self.local(text)
        body = {"model": self.model}
        if self.api == "chat":
            body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            body.update(prompt=text)
        r = self.client.post(f"{self.base}/tokenize", json=body, headers=self.headers)
        if r.status_code != 200:
            raise BenchError(f"POST /tokenize answered {r.status_code}: {r.text[:200]} "
                             "(pass --tokenizer DIR with transformers installed to count locally)")
        data = r.json()
        return int(data.get("count", len(data.get("tokens", []))))


# ============================================================================ the load

def request_body(api: str, model: str, text: str, output_tokens: int, temperature: float | None) -> dict:
    body = {"model": model, "max_tokens": output_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if temperature is not None:
        body["temperature"] = temperature
    return body


async def one_request(client, url: str, body: dict, headers: dict) -> dict:
    """One streamed request; TTFT = first chunk with choices, latency = last such chunk (as
    ``vllm bench serve`` measures them); token counts from the usage chunk."""
    t0 = time.perf_counter()
    first = last = None
    usage: dict = {}
    finish = None
    out = {"ok": False, "start": t0}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                detail = (await r.aread())[:300].decode(errors="replace")
                out.update(error=f"HTTP {r.status_code}: {detail}", end=time.perf_counter())
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                now = time.perf_counter()
                choices = obj.get("choices") or []
                if choices:
                    first = first or now
                    last = now
                    finish = choices[0].get("finish_reason") or finish
                if obj.get("usage"):
                    usage = obj["usage"]
    except Exception as error:  # noqa: BLE001 - any transport/parse failure is a failed request
        out.update(error=f"{type(error).__name__}: {error}", end=time.perf_counter())
        return out
    end = time.perf_counter()
    if first is None:
        out.update(error="the stream returned no token", end=end)
        return out
    out.update(ok=True, end=end, ttft_s=first - t0, latency_s=last - t0, finish_reason=finish,
               prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
    return out


async def run_level(base: str, api: str, bodies: Sequence[dict], concurrency: int, headers: dict,
                    timeout: float) -> tuple[list[dict], float]:
    import httpx
    url = f"{base}/v1/chat/completions" if api == "chat" else f"{base}/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30), limits=limits,
                                 trust_env=False) as client:
        async def guarded(body):
            async with sem:
                return await one_request(client, url, body, headers)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(b) for b in bodies))
        wall = time.perf_counter() - t0
    for r in results:
        r["start"] -= t0
        r["end"] -= t0
    return list(results), wall


# ============================================================================ the run

def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def read_key_file(path: str | None) -> str | None:
    """The API key, read as deploy and qwen27b-health read it (qwen27b.onhost.health.load_secret)."""
    if not path:
        return None
    from qwen27b.onhost.health import SecretFileError, load_secret
    try:
        return load_secret(path)
    except SecretFileError as error:
        raise BenchError(f"--api-key-file {path}: {error}") from None


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def server_info(client, base: str, headers: dict, model: str | None) -> dict:
    import httpx
    try:
        r = client.get(f"{base}/v1/models", headers=headers)
    except httpx.HTTPError as error:
        raise BenchError(f"GET {base}/v1/models failed: {type(error).__name__}: {error}") from None
    if r.status_code == 401:
        raise BenchError("GET /v1/models answered 401: the server wants an API key (--api-key-file)")
    if r.status_code != 200:
        raise BenchError(f"GET /v1/models answered {r.status_code}: {r.text[:200]}")
    cards = r.json().get("data", [])
    ids = [c.get("id") for c in cards]
    if model is None:
        if not ids:
            raise BenchError("the server serves no model")
        model = ids[0]
    elif model not in ids:
        raise BenchError(f"model {model!r} not served; /v1/models lists {ids}")
    card = next(c for c in cards if c.get("id") == model)
    version = None
    try:
        version = client.get(f"{base}/version").json().get("version")
    except Exception:  # noqa: BLE001 - /version is informational
        pass
    return {"model": model, "max_model_len": card.get("max_model_len"), "version": version}


def scrape(client, base: str) -> dict[str, float]:
    try:
        r = client.get(f"{base}/metrics")
        return parse_metrics(r.text) if r.status_code == 200 else {}
    except Exception:  # noqa: BLE001 - no /metrics: the counter columns stay empty
        return {}


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


def measure(args) -> dict:
    import httpx
    from qwen27b.plan.stack import load_stack
    base = args.url.rstrip("/")
    key = read_key_file(args.api_key_file)
    headers = _headers(key)
    stack = load_stack()
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    # the key on every request: the route guard asks for it on /metrics and /version too
    with httpx.Client(timeout=httpx.Timeout(60, connect=10), trust_env=False, headers=headers) as client:
        info = server_info(client, base, headers, args.model)
        model = info["model"]
        physics = resolve_physics(args, stack, model)
        label = args.max_model_len_label or (str(info["max_model_len"]) if info["max_model_len"] else "unknown")
        warnings = []
        if info["max_model_len"] and args.max_model_len_label and str(info["max_model_len"]) != str(label):
            warnings.append(f"label --max-model-len-label {label} but the server reports max_model_len "
                            f"{info['max_model_len']}: the run measures the server's configuration")
        if info["max_model_len"] and args.prompt_tokens + args.output_tokens > int(info["max_model_len"]):
            raise BenchError(f"prompt {args.prompt_tokens} + output {args.output_tokens} tokens exceed the "
                             f"server's max_model_len {info['max_model_len']}")

        before_all = scrape(client, base)
        detected = spec_exported(before_all)
        spec = args.spec if args.spec != "auto" else ("on" if detected else "off")
        if args.spec == "on" and not detected:
            warnings.append("--spec on but /metrics exports no spec_decode counters: is speculation configured?")
        if args.spec == "off" and detected:
            warnings.append("--spec off but the server exports spec_decode counters: speculation is configured")

        counter_fn = TokenCounter(args.api, model, client, base, headers, args.tokenizer)
        rng = random.Random(seed)
        n_words = max(64, args.prompt_tokens * 2)

        def prompt() -> str:
            text, _ = fit_prompt(counter_fn, filler_words(rng, n_words), args.prompt_tokens)
            return text

        levels_spec = [(c, max(c, args.requests_per_level or 2 * c)) for c in args.concurrency]
        total = args.warmup + sum(n for _, n in levels_spec)
        _say(f"building {total} prompts of exactly {args.prompt_tokens} tokens ({counter_fn.name})")
        t0 = time.monotonic()
        warm_prompts = [prompt() for _ in range(args.warmup)]
        level_prompts = [[prompt() for _ in range(n)] for _, n in levels_spec]
        prompt_build_s = time.monotonic() - t0

        def bodies(texts):
            return [request_body(args.api, model, t, args.output_tokens, args.temperature) for t in texts]

        if warm_prompts:
            _say(f"warm-up: {len(warm_prompts)} request(s), not timed")
            warm, _ = asyncio.run(run_level(base, args.api, bodies(warm_prompts), 1, headers, args.timeout))
            bad = [r["error"] for r in warm if not r["ok"]]
            if bad:
                raise BenchError(f"warm-up request failed: {bad[0]}")

        ceil = ceilings(physics["gpu"], args.tp, physics["weights_bytes"], physics["params"])
        levels, raw = [], []
        for (conc, n), texts in zip(levels_spec, level_prompts):
            _say(f"concurrency {conc}: {n} requests")
            before = scrape(client, base)
            results, wall = asyncio.run(run_level(base, args.api, bodies(texts), conc, headers, args.timeout))
            after = scrape(client, base)
            deltas = metric_deltas(before, after) if before and after else None
            levels.append(summarize_level(conc, results, wall, deltas, ceil, args.prompt_tokens, args.output_tokens))
            raw.extend({"concurrency": conc, **request_figures(r)} for r in results)

    run = {
        "schema": SCHEMA, "tool": "qwen27b bench",
        "started": started, "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "url": base, "model": model, "server_version": info["version"], "api": args.api,
        "max_model_len_label": label, "server_max_model_len": info["max_model_len"],
        "spec": spec, "spec_requested": args.spec, "spec_counters_exported": detected,
        "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
        "concurrency": list(args.concurrency), "requests_per_level": [n for _, n in levels_spec],
        "warmup": args.warmup, "temperature": args.temperature, "seed": seed,
        "token_counter": counter_fn.name, "prompt_build_s": prompt_build_s,
        "gpu": physics["gpu"]["key"] if physics["gpu"] else None, "tp": args.tp,
        "stack_model": physics["stack_model"],
        "weights_bytes": physics["weights_bytes"], "weights_source": physics["weights_source"],
        "params": physics["params"], "params_source": physics["params_source"],
        "ceilings": ceil, "levels": levels, "warnings": warnings, "requests": raw,
    }
    run["token_check"] = token_check(levels, args.prompt_tokens, args.output_tokens)
    tc = run["token_check"]
    if not tc["prompt_tokens_match"]:
        warnings.append(f"the server counted {tc['prompt_tokens_reported']} prompt tokens, not "
                        f"{args.prompt_tokens} ({counter_fn.name} disagrees with the server's template)")
    if not tc["output_tokens_match"]:
        warnings.append(f"the server generated {tc['output_tokens_reported']} tokens, not {args.output_tokens} "
                        "(ignore_eos ignored, or max_model_len reached)")
    failed = sum(lv["errors"] for lv in levels)
    if failed:
        sample = next(e for lv in levels for e in lv["error_samples"])
        warnings.append(f"{failed} request(s) failed, e.g. {sample}")
    return run


# ============================================================================ CLI

def _concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers, e.g. 1,4,8") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: concurrency levels must be >= 1")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen27b bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="the endpoint, http://HOST:PORT")
    p.add_argument("--load", metavar="RUN.json", help="print (and --ab compare) a saved run instead of measuring")
    p.add_argument("--api-key-file", help="file with VLLM_API_KEY=... (or a bare key)")
    p.add_argument("--model", help="served model name (default: the first in /v1/models)")
    p.add_argument("--tokenizer", metavar="DIR", help="the model's tokenizer dir (used if transformers is importable)")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--prompt-tokens", type=_positive, default=SEED_PROMPT_TOKENS)
    p.add_argument("--output-tokens", type=_positive, default=SEED_OUTPUT_TOKENS)
    p.add_argument("--concurrency", type=_concurrency, default=list(SEED_CONCURRENCY))
    p.add_argument("--requests-per-level", type=_positive, help="default 2 x concurrency (at least the concurrency)")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first (default 1)")
    p.add_argument("--max-model-len-label", help="which deployment this measures (default: the server's max_model_len)")
    p.add_argument("--gpu", help="the stack's gpus: key (e.g. v100-sxm2-32gb) for the physical ceilings")
    p.add_argument("--tp", type=_positive, default=1)
    p.add_argument("--weights-bytes", type=int, help="weight bytes read per decoded token (default: the checkpoint's)")
    p.add_argument("--params", type=int, help="parameter count for the prefill ceiling (default: from config.json)")
    p.add_argument("--stack-model", help="stack model key for weights/params (default: matched by served name)")
    p.add_argument("--spec", choices=("on", "off", "auto"), default="auto",
                   help="speculative decoding in this deployment (auto: from /metrics)")
    p.add_argument("--temperature", type=float, help="default: the server's (generation_config)")
    p.add_argument("--seed", type=int, help="prompt filler seed (default: random per run, so no stale prefix-cache hits)")
    p.add_argument("--timeout", type=float, default=900.0, help="per-request seconds")
    p.add_argument("--out", type=Path, help="output dir (default reports/bench/<UTC time>)")
    p.add_argument("--ab", metavar="OTHER.json", help="a previous run (baseline A) to compare this run (B) with")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if bool(args.url) == bool(args.load):
            raise BenchError("give exactly one of --url (measure) or --load RUN.json (re-print a saved run)")
        baseline = load_run(args.ab) if args.ab else None
        run = load_run(args.load) if args.load else measure(args)
        if baseline:
            run["ab"] = ab_compare(baseline, run)
            run["ab"]["baseline_file"] = str(args.ab)
        out = args.out or Path("reports") / "bench" / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        paths = write_outputs(run, out, baseline)
    except BenchError as error:
        print(f"qwen27b bench: {error}", file=sys.stderr)
        return 2
    print(format_table(run))
    if run.get("ab"):
        print()
        print(format_ab(run["ab"]))
    print()
    print("wrote " + ", ".join(str(p) for p in paths.values())
          + ("" if "png" in paths else " (no chart: matplotlib not importable)"))
    failed = sum(lv["errors"] for lv in run["levels"])
    return 1 if failed or not any(lv["ok"] for lv in run["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
