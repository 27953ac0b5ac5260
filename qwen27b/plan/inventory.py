"""The checks across hosts, run once over the whole inventory before any host is touched: ports and
paths that entries on one machine would share, the gateways' backends (gateway.plan_gateways), and
what the members of a serving group must share. One host's own data is hostdata.py's.
"""

from __future__ import annotations

from qwen27b.plan.gateway import gateway_needs, plan_gateways
from qwen27b.plan.hostdata import PREFIX, BadHostData, Settings, settings_for
from qwen27b.plan.nodekeys import node_address
from qwen27b.plan.stack import load_stack

# what every member must share: one model served by one engine over all of them ("matching stack")
GROUP_SHARED = ("profile", "stack_overrides", "serve_flags", "tensor_parallel_size", "speculative", "model", "prefix_caching",
                "wheelhouse_dir", "wheel_mirror", "node_interface")


def validate_inventory(hosts: list[tuple[str, dict]], groups: dict[str, set] | None = None) -> dict[str, Settings]:
    """Check every host's data and what hosts share (ports on one machine, the gateways' backends)
    before any is touched. `groups`: host name -> its inventory groups (the gateway group). A
    backend's settings come back with what its gateway needs added (gateway.gateway_needs)."""
    settings = {name: settings_for(name, data) for name, data in hosts}
    # a backend's allow-lists get its gateway's address where they lack it (the gateway's plan says so)
    settings = gateway_needs(plan_gateways(hosts, groups or {}, settings), settings)
    seen: dict[tuple[str, int], str] = {}
    machines: dict[tuple[str, object], str] = {}
    for name, data in hosts:
        machine = str(data.get("ssh_hostname") or name).lower()
        key = (machine, settings[name].port)
        if key in seen:
            raise BadHostData(name, "qwen27b_port",
                              f"port {key[1]} is already used by host entry '{seen[key]}' on the same machine {machine}",
                              "give each entry on one machine its own port")
        # one qwen27b.service, /opt/qwen27b and /etc/qwen27b per machine: a second entry reaching the same
        # sshd would overwrite the first one's unit, env file and symlinks
        sshd = (machine, data.get("ssh_port") or 22)
        other = machines.get(sshd)
        if other is not None:
            raise BadHostData(name, "ssh_hostname", f"host entry '{other}' already deploys qwen27b to the same machine "
                              f"{machine} (one service, one set of paths per machine)",
                              "keep one entry per machine (list its GPUs with qwen27b_gpu_indices)")
        seen[key] = name
        machines[sshd] = name
    check_groups(hosts, settings)
    return settings


def check_listed_once(groups: dict) -> None:
    """The inventory file's groups as written (name -> hosts or (hosts, data); a host is a name or
    (name, data)): pyinfra keeps one host per name and merges the data of every entry under it, the
    later winning, so a name listed twice in a group, or in two groups with different values of one
    key, lost an entry's data without a word. An inventory that lists no host is refused too (the
    deploy printed nothing and exited 0)."""
    values: dict[str, dict] = {}  # host -> key -> (group, value)
    listed = False
    for group, members in groups.items():
        members = members[0] if isinstance(members, tuple) else members
        seen = set()
        for entry in members or []:
            name, data = entry if isinstance(entry, tuple) else (entry, {})
            listed = True
            if name in seen:
                raise BadHostData(name, "inventory", f"listed twice in group '{group}': pyinfra keeps one entry and "
                                  "merges their data (the later wins)", "list each machine once (one entry per machine)")
            seen.add(name)
            for key, value in (data or {}).items():
                first = values.setdefault(name, {}).setdefault(key, (group, value))
                if first[1] != value:
                    raise BadHostData(name, key, f"{value!r} in group '{group}' but {first[1]!r} in group '{first[0]}': "
                                      "pyinfra keeps one of them without a word",
                                      "give the key once (in one group, or in group data)")
    if not listed:
        raise BadHostData("(inventory)", "hosts", "the inventory lists no host: nothing would be deployed",
                          "list the hosts, e.g. lab = [('gpu-1', {'ssh_hostname': '10.0.0.7'})]")


def group_ports(stack: dict) -> list[tuple[str, int, int]]:
    """(what, first, last) of every port a member opens to the other members (stack: multinode)."""
    m = stack["multinode"]
    ports = [(f"Ray {name.replace('_', ' ')}", port, port) for name, port in m["ray_ports"].items()]
    ports.append(("Ray workers", m["ray_worker_ports"]["min"], m["ray_worker_ports"]["max"]))
    first = m["vllm_port"]["first"]
    ports.append(("vLLM rendezvous (VLLM_PORT)", first, first + m["vllm_port"]["count"] - 1))
    ports.append(("NCCL and Gloo (ephemeral)", m["ephemeral_ports"]["min"], m["ephemeral_ports"]["max"]))
    return ports


def check_groups(hosts: list[tuple[str, dict]], settings: dict[str, Settings]) -> None:
    """What members share: one head, two or more members, distinct addresses, the same stack, serving
    settings and interface name (vLLM copies the head's NCCL_* to every Ray worker), ports clear of Ray's."""
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
