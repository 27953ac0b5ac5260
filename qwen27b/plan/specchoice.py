"""The speculation choice and the dropped-draft fallback (issue 50 item 3, cut from gate.py): the
speculative method and depth (plan/engine.py) at the TP size and length the planner starts from,
the agent parsers, and the serve plan with the next method where auto's DFlash2 draft does not fit
(issue 49); each engine refusal becomes the gate's RefusedHost."""

from __future__ import annotations

from dataclasses import replace

from qwen27b.plan import engine
from qwen27b.plan.checkpoint import ModelShape
from qwen27b.plan.gatetypes import RefusedHost
from qwen27b.plan.settings import Settings
from qwen27b.plan.planner import GiB, Gpu, PlanRefused, ServeInputs, ServePlan, choose_tp, plan_serve
from qwen27b.plan.stack import ResolvedStack


def _starting_point(rs: ResolvedStack, gpus: list[Gpu], target: ModelShape, pinned_tp, pins: dict) -> tuple[int, int]:
    """The TP size and --max-model-len the planner starts from (pins first): what a method is chosen at."""
    try:
        tp = choose_tp(gpus, target, pinned_tp or (int(pins["--tensor-parallel-size"])
                       if "--tensor-parallel-size" in pins else None))[0] if gpus else 1
    except PlanRefused:
        tp = len(gpus)  # _check_tp names the problem
    return tp, int(pins.get("--max-model-len") or rs.profile["serve"]["max_model_len"])


def _speculation(host: str, rs: ResolvedStack, gpus: list[Gpu], target: ModelShape, settings: Settings):
    """The speculative method and depth (plan/engine.py) at the TP size and length the planner starts from."""
    tp, max_len = _starting_point(rs, gpus, target, settings.tensor_parallel_size, settings.serve_flags or {})
    try:
        return engine.choose_speculative(rs, target, settings.speculative_mode, tp, max_len)
    except engine.SpecRefused as refused:
        raise RefusedHost(host, refused.cause, refused.fix) from None


def _plan_or_drop_draft(inp: ServeInputs, settings: Settings) -> ServePlan:
    """The plan; where auto chose DFlash2 and its draft does not fit (1Cat loads it whole on every
    card: 2x V100-16GB), the plan with the next method of the profile's list, saying why (issue 49)."""
    try:
        return plan_serve(inp)
    except PlanRefused as refused:
        if not (inp.draft is not None and inp.spec.method == "dflash2" and settings.speculative_mode == "auto"):
            raise
        whole = " whole on every card" if inp.stack.build.get("draft_on_every_card") else ""
        why = (f"the DFlash2 draft ({inp.draft.weight_bytes / GiB:.2f} GiB{whole}"
               f"{' ' + inp.stack.cite(inp.stack.build.get('draft_on_every_card_source')) if whole else ''}) "
               f"does not fit: {refused.cause}")
        tp, max_len = _starting_point(inp.stack, inp.gpus, inp.target, None, inp.pins)
        spec = engine.next_method(inp.stack, inp.target, ["dflash2"], tp, max_len, why)
        return plan_serve(replace(inp, draft=None, draft_path=None, spec=spec, speculative=spec.on))


def _agent_parsers(host: str, rs: ResolvedStack, settings: Settings) -> engine.AgentParsers:
    """Reasoning and tool-call parsers (plan/engine.py) for qwen27b_agent_parsers."""
    try:
        return engine.agent_parsers(rs, settings.agent_parsers)
    except engine.AgentRefused as refused:
        raise RefusedHost(host, refused.cause, refused.fix) from None
