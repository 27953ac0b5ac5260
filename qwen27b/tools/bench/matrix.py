"""The matrix's figures: per-request and per-level statistics, the token check, and the A/B ratios
beside the physics ceilings."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from qwen27b.tools.bench.common import (FP4_27B_GB_PER_TOKEN, FP16_27B_GB_PER_TOKEN, SEED_DECODE_CLAIM,
                                       SEED_PREFILL_CLAIM, ratio)
from qwen27b.tools.bench.metrics import COUNTERS


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
