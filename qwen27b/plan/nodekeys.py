"""A serving group member's own keys (qwen27b_node_*), cut from hostdata.py (issue 50 item 3) to sit
beside their planner, multinode.py: named only with a group, each of its form; what the members
share is checked across hosts in inventory.py."""

from __future__ import annotations

import re

from qwen27b.plan.addresses import lab_address
from qwen27b.plan.settings import PREFIX, BadHostData, Settings


NODE_GROUP = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # a unit Description and the plan; no spaces


NODE_ROLES = ("head", "worker")


# a Linux interface name (IFNAMSIZ 16 with the NUL): NCCL_SOCKET_IFNAME= and GLOO_SOCKET_IFNAME= in the env file
NODE_INTERFACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")


NODE_KEYS = ("node_role", "node_address", "node_interface", "interconnect_gbps")


# flags the group plan sets itself (qwen27b/plan/multinode.py)
GROUP_FLAGS = ("--pipeline-parallel-size", "--distributed-executor-backend", "--data-parallel-size")


def check_node_keys(host: str, s: Settings) -> None:
    """One member's own node keys: named only with a group, each of its form."""
    if s.node_group is None:
        given = [PREFIX + k for k in NODE_KEYS if getattr(s, k) is not None]
        if given:
            raise BadHostData(host, given[0], "is only read for a member of a serving group",
                              "set qwen27b_node_group (the same name on every member), or remove it")
        return
    if not NODE_GROUP.match(s.node_group):
        raise BadHostData(host, "qwen27b_node_group", f"{s.node_group!r} is not a group name",
                          "use lower-case letters, digits and - (up to 32), e.g. 'pair-a'")
    if s.node_role not in NODE_ROLES:
        raise BadHostData(host, "qwen27b_node_role", f"{s.node_role!r} is not a node role" if s.node_role else
                          "a member of a serving group needs a role", "set 'head' on one member (it runs the API and "
                          "the Ray head) and 'worker' on the others")
    if s.node_interface is None or not NODE_INTERFACE.match(s.node_interface):
        raise BadHostData(host, "qwen27b_node_interface", f"{s.node_interface!r} is not an interface name"
                          if s.node_interface else "a member of a serving group needs the interface of the link",
                          "name the NIC that links the members (`ip -br addr`), e.g. 'enp65s0f0'")
    if s.interconnect_gbps is None or isinstance(s.interconnect_gbps, bool) or not s.interconnect_gbps > 0:
        raise BadHostData(host, "qwen27b_interconnect_gbps", "a member of a serving group needs the link's speed"
                          if s.interconnect_gbps is None else f"{s.interconnect_gbps!r} is not a speed",
                          "give the slowest hop between the members in Gbit/s, e.g. 10 for 10 GbE, 25 for 25 GbE: the "
                          "planner checks it carries the pipeline's traffic")
    for flag in GROUP_FLAGS:
        if flag in (s.serve_flags or {}):
            raise BadHostData(host, f"qwen27b_serve_flags.{flag}", f"{flag} is set by the serving group's plan",
                              "remove it: the planner sets PP to the number of members and the Ray backend")


def node_address(settings: Settings, data: dict) -> str | None:
    """A member's address on the link: qwen27b_node_address, else its ssh_hostname when an IP."""
    return settings.node_address or lab_address(data)
