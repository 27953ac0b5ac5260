"""The chain in the seed's order: a pure function of a snapshot and the stack file."""

from __future__ import annotations

from qwen27b.plan.stack import load_stack

from .context import Ctx
from .diagnose_environment import step3
from .diagnose_inputs import step2
from .diagnose_limits import step5
from .diagnose_parameters import step4
from .diagnose_symptom import step1
from .model import HostSnapshot, Report


def diagnose(snap: HostSnapshot, stack: dict | None = None) -> Report:
    """The whole chain for one host: a pure function of the snapshot (and the stack file)."""
    stack = stack or load_stack()
    ctx = Ctx(snap, stack)
    checks = step1(ctx)
    for step in (step2, step3, step4, step5):
        checks += step(ctx)
    return Report(snap.host, checks, ctx.symptom)
