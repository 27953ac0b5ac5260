"""What a host serves, decided in one place: one service (qwen27b.service), copies on the machine
(qwen27b_instances: qwen27b@NAME.service each, instances.py) or one member of a serving group over
machines (qwen27b_node_group: the group is decided together, multinode.decide_group). hostdata
refuses a host that asks for both copies and a group.
"""

from __future__ import annotations

from qwen27b.plan.gate import Decision, HostFacts, decide as decide_one
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.instances import decide_copies

SERVICE, COPIES, GROUP = "service", "copies", "group"


def kind(settings: Settings) -> str:
    """SERVICE, COPIES or GROUP, from validated settings."""
    if settings.instances:
        return COPIES
    return GROUP if settings.node_group else SERVICE


def decide(host: str, facts: HostFacts, stack: dict, settings: Settings, **kwargs) -> Decision:
    """The gate's Decision for one host: one service, or one per copy. Raises RefusedHost. A group
    member alone is one service; its stage is planned with the others' facts (multinode)."""
    if kind(settings) == COPIES:
        return decide_copies(host, facts, stack, settings, decide_one, **kwargs)
    return decide_one(host, facts, stack, settings, **kwargs)
