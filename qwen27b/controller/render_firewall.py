"""The firewall's nftables rule and its unit, from the plan: vLLM's port (each copy's), a serving
group's ports, the health endpoint's and node_exporter's. Cut from controller/render.py (issue 50).
"""

from __future__ import annotations

from qwen27b.controller.render_copies import instance_unit
from qwen27b.controller.render_group import group_rules
from qwen27b.controller.unitwords import nft_networks
from qwen27b.onhost.contract import FIREWALL_UNIT, HEALTH_HTTP_SOCKET, RAY_UNIT, SERVICE_UNIT
from qwen27b.plan.gate import Decision
from qwen27b.plan.settings import NODE_EXPORTER_PORT, NODE_EXPORTER_UNIT


def firewall_contexts(decision: Decision) -> dict[str, dict]:
    """The nftables rule and its unit ({} when there is nothing to guard): with qwen27b_firewall_allow,
    vLLM's port to those networks; with it or qwen27b_node_exporter, the health endpoint's port and
    node_exporter's (which has no allow-list of its own) to qwen27b_metrics_allow. The host itself
    (loopback) always gets through."""
    s = decision.settings
    rules = []
    serving = [(copy.serve.value("--port"), instance_unit(i.name)) for i, copy in decision.copies] \
        or [(decision.serve.value("--port"), SERVICE_UNIT)]
    if s.firewall_allow:
        rules += [{"port": port, "what": f"{unit} (vLLM's API)", "allowed": nft_networks(s.firewall_allow)}
                  for port, unit in serving]
    if decision.group is not None:
        rules += group_rules(decision)
    if rules or s.node_exporter:
        rules.append({"port": s.health_port, "what": f"{HEALTH_HTTP_SOCKET} (the health endpoint)",
                      "allowed": nft_networks(s.metrics_allow)})
    if s.node_exporter:
        rules.append({"port": NODE_EXPORTER_PORT, "what": f"{NODE_EXPORTER_UNIT} (node_exporter)",
                      "allowed": nft_networks(s.metrics_allow)})
    if not rules:
        return {}
    context = {
        "rules": rules,
        "ports": ", ".join(str(rule["port"]) for rule in rules),
        # a socket unit cannot be ordered after it (sockets come before basic.target, which it is after):
        # the socket's own IPAddressAllow= guards the health port from the start
        # Before= and, once enabled, RequiredBy= (a .requires/ link beside each guarded unit): they fail
        # closed (a rule file that does not load at boot leaves them stopped, not open to all), and
        # adding or removing the firewall leaves their own unit files, so a running vLLM, alone
        "guards": [unit for _, unit in serving] + ([RAY_UNIT] if decision.group is not None else [])
        + ([NODE_EXPORTER_UNIT] if s.node_exporter else []),
        # NCCL's ephemeral ports are closed to everyone but the members: replies to this host's own
        # connections (apt, pip, the hub) land on such ports too, so they pass first
        "established": ["ct state established,related accept"] if decision.group is not None else [],
        "firewall_unit": FIREWALL_UNIT,
        "rules_file": decision.stack.layout.firewall_rules,
    }
    return {"qwen27b-firewall.nft.j2": context, "qwen27b-firewall.service.j2": context}
