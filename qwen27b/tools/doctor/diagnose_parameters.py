"""Step 4, the parameters: the running `vllm serve` flags against today's plan, whether the
running sizes fit at all (the planner with them pinned), KV cache usage and preemptions."""

from __future__ import annotations

from qwen27b.onhost.route_auth import DENIED_ERROR
from qwen27b.plan.checkpoint import CheckpointError, load_shape, shape_from_config
from qwen27b.plan.planner import PlanRefused, ServeInputs, plan_serve
from qwen27b.plan.stack import checkpoint_metadata_dir

from .context import Ctx, journal_checks
from .model import FAIL, OK, SKIP, WARN, Check
from .parse import metric_sum, running_flags

_PLAN_KNOBS = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
               "--tensor-parallel-size")


def step4(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(4, "parameters", SKIP, "host not read")]
    if ctx.settings_error:
        checks.append(Check(4, "host data", FAIL, ctx.settings_error, "fix the inventory"))
    flags = ctx.flags
    dropins = (ctx.unit.get("DropInPaths") or "").split()
    if not flags:
        checks.append(Check(4, "running flags", SKIP, f"no ExecStart for {ctx.unit_name}"))
    else:
        shown = " ".join(f"{k} {v}" if v is not None else k for k, v in flags.items()
                         if k in ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
                                  "--gpu-memory-utilization", "--tensor-parallel-size", "--port"))
        if ctx.snap.copy:  # a copy's flags and GPUs come from its env file
            shown += f"; GPU(s) {ctx.env.get('CUDA_VISIBLE_DEVICES', '?')} (CUDA_VISIBLE_DEVICES)"
        checks.append(Check(4, "running flags", WARN if dropins else OK,
                            shown + (f"; drop-in(s) override the rendered unit: {', '.join(dropins)}" if dropins else ""),
                            "remove the drop-in and `systemctl daemon-reload`, or move the change into qwen27b_serve_flags"
                            if dropins else ""))
    # the plan now vs the running flags
    if ctx.decision is not None and flags:
        plan = running_flags("argv[]=python -m x " + " ".join(ctx.decision.serve.argv()) + " ; ignore_errors=no")
        diffs = []
        for name in sorted(set(plan) | set(flags)):
            if plan.get(name, "<absent>") != flags.get(name, "<absent>"):
                diffs.append(f"{name}: running {flags.get(name, '<absent>')}, plan {plan.get(name, '<absent>')}")
        checks.append(Check(4, "flags vs plan", WARN if diffs else OK,
                            "; ".join(diffs) if diffs else f"the unit matches today's plan ({len(plan)} flags)",
                            "re-run the deploy to render today's plan (or pin the value in qwen27b_serve_flags)" if diffs else ""))
    elif ctx.refusal is not None:
        checks.append(Check(4, "flags vs plan", FAIL, f"the gate refuses this host now: {ctx.refusal.cause}", ctx.refusal.fix))
    elif ctx.unlisted:
        name = ctx.snap.copy
        checks.append(Check(4, "flags vs plan", WARN, f"copy '{name}' is enabled on the host but the inventory's "
                            "qwen27b_instances does not list it: no plan to compare with",
                            "list it again in qwen27b_instances, or re-run the deploy: it stops and removes a "
                            f"copy the inventory no longer lists ({ctx.unit_name}, qwen27b-health@{name}.timer, its files)"))
    # do the running sizes fit at all? the planner with them pinned, on the checkpoint actually there
    if ctx.decision is not None and flags:
        checks.append(_fit_check(ctx))
    checks += journal_checks(ctx, 4)
    # /metrics: KV cache usage and preemptions
    if not ctx.serving:
        checks.append(Check(4, "KV cache / preemptions", SKIP, "the service is not serving"))
    elif not ctx.metrics and ctx.metrics_text and f'"error": "{DENIED_ERROR}"' in ctx.metrics_text:
        checks.append(Check(4, "KV cache / preemptions", WARN, "/metrics answered 401 (the route guard wants the key)",
                            "run doctor as a user who can read the API key file on the host (ssh as root or "
                            "with qwen27b's sudo), or add the scraping network to qwen27b_metrics_allow"))
    elif not ctx.metrics:
        checks.append(Check(4, "KV cache / preemptions", WARN if ctx.metrics_text is not None else SKIP,
                            "/metrics not readable" if ctx.metrics_text is not None else "/metrics not probed",
                            "check that --port is reachable on the host" if ctx.metrics_text is not None else ""))
    else:
        usage_rows = ctx.metrics.get("vllm:kv_cache_usage_perc") or ctx.metrics.get("vllm:gpu_cache_usage_perc") or []
        usage = max((v for _, v in usage_rows), default=None)
        preempt = metric_sum(ctx.metrics, "vllm:num_preemptions_total")
        if preempt is None:
            preempt = metric_sum(ctx.metrics, "vllm:num_preemptions")
        evidence = (f"KV cache usage {usage:.0%}" if usage is not None else "KV cache usage not exported") + \
                   (f", {preempt:g} preemption(s) since start" if preempt is not None else "")
        bad = (usage is not None and usage >= 0.95) or (preempt or 0) > 0
        checks.append(Check(4, "KV cache / preemptions", WARN if bad else OK, evidence,
                            "the KV cache is too small for the load: lower --max-num-seqs, shorten --max-model-len, "
                            "or add KV room (higher --gpu-memory-utilization, more GPUs)" if bad else ""))
    return checks


def _fit_check(ctx: Ctx) -> Check:
    d, flags = ctx.decision, ctx.flags
    pins = {name: flags[name] for name in _PLAN_KNOBS if flags.get(name) is not None}
    target = None
    if ctx.config is not None:
        try:
            weights = sum(s for n, s in ctx.model["files"].items() if n.endswith(".safetensors"))
            if not weights:
                weights = load_shape(checkpoint_metadata_dir(d.stack.model)).weight_bytes
            target = shape_from_config(ctx.config, weights)
        except CheckpointError:
            target = None
    if target is None:
        try:
            target = load_shape(checkpoint_metadata_dir(d.stack.model))
        except CheckpointError as error:
            return Check(4, "running sizes fit", SKIP, f"no checkpoint shape: {error}")
    draft = None
    if d.draft_path and "--speculative-config" in flags and d.stack.draft:
        try:
            draft = load_shape(checkpoint_metadata_dir(d.stack.draft))
        except CheckpointError:
            draft = None
    s = d.settings
    try:
        plan = plan_serve(ServeInputs(
            stack=d.stack, gpus=d.gpus, target=target, draft=draft, model_path=d.model_path, draft_path=d.draft_path,
            served_name=s.served_model_name or d.stack.model["served_name"], bind_address=flags.get("--host") or "127.0.0.1",
            bind_reason="running", port=int(flags.get("--port") or s.port), speculative=draft is not None,
            prefix_caching=s.prefix_caching, pins=pins,
            ram_bytes=d.facts.memory.get("available_bytes") if d.facts.memory else None))
    except PlanRefused as refused:
        dropins = (ctx.unit.get("DropInPaths") or "").split()
        origin = (f"; the running values come from {', '.join(dropins)}: remove it and `systemctl daemon-reload`" if dropins
                  else "; the running values come from the unit (qwen27b_serve_flags pins, or an edit): re-run the deploy")
        return Check(4, "running sizes fit", FAIL, f"the planner, with the running values pinned: {refused.cause}",
                     refused.fix + origin)
    except (ValueError, TypeError) as error:
        return Check(4, "running sizes fit", FAIL, f"the running flags do not parse: {error}", "fix the unit's flags")
    mem = plan.memory
    return Check(4, "running sizes fit", OK, f"KV room {mem.kv_tokens:,} tokens per "
                 f"{'GPU' if d.gpus else 'host'} >= --max-model-len {plan.value('--max-model-len')}")
