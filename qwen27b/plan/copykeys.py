"""A host's own keys for copies on one machine (qwen27b_instances), cut from hostdata.py (issue 50
item 3) to sit beside their planner, instances.py: names, disjoint GPUs, distinct free ports, key
files. Which of one service, copies or a serving group a host serves is decided in serving.py."""

from __future__ import annotations

import re
from dataclasses import dataclass

from qwen27b.plan.settings import NODE_EXPORTER_PORT, PREFIX, BadHostData, Settings
from qwen27b.plan.urlsecret import check_secret_file


INSTANCES_KEY = PREFIX + "instances"


INSTANCE_NAME = re.compile(r"^[a-z0-9-]{1,16}$")  # the systemd instance (%i), file names, the plan


INSTANCE_FIELDS = {"name", "gpus", "port", "api_key_file"}


# host-wide keys a copy sets for itself: given beside qwen27b_instances they would mean nothing
PER_COPY = ("port", "gpu_indices", "tensor_parallel_size")


@dataclass(frozen=True)
class Instance:
    name: str
    gpus: tuple[int, ...]  # host GPU indices (CUDA_VISIBLE_DEVICES); () on the CPU smoke profile
    port: int
    api_key_file: str | None = None  # None: the host's qwen27b_api_key_file, if any
    count: int = 0  # `gpus: N`: N GPUs the planner picks by their links (instances.py); gpus () until then


def check_instance_keys(host: str, s: Settings, given: set[str]) -> tuple[Instance, ...]:
    """The copies of one host, validated: names, disjoint GPUs, distinct free ports, key files.
    `given`: the keys the host data names (a default port is not a port given)."""
    if s.instances is None:
        return ()
    fix_list = ("e.g. qwen27b_instances = [{'name': 'a', 'gpus': [0, 1, 2, 3], 'port': 8000}, "
                "{'name': 'b', 'gpus': [4, 5, 6, 7], 'port': 8001}] (or 'gpus': 4: the planner picks them by their links)")
    if not s.instances:
        raise BadHostData(host, INSTANCES_KEY, "an empty list serves nothing", f"list the copies, {fix_list}, or leave the key out")
    for name in PER_COPY:
        if name in given:
            raise BadHostData(host, PREFIX + name, "is set per copy when qwen27b_instances is set",
                              "give each copy its port and gpus in qwen27b_instances, and remove this key")
    if "--tensor-parallel-size" in (s.serve_flags or {}):
        raise BadHostData(host, "qwen27b_serve_flags.--tensor-parallel-size", "each copy's TP size is its GPU count",
                          "remove the flag: list the GPUs of each copy in qwen27b_instances")
    if s.node_group is not None:
        raise BadHostData(host, INSTANCES_KEY, "copies on one machine and a serving group over machines are exclusive",
                          "remove qwen27b_node_group or qwen27b_instances")
    cpu = s.profile == "cpu-smoke"
    out: list[Instance] = []
    owner: dict[int, str] = {}
    ports: dict[int, str] = {s.health_port: "qwen27b_health_port (the health endpoint)"}
    if s.node_exporter:
        ports[NODE_EXPORTER_PORT] = "node_exporter (qwen27b_node_exporter)"
    for n, item in enumerate(s.instances):
        where = f"{INSTANCES_KEY}[{n}]"
        if not isinstance(item, dict) or not {"name", "gpus", "port"} <= set(item) or set(item) - INSTANCE_FIELDS:
            raise BadHostData(host, where, f"{item!r} is not a copy (keys name, gpus, port, optional api_key_file)",
                              fix_list)
        name, gpus, port, key_file = item["name"], item["gpus"], item["port"], item.get("api_key_file")
        if not (isinstance(name, str) and INSTANCE_NAME.match(name)):
            raise BadHostData(host, f"{where}.name", f"{name!r} is not a copy name",
                              "use 1-16 lower-case letters, digits and - (it names qwen27b@NAME.service)")
        where = f"{INSTANCES_KEY}['{name}']"
        if any(i.name == name for i in out):
            raise BadHostData(host, f"{where}.name", f"'{name}' names two copies", "give each copy its own name")
        count = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 and not cpu else 0
        if count:
            gpus = []  # how many: the planner picks which by their links
        elif not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
            raise BadHostData(host, f"{where}.gpus", f"{gpus!r} is not a list of GPU indices or a GPU count",
                              "e.g. [0, 1], or 2 (the planner picks the best linked GPUs)")
        if cpu != (not gpus and not count):
            raise BadHostData(host, f"{where}.gpus", "the CPU smoke profile uses no GPU" if cpu else "a copy needs GPUs",
                              "give [] on the CPU smoke profile" if cpu else "list the copy's GPU indices, e.g. [0, 1]")
        for g in gpus:
            if g in owner:
                raise BadHostData(host, f"{where}.gpus", f"GPU {g} is also in copy '{owner[g]}'"
                                  if owner[g] != name else f"GPU {g} is listed twice", "give each GPU to one copy once")
            owner[g] = name
        if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
            raise BadHostData(host, f"{where}.port", f"{port!r} is not an unprivileged TCP port",
                              "use 1024-65535: the copy runs as user qwen27b without capabilities")
        if port in ports:
            raise BadHostData(host, f"{where}.port", f"{port} is also {ports[port]}", "give each copy its own port")
        ports[port] = f"copy '{name}'s port"
        if key_file is not None:
            if not isinstance(key_file, str):
                raise BadHostData(host, f"{where}.api_key_file", f"expected str, got {type(key_file).__name__}",
                                  "the path of a 0600 key file on the controller")
            check_secret_file(host, f"{where}.api_key_file", key_file, "VLLM_API_KEY")
        out.append(Instance(name, tuple(gpus), port, key_file, count))
    return tuple(out)


def instances_of(s: Settings) -> tuple[Instance, ...]:
    """The copies of validated settings (settings_for ran check_instance_keys on them)."""
    return tuple(Instance(i["name"], (), i["port"], i.get("api_key_file"), i["gpus"]) if isinstance(i["gpus"], int)
                 else Instance(i["name"], tuple(i["gpus"]), i["port"], i.get("api_key_file")) for i in s.instances or ())
