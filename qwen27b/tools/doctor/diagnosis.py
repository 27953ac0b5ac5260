"""The chain in the seed's order: a pure function of a snapshot and the stack file."""

from __future__ import annotations

from qwen27b.plan.stack import load_stack

from .context import Ctx, guarded, unjudged
from .diagnose_environment import step3
from .diagnose_inputs import step2
from .diagnose_limits import step5
from .diagnose_parameters import step4
from .diagnose_symptom import step1
from .model import STEPS, HostSnapshot, Report


def diagnose(snap: HostSnapshot, stack: dict | None = None) -> Report:
    """The whole chain for one host: a pure function of the snapshot (and the stack file). A step
    (or the parse every step reads) that meets input it was not written for gives a verdict for that
    step, never a traceback: one odd host must not end the report for the fleet."""
    stack = stack or load_stack()
    try:
        ctx = Ctx(snap, stack)
    except Exception as error:  # the snapshot could not be read into facts at all
        return Report(snap.host, [unjudged(1, "snapshot", error)], {})
    checks = []
    for number, step in enumerate((step1, step2, step3, step4, step5), 1):
        checks += guarded(number, STEPS[number], step, ctx)
    return Report(snap.host, checks, getattr(ctx, "symptom", {}))
