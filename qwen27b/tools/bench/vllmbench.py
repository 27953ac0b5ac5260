"""`--load-generator vllm-bench`: each level's load and timing by `vllm bench serve`, read from its
``--save-result --save-detailed`` JSON, so the figures are vLLM's own rather than a copy of them.

vllm's ``random`` dataset counts --random-input-len before the chat template, so the input length
asked of it is --prompt-tokens less the template's tokens (measured with our TokenCounter), and
the server's own counts (the saved ``input_lens`` are usage.prompt_tokens) go through our token
check. Its ``custom`` dataset would carry our exact prompts but needs pandas (vllm[bench]), which
a plain vllm install lacks. What vllm bench lacks stays ours: the warm-up, the /metrics deltas,
the ceilings and A/B. The API key reaches vllm through OPENAI_API_KEY (its
``benchmarks/lib/endpoint_request_func._get_headers`` reads it), never argv.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from qwen27b.tools.bench.common import BenchError, ratio

#: The vllm version the field mapping below was checked against (vllm/benchmarks/serve.py).
VLLM_CHECKED = "0.32.0"

#: our --api -> (vllm bench --backend, --endpoint)
BACKENDS = {"chat": ("openai-chat", "/v1/chat/completions"), "completions": ("openai", "/v1/completions")}

#: The one mapping: our level key <- (vllm saved-result key, factor). vllm saves milliseconds.
LEVEL_FIELDS = {
    "wall_s": ("duration", 1.0),
    "ttft_p50_ms": ("median_ttft_ms", 1.0),
    "ttft_p90_ms": ("p90_ttft_ms", 1.0),
    "e2e_p50_s": ("median_e2el_ms", 1e-3),
    "e2e_p90_s": ("p90_e2el_ms", 1e-3),
    "aggregate_output_tok_s": ("output_throughput", 1.0),
    "aggregate_total_tok_s": ("total_token_throughput", 1.0),
}
#: Decode tok/s per request is 1 / TPOT (vllm: (latency - ttft) / (output_len - 1), as ours), so its
#: p50 is 1000 / median TPOT and its p10 is 1000 / p90 TPOT (exact up to the interpolation).
INVERSE_FIELDS = {"decode_tok_s_p50": "median_tpot_ms", "decode_tok_s_p10": "p90_tpot_ms"}
#: vllm's figures our loop has no column for, kept under level["vllm_bench"].
EXTRA_FIELDS = ("p99_ttft_ms", "mean_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                "median_itl_ms", "p99_itl_ms", "p99_e2el_ms", "request_throughput", "completed", "failed",
                "max_concurrent_requests", "max_concurrency", "num_prompts")
#: Per-request arrays of --save-detailed (input_lens/output_lens are the server's usage counts).
DETAILED = ("input_lens", "output_lens", "ttfts", "latencies", "start_times", "errors")


def find_vllm(path: str | None) -> str:
    exe = path or shutil.which("vllm")
    if not exe or not Path(exe).is_file() or not os.access(exe, os.X_OK):
        raise BenchError(f"--load-generator vllm-bench: no vllm executable ({path or 'vllm not on PATH'}); "
                         "give --vllm PATH (a venv's bin/vllm: the controller does not install vLLM)")
    return exe


def vllm_version(exe: str) -> str | None:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if out.returncode == 0 and lines else None


def version_warning(version: str | None) -> str | None:
    def minor(v):
        return ".".join(v.split("+")[0].split(".")[:2])
    if version and minor(version) != minor(VLLM_CHECKED):
        return (f"vllm bench serve {version}: its saved-result fields were checked against {VLLM_CHECKED} "
                "(qwen27b/tools/bench/vllmbench.py LEVEL_FIELDS); check them")
    return None


def template_tokens(api: str, chat_count, raw_count, text: str) -> int:
    """What the chat template adds to a prompt's tokens (0 for completions, whose special tokens
    vllm's random dataset subtracts itself)."""
    return chat_count(text) - raw_count(text) if api == "chat" else 0


def bench_argv(exe: str, api: str, base: str, model: str, tokenizer: str, input_len: int, n: int, conc: int,
               output_tokens: int, temperature: float | None, seed: int, result_dir: Path, filename: str) -> list:
    backend, endpoint = BACKENDS[api]
    argv = [exe, "bench", "serve", "--backend", backend, "--base-url", base, "--endpoint", endpoint,
            "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len",
            str(output_tokens), "--random-range-ratio", "0", "--random-prefix-len", "0", "--ignore-eos",
            "--num-prompts", str(n), "--max-concurrency", str(conc), "--num-warmups", "0", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--disable-tqdm", "--save-result", "--save-detailed",
            "--result-dir", str(result_dir), "--result-filename", filename]
    if temperature is not None:
        argv += ["--temperature", str(temperature)]
    return argv


def bench_env(api_key: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return env


def run_level(exe: str, args, base: str, model: str, api_key: str | None, input_len: int, n: int, conc: int,
              seed: int, result_dir: Path) -> dict:
    """One level (n requests, at most conc in flight) through `vllm bench serve`; returns its saved
    result (the JSON, parsed). Its log stays beside the JSON."""
    result_dir.mkdir(parents=True, exist_ok=True)
    filename = f"vllm-bench-c{conc}.json"
    argv = bench_argv(exe, args.api, base, model, args.tokenizer, input_len, n, conc,
                      args.output_tokens, args.temperature, seed, result_dir, filename)
    limit = args.timeout * math.ceil(n / conc) + 300
    log = result_dir / f"vllm-bench-c{conc}.log"
    with open(log, "wb") as fh:
        try:
            rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=bench_env(api_key),
                                timeout=limit).returncode
        except subprocess.TimeoutExpired:
            raise BenchError(f"vllm bench serve ran past {limit:.0f} s at concurrency {conc}; see {log}") from None
    path = result_dir / filename
    if rc != 0 or not path.exists():
        tail = log.read_text(errors="replace")[-600:]
        raise BenchError(f"vllm bench serve failed (exit {rc}) at concurrency {conc}; {log}:\n{tail}")
    saved = json.loads(path.read_text())
    saved["_file"] = str(path)
    return saved


def request_records(saved: dict) -> list[dict]:
    """The saved per-request arrays as our loop's request records (ok, ttft_s, latency_s, token counts)."""
    missing = [k for k in DETAILED if k not in saved]
    if missing:
        raise BenchError(f"the vllm bench result lacks {missing}: was it saved with --save-detailed?")
    out, t0 = [], min(saved["start_times"], default=0.0)  # vllm saves perf_counter times; ours start at 0
    for pt, ct, ttft, lat, start, err in zip(*(saved[k] for k in DETAILED)):
        start -= t0
        if err:
            out.append({"ok": False, "error": str(err)[:300], "start": start})
        else:
            out.append({"ok": True, "start": start, "end": start + lat, "ttft_s": ttft, "latency_s": lat,
                        "finish_reason": None, "prompt_tokens": pt, "completion_tokens": ct})
    return out


def apply_saved(level: dict, saved: dict, ceil: dict | None) -> dict:
    """Overwrite the level's figures vllm measured with vllm's, through LEVEL_FIELDS; keep the rest
    (prefill tok/s, token counts, /metrics deltas) and put the ceilings' fractions on vllm's figures."""
    for ours, (theirs, factor) in LEVEL_FIELDS.items():
        value = saved.get(theirs)
        level[ours] = None if value is None or not level["ok"] else value * factor
    for ours, theirs in INVERSE_FIELDS.items():
        value = saved.get(theirs)
        level[ours] = 1000.0 / value if value and level["ok"] else None
    level["vllm_bench"] = {k: saved.get(k) for k in EXTRA_FIELDS}
    level["vllm_bench"]["result_file"] = saved.get("_file")
    if ceil:
        level["decode_vs_ceiling"] = ratio(level["decode_tok_s_p50"], ceil.get("decode_tok_s"))
    return level
