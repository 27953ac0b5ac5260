"""The 4x V100 box's two TP-2 copies (qwen27b_instances) decided on its recording."""

from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.serving import decide
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

STACK = load_stack()
TWO = [{"name": "a", "gpus": [0, 1], "port": 8000}, {"name": "b", "gpus": [2, 3], "port": 8001}]


def copies(host="v100x4-2204-fresh", instances=TWO, **data):
    return decide(host, recorded_facts(host), STACK, settings_for(host, {"qwen27b_instances": instances, **data}),
                  bind_address="10.0.0.7")
