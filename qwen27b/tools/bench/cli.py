"""`qwen27b bench`: the seed's bench matrix (section 4.2), measured honestly.

    qwen27b bench --url http://HOST:PORT [--api-key-file F] [--model NAME] [--tokenizer DIR]
                  [--prompt-tokens 512] [--output-tokens 256] [--concurrency 1,4,8]
                  [--max-model-len-label 4096] [--gpu KEY --tp N --weights-bytes B]
                  [--spec on|off|auto] [--requests-per-level N] [--warmup N] [--out DIR]
                  [--ab OTHER_RESULT.json] [--load-generator ours|vllm-bench [--vllm PATH]]
    qwen27b bench --load RUN.json [--ab OTHER_RESULT.json] [--out DIR]   (no server: re-print/compare)
    qwen27b bench --methods off,mtp,dflash2 --inventory INV --host HOST [the options above] [--out DIR]
                  (re-deploys HOST with each method, benches it, then deploys it as INV says: bench/methods.py)

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
- ``--load-generator vllm-bench``: each level's requests sent and timed by `vllm bench serve`
  (random dataset, its input length less the chat template's tokens), its --save-result JSON read
  into the same figures (bench/vllmbench.py maps the fields); the token check, warm-up, /metrics,
  ceilings and A/B stay ours;
- writes bench.json, bench.csv, bench.txt (the table) and bench.png (tok/s and TTFT per
  concurrency, matplotlib Agg) to --out.

The controller package needs only httpx here (matplotlib for the chart); ``transformers`` /
``tokenizers`` are used when importable, never required.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Sequence

from qwen27b.tools.bench import methods as M
from qwen27b.tools.bench.common import SEED_CONCURRENCY, SEED_OUTPUT_TOKENS, SEED_PROMPT_TOKENS, BenchError
from qwen27b.tools.bench.matrix import ab_compare
from qwen27b.tools.bench.measure import measure
from qwen27b.tools.bench.output import format_ab, format_table, load_run, write_outputs
from qwen27b.controller.report import reports_dir


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
    p.add_argument("--load-generator", choices=("ours", "vllm-bench"), default="ours",
                   help="who sends and times the requests: our loop (default) or `vllm bench serve`, whose "
                        "--save-result JSON then gives the figures (needs --tokenizer; vllm from --vllm)")
    p.add_argument("--vllm", metavar="PATH", help="the vllm executable for --load-generator vllm-bench "
                   "(default: vllm on PATH)")
    p.add_argument("--ab", metavar="OTHER.json", help="a previous run (baseline A) to compare this run (B) with")
    p.add_argument("--methods", metavar="off,mtp,dflash2", help="compare speculative methods on one host in one run: "
                   "deploy --host with each (qwen27b_speculative), bench it, then deploy it as --inventory says")
    p.add_argument("--inventory", help="the pyinfra inventory for --methods")
    p.add_argument("--host", help="the one host of --inventory that --methods re-deploys and benches")
    p.add_argument("--deploy-file", default="deploy.py", help="the deploy file for --methods (default deploy.py)")
    p.add_argument("--reports", type=Path, default=reports_dir(),
                   help="where the deploy writes its run reports (default $QWEN27B_REPORTS or ./reports)")
    return p


def check_methods_args(args) -> list[str]:
    """--methods' arguments, refused before any host is touched."""
    methods = M.parse_methods(args.methods)
    missing = [f"--{k}" for k in ("inventory", "host") if not getattr(args, k)]
    if missing:
        raise BenchError(f"--methods needs {' and '.join(missing)}: the host it re-deploys with each method")
    if args.load or args.ab:
        raise BenchError("--methods measures a live host: it takes neither --load nor --ab (its baseline is off)")
    if args.api_key_file:
        raise BenchError("--methods reads the API key file the deploy gives the host (its qwen27b_api_key_file, "
                         "else the lab key): drop --api-key-file")
    return methods


def main_methods(args) -> int:
    methods = check_methods_args(args)
    data, address = M.host_data(args.inventory, args.host)
    args.api_key_file = M.api_key_file(data, args.inventory)
    deploy = M.pyinfra_deploy(args.inventory, args.host, args.deploy_file, args.reports)
    result = M.run_methods(args, methods, deploy, measure, address,
                           say=lambda line: print(line, file=sys.stderr, flush=True))
    paths = M.write_comparison(result, args.out, write_outputs)
    for method, run in result["runs"].items():
        print(f"== {method}")
        print(format_table(run))
        print()
    print(M.format_comparison(result["comparison"], args.host))
    print()
    print("wrote " + ", ".join(str(p) for p in paths))
    comparison = result["comparison"]
    short = {r["method"] for r in comparison["rows"] if not r["measured"] or r.get("errors")}
    return 0 if comparison["restore"]["ok"] and not short else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out = args.out or Path("reports") / "bench" / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    try:
        if args.methods:
            return main_methods(args)
        if bool(args.url) == bool(args.load):
            raise BenchError("give exactly one of --url (measure) or --load RUN.json (re-print a saved run)")
        baseline = load_run(args.ab) if args.ab else None
        run = load_run(args.load) if args.load else measure(args)
        if baseline:
            run["ab"] = ab_compare(baseline, run)
            run["ab"]["baseline_file"] = str(args.ab)
        paths = write_outputs(run, args.out, baseline)
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
