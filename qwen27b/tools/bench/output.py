"""What a run leaves behind: the table, the A/B comparison, bench.csv/json/txt/png, and a saved run
read back (--load, --ab)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

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
