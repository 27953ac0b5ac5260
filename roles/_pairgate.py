"""The regression gate's "before" (issue 58): an operation of the service role, right before it restarts
the unit, measures the serving release (qwen27b/controller/pairmeasure.py); verify measures the new one
after it and judges the pair."""

from __future__ import annotations

from pyinfra.operations import python

from qwen27b.controller import pairmeasure
from qwen27b.plan.gate import Decision

from ._common import api_key, note, running_record


def measure_before_switch(decision: Decision) -> None:
    """The rollout gate's "before": the serving release measured right before its restart, on the stack's
    prompt set (controller/pairmeasure.py); verify measures the new one after it and judges the pair."""
    limits, running = decision.stack.profile["serve"].get("regression"), running_record(decision.stack.paths)
    if not limits or running is None or not running.url or not running.served_name:
        return
    note(f"regression gate: the serving release ({running.model_ref or 'as recorded'}) is measured on the stack's "
         f"{len(limits['prompts'])} prompt(s) right before the restart and this one right after, and the pair judged "
         f"when the host's load beside the two was alike (serve.regression.load), else the new one measured again, "
         f"{limits['pairs']} tries in all, then not judged; the figures stored at its deploy are history only")
    python.call(name="verify: the serving release measured before the switch (the regression gate's before; a check)",
                function=_before_switch, decision=decision, url=running.url, served_name=running.served_name,
                limits=limits)


def _before_switch(state, host, decision: Decision, url: str, served_name: str, limits: dict) -> bool:
    # the key is read when the operation runs, never an operation argument (pyinfra may print those)
    return pairmeasure.before_switch(state, host, url, served_name, api_key(decision), limits)
