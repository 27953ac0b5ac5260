"""Inventory data of serving groups (multi-node): the `qwen27b_node_*` keys of one member, and what
the members of a group must share, checked with the rest of the host data before any host is touched.
The planner's side (GPUs, memory, the link) is qwen27b/plan/multinode.py.
"""

from __future__ import annotations

import re

from qwen27b.plan.hostdata import PREFIX, BadHostData, Settings, lab_address

NODE_GROUP = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # a unit Description and the plan; no spaces
NODE_ROLES = ("head", "worker")
# a Linux interface name (IFNAMSIZ 16 with the NUL): NCCL_SOCKET_IFNAME= and GLOO_SOCKET_IFNAME= in the env file
NODE_INTERFACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
NODE_KEYS = ("node_role", "node_address", "node_interface", "interconnect_gbps")
# what every member must share: one model served by one engine over all of them ("matching stack")
GROUP_SHARED = ("profile", "stack_overrides", "serve_flags", "tensor_parallel_size", "speculative", "model", "prefix_caching",
                "wheelhouse_dir", "wheel_mirror", "node_interface")
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


def group_ports(stack: dict) -> list[tuple[str, int, int]]:
    """(what, first, last) of every port a member opens to the other members (stack: multinode)."""
    m = stack["multinode"]
    ports = [(f"Ray {name.replace('_', ' ')}", port, port) for name, port in m["ray_ports"].items()]
    ports.append(("Ray workers", m["ray_worker_ports"]["min"], m["ray_worker_ports"]["max"]))
    first = m["vllm_port"]["first"]
    ports.append(("vLLM rendezvous (VLLM_PORT)", first, first + m["vllm_port"]["count"] - 1))
    ports.append(("NCCL and Gloo (ephemeral)", m["ephemeral_ports"]["min"], m["ephemeral_ports"]["max"]))
    return ports


def node_address(settings: Settings, data: dict) -> str | None:
    """A member's address on the link: qwen27b_node_address, else its ssh_hostname when an IP."""
    return settings.node_address or lab_address(data)


def check_groups(hosts: list[tuple[str, dict]], settings: dict[str, Settings]) -> None:
    """What members share: one head, two or more members, distinct addresses, the same stack, serving
    settings and interface name (vLLM copies the head's NCCL_* to every Ray worker), ports clear of Ray's."""
    from qwen27b.plan.stack import load_stack

    groups: dict[str, list[str]] = {}
    for name, _ in hosts:
        if settings[name].node_group:
            groups.setdefault(settings[name].node_group, []).append(name)
    if not groups:
        return
    data = dict(hosts)
    taken = group_ports(load_stack())
    for group, members in groups.items():
        first = members[0]
        if len(members) < 2:
            raise BadHostData(first, "qwen27b_node_group", f"group '{group}' has one member",
                              "name the group on every host that serves with it (two or more), or remove the key")
        heads = [m for m in members if settings[m].node_role == "head"]
        if len(heads) != 1:
            raise BadHostData(first, "qwen27b_node_role", f"group '{group}' has {len(heads)} heads"
                              + (f" ({', '.join(heads)})" if heads else ""), "set 'head' on exactly one member")
        seen: dict[str, str] = {}
        for member in members:
            address = node_address(settings[member], data[member])
            if address is None:
                raise BadHostData(member, "qwen27b_node_address", "no address on the link between the members "
                                  "(ssh_hostname is not an IP)", "set qwen27b_node_address, e.g. 10.10.0.2")
            if address in seen:
                raise BadHostData(member, "qwen27b_node_address", f"{address} is also {seen[address]}'s address",
                                  "give each member its own address on the link")
            seen[address] = member
            for key in GROUP_SHARED:
                mine, theirs = getattr(settings[member], key), getattr(settings[first], key)
                if mine != theirs:
                    why = (" (vLLM copies the head's NCCL_SOCKET_IFNAME to every Ray worker [vllm-ray-env])"
                           if key == "node_interface" else "")
                    raise BadHostData(member, PREFIX + key, f"{mine!r} differs from {theirs!r} on {first} in group "
                                      f"'{group}': the members run one model as one engine{why}",
                                      "give every member of the group the same value (group data)")
            for key, port in (("qwen27b_port", settings[member].port), ("qwen27b_health_port", settings[member].health_port)):
                for what, low, high in taken:
                    if low <= port <= high:
                        raise BadHostData(member, key, f"{port} is in the serving group's {what} ports {low}-{high}",
                                          "pick a port outside them (default 8000 / 9120)")
