"""Several copies of the model on one machine (`qwen27b_instances`): an 8-GPU box serving two TP-4
copies, each with its own GPUs, port and API key, as `qwen27b@NAME.service`.

The inventory side (checked with the rest of the host data, before any host is touched) and the
planner's side: each copy is the ordinary gate + planner (qwen27b/plan/gate.py, planner.py) run on
the facts restricted to that copy's GPUs, so TP is the copy's GPU count and the memory plan is per
copy; a copy that does not fit refuses the host with that copy's numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from qwen27b.plan.hostdata import NODE_EXPORTER_PORT, PREFIX, BadHostData, Settings, check_secret_file

KEY = PREFIX + "instances"
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


def check_instance_keys(host: str, s: Settings, given: set[str]) -> tuple[Instance, ...]:
    """The copies of one host, validated: names, disjoint GPUs, distinct free ports, key files.
    `given`: the keys the host data names (a default port is not a port given)."""
    if s.instances is None:
        return ()
    fix_list = ("e.g. qwen27b_instances = [{'name': 'a', 'gpus': [0, 1, 2, 3], 'port': 8000}, "
                "{'name': 'b', 'gpus': [4, 5, 6, 7], 'port': 8001}]")
    if not s.instances:
        raise BadHostData(host, KEY, "an empty list serves nothing", f"list the copies, {fix_list}, or leave the key out")
    for name in PER_COPY:
        if name in given:
            raise BadHostData(host, PREFIX + name, "is set per copy when qwen27b_instances is set",
                              "give each copy its port and gpus in qwen27b_instances, and remove this key")
    if "--tensor-parallel-size" in (s.serve_flags or {}):
        raise BadHostData(host, "qwen27b_serve_flags.--tensor-parallel-size", "each copy's TP size is its GPU count",
                          "remove the flag: list the GPUs of each copy in qwen27b_instances")
    if s.node_group is not None:
        raise BadHostData(host, KEY, "copies on one machine and a serving group over machines are exclusive",
                          "remove qwen27b_node_group or qwen27b_instances")
    cpu = s.profile == "cpu-smoke"
    out: list[Instance] = []
    owner: dict[int, str] = {}
    ports: dict[int, str] = {s.health_port: "qwen27b_health_port (the health endpoint)"}
    if s.node_exporter:
        ports[NODE_EXPORTER_PORT] = "node_exporter (qwen27b_node_exporter)"
    for n, item in enumerate(s.instances):
        where = f"{KEY}[{n}]"
        if not isinstance(item, dict) or not {"name", "gpus", "port"} <= set(item) or set(item) - INSTANCE_FIELDS:
            raise BadHostData(host, where, f"{item!r} is not a copy (keys name, gpus, port, optional api_key_file)",
                              fix_list)
        name, gpus, port, key_file = item["name"], item["gpus"], item["port"], item.get("api_key_file")
        if not (isinstance(name, str) and INSTANCE_NAME.match(name)):
            raise BadHostData(host, f"{where}.name", f"{name!r} is not a copy name",
                              "use 1-16 lower-case letters, digits and - (it names qwen27b@NAME.service)")
        where = f"{KEY}['{name}']"
        if any(i.name == name for i in out):
            raise BadHostData(host, f"{where}.name", f"'{name}' names two copies", "give each copy its own name")
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
            raise BadHostData(host, f"{where}.gpus", f"{gpus!r} is not a list of GPU indices", "e.g. [0, 1]")
        if cpu != (not gpus):
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
        out.append(Instance(name, tuple(gpus), port, key_file))
    return tuple(out)


def instances_of(s: Settings) -> tuple[Instance, ...]:
    """The copies of validated settings (hostdata ran check_instance_keys on them)."""
    return tuple(Instance(i["name"], tuple(i["gpus"]), i["port"], i.get("api_key_file")) for i in s.instances or ())


def copy_settings(s: Settings, instance: Instance) -> Settings:
    """The host's settings as one copy sees them: its GPUs, its port, its key (the planner picks TP)."""
    return replace(s, instances=None, gpu_indices=list(instance.gpus) or None, port=instance.port,
                   tensor_parallel_size=None, api_key_file=instance.api_key_file or s.api_key_file)


def decide_copies(host: str, facts, stack: dict, settings: Settings, decide, **kwargs):
    """The host's Decision with one Decision per copy (`copies`, in inventory order): each the whole
    gate and planner on that copy's GPUs. Every copy's refusal is listed, named by the copy. The
    host-level fields (driver, choices, warnings) are the first copy's (the same facts); its `gpus`
    are every copy's, its `serve` the first copy's."""
    from qwen27b.plan.gate import RefusedHost, host_gpus  # noqa: PLC0415 (the gate calls this module)

    copies, refusals = [], []
    instances = instances_of(settings)
    present = [] if settings.profile == "cpu-smoke" else [g.index for g in host_gpus(host, facts, stack)]
    for instance in instances:
        missing = [g for g in instance.gpus if g not in present]
        if missing:
            refusals.append(RefusedHost(host, f"{KEY} '{instance.name}' lists GPU(s) {missing} but the host has "
                                        f"{sorted(present)}", f"list only GPUs the host has in copy '{instance.name}'"))
            continue
        try:
            copy = decide(host, facts, stack, copy_settings(settings, instance), **kwargs)
            spaced = [f.name for f in copy.serve.flags if f.value is not None and any(c.isspace() for c in f.value)]
            if spaced:
                raise RefusedHost(host, f"{', '.join(spaced)} holds a space, but a copy's unit reads its flags from "
                                  "$QWEN27B_SERVE_ARGS in its env file, split at spaces",
                                  "write the value without spaces (JSON needs none)")
            copy.serve.flags[:] = [replace(f, reason=f"qwen27b_instances '{instance.name}'") if f.name == "--port" else f
                                   for f in copy.serve.flags]
            copies.append((instance, copy))
        except RefusedHost as refused:
            named = [(f"copy '{instance.name}' ({len(instance.gpus)} GPU(s) {list(instance.gpus)}): {cause}", fix)
                     for cause, fix in refused.problems]
            refusals.append(RefusedHost(host, named[0][0], named[0][1], named))
    if refusals:
        raise RefusedHost.every(host, refusals)
    first = copies[0][1]
    gpus = sorted((g for _, d in copies for g in d.gpus), key=lambda g: g.index)
    return replace(first, settings=settings, gpus=gpus, copies=tuple(copies))
