"""One measured run against a live endpoint: server checks, prompts, warm-up, each level, warnings."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

from qwen27b.onhost.secretfile import SecretFileError, load_secret
from qwen27b.tools.bench import vllmbench
from qwen27b.tools.bench.common import SCHEMA, BenchError
from qwen27b.tools.bench.loadgen import request_body, run_level
from qwen27b.tools.bench.matrix import request_figures, summarize_level, token_check
from qwen27b.tools.bench.metrics import metric_deltas, scrape, spec_exported
from qwen27b.tools.bench.physics import ceilings, resolve_physics
from qwen27b.tools.bench.prompts import TokenCounter, filler_words, fit_prompt


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def read_key_file(path: str | None) -> str | None:
    """The API key, read as deploy and qwen27b-health read it (qwen27b.onhost.secretfile)."""
    if not path:
        return None
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



def measure(args) -> dict:
    import httpx
    from qwen27b.plan.stack import load_stack
    base = args.url.rstrip("/")
    key = read_key_file(args.api_key_file)
    headers = auth_headers(key)
    stack = load_stack()
    vllm_exe = vllm_ver = None
    if getattr(args, "load_generator", "ours") == "vllm-bench":
        if not args.tokenizer:
            raise BenchError("--load-generator vllm-bench needs --tokenizer DIR: vllm bench serve loads it")
        vllm_exe = vllmbench.find_vllm(getattr(args, "vllm", None))
        vllm_ver = vllmbench.vllm_version(vllm_exe)
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
        # vllm bench makes its own prompts: one of ours measures the chat template's tokens
        per_level = [1 if vllm_exe else n for _, n in levels_spec]
        total = args.warmup + sum(per_level)
        _say(f"building {total} prompts of exactly {args.prompt_tokens} tokens ({counter_fn.name})")
        t0 = time.monotonic()
        warm_prompts = [prompt() for _ in range(args.warmup)]
        level_prompts = [[prompt() for _ in range(n)] for n in per_level]
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
        if vllm_exe:  # vllm's random dataset counts before the template: ask it for what is left
            raw_counter = TokenCounter("completions", model, client, base, headers, args.tokenizer)
            input_len = args.prompt_tokens - vllmbench.template_tokens(args.api, counter_fn, raw_counter,
                                                                       level_prompts[0][0])
            result_dir = Path(args.out or tempfile.mkdtemp(prefix="qwen27b-bench-")) / "vllm-bench"
        levels, raw = [], []
        for (conc, n), texts in zip(levels_spec, level_prompts):
            _say(f"concurrency {conc}: {n} requests")
            before = scrape(client, base)
            if vllm_exe:
                saved = vllmbench.run_level(vllm_exe, args, base, model, key, input_len, n, conc, seed + conc,
                                            result_dir)
                results, wall = vllmbench.request_records(saved), saved["duration"]
            else:
                results, wall = asyncio.run(run_level(base, args.api, bodies(texts), conc, headers, args.timeout))
            after = scrape(client, base)
            deltas = metric_deltas(before, after) if before and after else None
            level = summarize_level(conc, results, wall, deltas, ceil, args.prompt_tokens, args.output_tokens)
            levels.append(vllmbench.apply_saved(level, saved, ceil) if vllm_exe else level)
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
        "load_generator": {"name": "vllm-bench" if vllm_exe else "ours", "vllm": vllm_exe, "vllm_version": vllm_ver,
                           "mapping_checked_against": vllmbench.VLLM_CHECKED if vllm_exe else None},
    }
    if vllm_exe and vllmbench.version_warning(vllm_ver):
        warnings.append(vllmbench.version_warning(vllm_ver))
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
