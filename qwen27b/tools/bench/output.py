"""What a run leaves behind: the table, the A/B comparison, bench.csv/json/txt/png, and a saved run
read back (--load, --ab)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from urllib.parse import urlparse

from qwen27b.tools.bench.common import (FP4_27B_GB_PER_TOKEN, FP16_27B_GB_PER_TOKEN, NO_GPU, SEED_MAX_MODEL_LENS,
                                       BenchError)


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
    lg = run.get("load_generator") or {}
    if lg.get("name") == "vllm-bench":
        head.append(f"requests sent and timed by vllm bench serve {lg.get('vllm_version') or '?'} "
                    f"({lg.get('vllm')}); prompts' template tokens, /metrics and ceilings by qwen27b bench")
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
    """One row per level. Numeric columns hold numbers or nothing: no GPU leaves the ceilings and
    fractions empty (the ``gpu`` column says why), so a spreadsheet reads every column as numbers."""
    ceil = run.get("ceilings") or {}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for lv in run["levels"]:
        row = {k: run.get(k) for k in ("model", "url", "server_version", "api", "max_model_len_label",
                                       "spec", "tp", "prompt_tokens", "output_tokens")}
        row["gpu"] = ceil.get("gpu") or NO_GPU
        row.update({k: lv.get(k) for k in CSV_FIELDS if k in lv})
        row["decode_ceiling_tok_s"] = ceil.get("decode_tok_s")
        row["prefill_ceiling_tok_s"] = ceil.get("prefill_tok_s")
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def chart_title(run: dict) -> str:
    """Date, host and vLLM version first (what a picture pasted into an issue must carry), then the test."""
    when = (run.get("started") or "").replace("T", " ")[:16]
    host = urlparse(run.get("url") or "").hostname or "?"
    ceil = run.get("ceilings") or {}
    return (f"qwen27b bench {when + ' UTC' if when else '(no date)'}  {host}  vLLM {run.get('server_version') or '?'}"
            f"  {ceil.get('gpu') or 'no GPU'}{' x ' + str(ceil['tp']) if ceil.get('tp') else ''}\n"
            f"{run.get('model')}  prompt {run['prompt_tokens']} / output {run['output_tokens']}  "
            f"max-model-len {run.get('max_model_len_label')}  spec {run.get('spec')}")


def _series(run: dict, key: str, scale: float = 1.0, floor: float | None = None) -> tuple[list, list]:
    """(concurrency, value) pairs of the levels that have the figure; with a floor (a log axis),
    values under it sit on it: a queue of 30 us is "no queue", not four decades of empty axis."""
    pts = [(lv["concurrency"], lv[key] * scale) for lv in run["levels"] if lv.get(key) is not None]
    if floor is not None:
        pts = [(x, max(y, floor)) for x, y in pts]
    return [x for x, _ in pts], [y for _, y in pts]


def _log_floor(runs: list[dict]) -> float:
    """The log axis's floor: the power of ten one to two decades under the fastest client TTFT p50 (s)."""
    fastest = [lv["ttft_p50_ms"] / 1000 for r in runs for lv in r["levels"] if lv.get("ttft_p50_ms")]
    return 10 ** (math.floor(math.log10(min(fastest))) - 1) if fastest else 1e-3


def write_chart(run: dict, path: Path, baseline: dict | None = None) -> Path | None:
    """Three panels per concurrency: tok/s; TTFT in seconds on a log axis with the engine's queue
    and prefill means beside it (queueing past --max-num-seqs shows as the queue line rising, not
    prefill); speculative acceptance and prefix-cache hits when /metrics had them. The baseline's
    lines dashed in A/B mode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter
    except ImportError:
        return None
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    series = [(run, "-", "")] + ([(baseline, "--", " (A)")] if baseline else [])
    floor = _log_floor([r for r, _, _ in series])
    rates = False
    for r, style, tag in series:
        for ax, key, marker, color, label, scale in (
                (ax1, "decode_tok_s_p50", "o", "C0", "decode tok/s per request p50", 1),
                (ax1, "aggregate_output_tok_s", "s", "C1", "aggregate output tok/s", 1),
                (ax2, "ttft_p50_ms", "o", "C2", "TTFT p50 (client)", 1e-3),
                (ax2, "ttft_p90_ms", "^", "C3", "TTFT p90 (client)", 1e-3),
                (ax2, "server_queue_mean_ms", "v", "C4", f"queue mean (server; < {floor:g} s on the floor)", 1e-3),
                (ax2, "server_prefill_mean_ms", "D", "C5", "prefill mean (server)", 1e-3),
                (ax3, "spec_acceptance_rate", "o", "C6", "spec acceptance (accepted/drafted)", 1),
                (ax3, "prefix_cache_hit_rate", "s", "C7", "prefix-cache hits/queries", 1)):
            xs, ys = _series(r, key, scale, floor if ax is ax2 else None)
            if xs:
                ax.plot(xs, ys, marker + style, color=color, label=label + tag)
                rates = rates or ax is ax3
    ceil = run.get("ceilings")
    if ceil and ceil.get("decode_tok_s"):
        ax1.axhline(ceil["decode_tok_s"], color="grey", linestyle=":", label="bandwidth ceiling per sequence")
    for lv in run["levels"]:  # acceptance length: tokens per target pass, the most speculation can give
        if lv.get("spec_acceptance_rate") is not None and lv.get("spec_acceptance_length") is not None:
            ax3.annotate(f"AL {lv['spec_acceptance_length']:.2f}", (lv["concurrency"], lv["spec_acceptance_rate"]),
                         textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7, color="C6")
    ax2.set_yscale("log")  # TTFT spans ms (one request) to many seconds (queued): seconds, log
    ax2.set_ylim(bottom=floor / 1.5)
    ax2.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(NullFormatter())
    ax3.set_ylim(0, 1.05)
    ax3.yaxis.set_major_formatter(PercentFormatter(1.0))
    if not rates:
        ax3.text(0.5, 0.5, "no speculative-decoding or prefix-cache\ncounters in /metrics",
                 ha="center", va="center", transform=ax3.transAxes, fontsize=9, color="grey")
        ax3.set_xlim(ax1.get_xlim())
    for ax, ylabel in ((ax1, "tokens / s"), (ax2, "seconds (log)"), (ax3, "rate")):
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({lv["concurrency"] for lv in run["levels"]}))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    ax1.set_ylim(bottom=0)
    ax1.set_title("throughput", fontsize=9)
    ax2.set_title("time to first token: queue vs prefill", fontsize=9)
    ax3.set_title("speculative acceptance, prefix cache", fontsize=9)
    fig.suptitle(chart_title(run), fontsize=9)
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
