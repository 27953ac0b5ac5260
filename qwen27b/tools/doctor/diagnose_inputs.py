"""Step 2, the inputs: the model path, config.json, the weights format against the stack's, the
DFlash2 draft, prompt lengths against --max-model-len."""

from __future__ import annotations

import re

from qwen27b.plan.checkpoint import CheckpointError, shape_from_config
from qwen27b.plan.hostlayout import HostLayout

from .context import Ctx, journal_checks
from .journal import ACCESS_400, PROMPT_TOO_LONG
from .model import FAIL, OK, SKIP, WARN, Check
from .parse import DENSE, metric_sum, weights_format


def _expected_model(ctx: Ctx) -> dict | None:
    return ctx.rs.model if ctx.rs else None


def step2(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(2, "inputs", SKIP, "host not read")]
    m = ctx.model
    at = HostLayout.of(ctx.stack["paths"])
    link = at.current_model
    if ctx.snap.text("model.txt") is None:
        checks.append(Check(2, "model path", SKIP, "not read"))
    elif not m["dir"]:
        known = [r for r in m["revisions"] if f"{at.models}/{r}" != m["link"]]
        fix = "re-run the deploy (the weights role fetches, verifies and switches the symlink)"
        if known:
            fix += f", or point it back: ln -sfn {at.models}/{known[-1]} {link}"
        checks.append(Check(2, "model path", FAIL, f"{link} -> {m['link'] or '(no symlink)'}: "
                            f"{'missing' if m['link'] else 'does not exist'}", fix))
    else:
        target = m["resolved"] or m["link"]
        expected = _expected_model(ctx)
        note = ""
        if expected and target and not target.rstrip("/").endswith(f"{expected['id'].replace('/', '--')}@{expected['revision']}"):
            note = f" (the stack expects {expected['id']}@{expected['revision']})"
        verdict = WARN if note else OK
        checks.append(Check(2, "model path", verdict, f"{link} -> {target}{note}",
                            "re-run the deploy to switch to the stack's revision" if note else ""))
    # config.json
    if m["dir"] is False:
        checks.append(Check(2, "config.json", SKIP, "no model directory"))
    elif ctx.snap.text("model-config.json") is None and m["config"] is None:
        checks.append(Check(2, "config.json", SKIP, "not read"))
    elif m["config"] is False or ctx.snap.ok_text("model-config.json") is None:
        checks.append(Check(2, "config.json", FAIL, f"{link}/config.json is missing",
                            "re-run the deploy: the weights role verifies every file against the manifest and re-fetches"))
    elif ctx.config is None:
        checks.append(Check(2, "config.json", FAIL, f"{link}/config.json is not valid JSON: {ctx.config_error}",
                            "re-run the deploy (files are sha256-verified and re-fetched), or restore the file "
                            "from the mirror / hub at the pinned revision"))
    else:
        try:
            shape = shape_from_config(ctx.config, sum(m["files"].values()))
            checks.append(Check(2, "config.json", OK, f"{shape.architecture}, {shape.num_layers} layers, "
                                f"max_position_embeddings {shape.max_position_embeddings}"))
        except CheckpointError as error:
            checks.append(Check(2, "config.json", FAIL, str(error), "restore the checkpoint's config.json"))
    # weights format
    found = weights_format(ctx.config, ctx.hf_quant)
    expected = _expected_model(ctx)
    weights = {n: s for n, s in m["files"].items() if n.endswith((".safetensors", ".bin", ".pt"))}
    if found is None:
        checks.append(Check(2, "weights format", SKIP, "config.json not readable"))
    elif m["dir"] and ctx.snap.text("model.txt") is not None and not weights:
        checks.append(Check(2, "weights format", FAIL, f"{found} declared, but no weight files (*.safetensors) in {link}",
                            "re-run the deploy to fetch the weights"))
    else:
        loaded = ""
        for run in reversed(ctx.runs):
            for line in run.lines:
                q = re.search(r"Initializing a V1 LLM engine .*?quantization=(\w+)", line.msg)
                if q:
                    loaded = f"; vLLM loaded it with quantization={q[1]}"
                    break
            if loaded:
                break
        size = f", {sum(weights.values()) / 2**30:.2f} GiB in {len(weights)} file(s)" if weights else ""
        want = expected.get("format") if expected else None
        if want is None:
            checks.append(Check(2, "weights format", OK, f"{found}{size}{loaded}"))
        elif found == want or (want in DENSE and found in DENSE):
            checks.append(Check(2, "weights format", OK, f"{found} as the stack expects{size}{loaded}"))
        else:
            checks.append(Check(2, "weights format", FAIL,
                                f"the checkpoint is {found}, the stack expects {want} ({expected['id']}){size}{loaded}: "
                                "memory plan and speed-ups assume the expected format",
                                f"serve the stack's {want} checkpoint (re-run the deploy), or set the model in "
                                "qwen27b_stack_overrides to what you mean to serve so the planner sizes it"))
    # the DFlash2 draft
    if "--speculative-config" in ctx.flags and '"model"' in str(ctx.flags["--speculative-config"]):  # MTP has none
        if ctx.draft_config is None:
            checks.append(Check(2, "draft", FAIL, f"--speculative-config is set but {at.draft_link}/config.json is missing",
                                "re-run the deploy (dflash role) or set qwen27b_speculative=False"))
        else:
            dq = weights_format(ctx.draft_config, None)
            if dq not in DENSE:
                checks.append(Check(2, "draft", FAIL, f"the DFlash2 draft is {dq}: quantized drafts drop acceptance to ~0",
                                    "use the fp16/bf16 draft checkpoint"))
            else:
                checks.append(Check(2, "draft", OK, f"{dq} draft at {at.draft_link}"))
    # prompt lengths vs --max-model-len
    max_len = ctx.flags.get("--max-model-len")
    lines = ctx.view.lines  # the current invocation's (and its automatic restarts')
    too_long = [line.msg for line in lines if PROMPT_TOO_LONG.search(line.msg)]
    rejected = sum(1 for line in lines if ACCESS_400.search(line.msg))
    largest = _largest_prompt(ctx.metrics)
    if too_long:
        checks.append(Check(2, "prompt length", WARN, f"{len(too_long)} request(s) longer than --max-model-len "
                            f"{max_len}: {too_long[-1][:200]}",
                            "shorten prompts (client side), or raise --max-model-len where step 4 shows KV room"))
    elif not ctx.serving and not ctx.metrics:
        checks.append(Check(2, "prompt length", SKIP, "the service is not serving"))
    else:
        seen = f"largest prompt seen <= {largest:g} tokens" if largest is not None else "no finished requests in /metrics"
        extra = f"; {rejected} request(s) answered 400 in the journal window" if rejected else ""
        verdict = OK
        if largest is not None and max_len and max_len.isdigit() and largest >= 0.9 * int(max_len) and largest != float("inf"):
            verdict = WARN
        checks.append(Check(2, "prompt length", verdict, f"--max-model-len {max_len}; {seen}{extra}",
                            "" if verdict == OK else "prompts reach --max-model-len: raise it where step 4 shows KV room"))
    return checks + journal_checks(ctx, 2)


def _largest_prompt(metrics: dict) -> float | None:
    rows = metrics.get("vllm:request_prompt_tokens_bucket") or []
    total = metric_sum(metrics, "vllm:request_prompt_tokens_count")
    if not rows or not total:
        return None
    buckets: dict[float, float] = {}
    for labels, value in rows:
        le = labels.get("le")
        if le is None:
            continue
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0) + value
    for bound in sorted(buckets):
        if buckets[bound] >= total:
            return bound
    return None
