"""Several copies of the model on one machine (`qwen27b_instances`): an 8-GPU box serving two TP-4
copies, each with its own GPUs, port and API key, as `qwen27b@NAME.service`.

The planner's side (the copies' own keys are host data, checked by copykeys.check_instance_keys;
serving.py sends a host here): each copy is the ordinary gate + planner (qwen27b/plan/gate.py, planner.py) run on
the facts restricted to that copy's GPUs, so TP is the copy's GPU count and the memory plan is per
copy; a copy that does not fit refuses the host with that copy's numbers.
"""

from __future__ import annotations

from dataclasses import replace

from qwen27b.plan.gate import RefusedHost, host_gpus
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.copykeys import INSTANCES_KEY, Instance, instances_of
from qwen27b.plan.topology import pick_groups


def copy_settings(s: Settings, instance: Instance) -> Settings:
    """The host's settings as one copy sees them: its GPUs, its port, its key (the planner picks TP)."""
    return replace(s, instances=None, gpu_indices=list(instance.gpus) or None, port=instance.port,
                   tensor_parallel_size=None, api_key_file=instance.api_key_file or s.api_key_file)


def pick_copy_gpus(host: str, instances: tuple[Instance, ...], present: list[int],
                   topology: dict | None) -> tuple[list[Instance], dict[str, str]]:
    """Copies given a GPU count (`gpus: N`) get their GPUs here, in inventory order, from those no
    copy lists: the best linked N (topology.pick_group). -> (the copies with GPUs, name -> reason)."""
    counted = [i for i in instances if i.count]
    if not counted:
        return list(instances), {}
    listed = {g for i in instances for g in i.gpus}
    free = [g for g in present if g not in listed]
    wanted = sum(i.count for i in counted)
    if wanted > len(free):
        raise RefusedHost(host, f"{INSTANCES_KEY} asks for {wanted} GPU(s) by count but {len(free)} are free "
                          f"({','.join(map(str, free)) or 'none'}; the others are listed by copies)",
                          "lower the counts, or list each copy's GPUs")
    groups = dict(zip((i.name for i in counted), pick_groups(topology, free, [i.count for i in counted])))
    out = [replace(i, gpus=tuple(groups[i.name][0])) if i.count else i for i in instances]
    reasons = {name: reason or f"GPU(s) {','.join(map(str, group))}: {len(group)} of the free "
               f"{','.join(map(str, free))} (links not read, or no choice left)" for name, (group, reason) in groups.items()}
    return out, reasons


def decide_copies(host: str, facts, stack: dict, settings: Settings, decide, **kwargs):
    """The host's Decision with one Decision per copy (`copies`, in inventory order): each the whole
    gate and planner on that copy's GPUs. Every copy's refusal is listed, named by the copy. The
    host-level fields (driver, choices, warnings) are the first copy's (the same facts); its `gpus`
    are every copy's, its `serve` the first copy's."""
    copies, refusals = [], []
    instances = instances_of(settings)
    present = [] if settings.profile == "cpu-smoke" else [g.index for g in host_gpus(host, facts, stack)]
    instances, picked = pick_copy_gpus(host, instances, present, facts.topology)
    for instance in instances:
        missing = [g for g in instance.gpus if g not in present]
        if missing:
            refusals.append(RefusedHost(host, f"{INSTANCES_KEY} '{instance.name}' lists GPU(s) {missing} but the host has "
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
            if picked.get(instance.name):
                copy.serve.notes.append(f"copy '{instance.name}': {picked[instance.name]}")
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
