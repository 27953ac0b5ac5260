"""The gate on a recorded host's facts (tests/recordings.py): `run` decides, `refused` expects a refusal that
names the host and its fix; shared by the gate's tests and those of what the gate feeds."""

import pytest

from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts


STACK = load_stack()


def run(host, data=None, **replace):
    return decide(host, recorded_facts(host, **replace), STACK, settings_for(host, data or {}))


def refused(host, data=None, **replace) -> RefusedHost:
    with pytest.raises(RefusedHost) as caught:
        run(host, data, **replace)
    assert str(caught.value).startswith(f"{host}: refused: ") and "Fix: " in str(caught.value)
    return caught.value
