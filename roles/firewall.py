"""Firewall (optional): with qwen27b_firewall_allow set, an nftables table lets only those networks
(and the host itself) reach the service port; everyone else gets a TCP reset. With it, or with
qwen27b_node_exporter, the same table lets only qwen27b_metrics_allow (and the host) reach the health
endpoint's port and node_exporter's. Its own table and a oneshot unit ordered before the service, so
it does not fight ufw or other rules. Unsetting both keys removes the table and the unit again.

The guarded units need the firewall (fail closed at boot) through the firewall unit's own
`RequiredBy=`/`Before=`: enabling it links it into each one's `.requires/`, so adding or removing
the firewall never changes the service's unit file, and a serving vLLM keeps running.
"""

from __future__ import annotations

from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.plan.gate import Decision
from qwen27b.plan.addresses import open_to_all

from ._common import note
from ._firewall import REMOVE_COMMANDS, apply_firewall, load_commands  # noqa: F401 (their tests import them here)


def firewall(decision: Decision) -> None:
    for warning in open_to_all(decision.settings):
        note(warning, always=True)
    apply_firewall(firewall_contexts(decision))
