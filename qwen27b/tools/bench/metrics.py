"""vLLM's /metrics: scraped before and after each level; counters are cumulative, so deltas."""

from __future__ import annotations

import math
import re
from typing import Mapping

from qwen27b.tools.bench.common import ratio

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



def scrape(client, base: str) -> dict[str, float]:
    try:
        r = client.get(f"{base}/metrics")
        return parse_metrics(r.text) if r.status_code == 200 else {}
    except Exception:  # noqa: BLE001 - no /metrics: the counter columns stay empty
        return {}
