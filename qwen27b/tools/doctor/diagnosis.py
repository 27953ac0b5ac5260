"""The chain in the seed's order: a pure function of a snapshot and the stack file."""

from __future__ import annotations

from qwen27b.plan.stack import load_stack

from .context import Ctx, guarded, unjudged
from .diagnose_environment import step3
from .diagnose_inputs import step2
from .diagnose_limits import step5
from .diagnose_parameters import step4
from .diagnose_symptom import chat_page_check, step1
from .gateway import report as gateway_report
from .model import STEPS, HostSnapshot, Report


def diagnose(snap: HostSnapshot, stack: dict | None = None) -> Report:
    """The whole chain for one host: a pure function of the snapshot (and the stack file). A step
    (or the parse every step reads) that meets input it was not written for gives a verdict for that
    step, never a traceback: one odd host must not end the report for the fleet. A host serving
    copies (qwen27b_instances) is judged copy by copy: the chain on each copy's unit, journal, flags,
    GPUs, /health and /metrics, a report each under its name (`Report.copies`, HOST/NAME)."""
    stack = stack or load_stack()
    if snap.gateway:  # no service, model or venv there: its nginx, pool, usage counters and chat page
        return gateway_report(snap)
    names = [] if snap.error else snap.copy_names()
    if names:
        return Report(snap.host, [], copies={name: _chain(snap.for_copy(name), stack) for name in names})
    return _chain(snap, stack)


def _chain(snap: HostSnapshot, stack: dict) -> Report:
    host = f"{snap.host}/{snap.copy}" if snap.copy else snap.host
    try:
        ctx = Ctx(snap, stack)
    except Exception as error:  # the snapshot could not be read into facts at all
        return Report(host, [unjudged(1, "snapshot", error)], {}, unit=snap.unit_name)
    checks = []
    for number, step in enumerate((step1, step2, step3, step4, step5), 1):
        checks += guarded(number, STEPS[number], step, ctx)
        if number == 1 and not snap.copy:
            checks += guarded(1, STEPS[1], chat_page_check, ctx)
    return Report(host, checks, getattr(ctx, "symptom", {}), unit=snap.unit_name)
