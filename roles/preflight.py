"""Preflight, the gate: read the host's facts, decide its plan (plan/serving.decide), take the host's
deploy lock, print the plan.

Nothing here changes a host but the lock. Bad inventory data stops the whole run before any host
is touched (controller/runlife.py); a host the gate refuses, or one another deploy is working on,
is marked failed (so the run exits non-zero) and gets no operations. The others go on. The run's
machinery (Ctrl-C, the connection watch, the run's end and report) is in qwen27b/controller/.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import replace
from pathlib import Path

from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.files import File

from qwen27b.controller import factcache, oporder, reachrecord, runstate
from qwen27b.controller.address import host_address, unknown_address
from qwen27b.controller.artifacts import fetch_python_build, python_builds, python_downloaded, wheel_needs_cached
from qwen27b.controller.gate_facts import GATE_FACTS, build_host_facts, fact_arguments
from qwen27b.controller.host_facts import DeployLock, ReleaseRecords, VenvPackages
from qwen27b.controller.reachprobe import dry_reach, dry_reach_wanted
from qwen27b.controller.remote import SUDO_PASSWORD_NEEDED
from qwen27b.controller.runlife import inventory_settings
from qwen27b.plan import gpubound, retry
from qwen27b.plan.elfneeds import wheel_needs
from qwen27b.plan.gate import Decision, HostFacts, RefusedHost
from qwen27b.plan.installs import binary_needs_check, mark_installed, with_cached_python
from qwen27b.plan.addresses import lab_address
from qwen27b.plan.nodekeys import node_address
from qwen27b.plan.lifecycle import parse_record, release_record_file, rollback_dir
from qwen27b.plan.multinode import Member, decide_group
from qwen27b.plan.serving import GROUP, decide, kind
from qwen27b.plan.stack import load_stack, with_models_dir

from ._common import RAY_UNIT_FILE, dry_run, note, python_to_fetch, release_dir, release_venv, wheelhouse_dir
from ._run import refuse, take_lock


class UnreadableFact(RefusedHost):
    """A fact's output could not be parsed (pyinfra logged the line; the host is already failed)."""


def gather_facts(paths: dict, on=None) -> HostFacts:
    """Every fact the gate reads. A fact whose output the parser refuses (garbled, truncated, from
    an older or newer tool) makes pyinfra log the line, fail the host and hand back the default:
    refuse the host naming the fact and its command, rather than plan on that default."""
    on = host if on is None else on

    def read(cls, **kwargs):
        was_failed = on in state.failed_hosts
        started = time.monotonic()
        try:
            value = on.get_fact(cls, **kwargs)
        except PyinfraError:  # "No hosts remaining!": this was the last host, failed by the fact
            if was_failed or on not in state.failed_hosts:
                raise
        if on in state.failed_hosts and not was_failed:
            if (bound := factcache.fact_timeout(cls)) and time.monotonic() - started >= bound:
                raise RefusedHost(on.name, gpubound.unanswered(cls.__name__, bound), gpubound.RESET_FIX)
            raise UnreadableFact(on.name, f"the {cls.__name__} fact's output could not be parsed (the line above "
                                 f"names it); its command: {cls().command(**kwargs)}",
                                 "run that command on the host and compare with the expected format; a half-installed "
                                 "driver or tool usually explains it (reinstall it, or reboot after a driver upgrade), "
                                 "then re-run the deploy")
        return value

    factcache.prefetch([(cls, fact_arguments(cls, paths)) for _, cls in GATE_FACTS]
                       + [(DeployLock, {}),
                          (File, {"path": RAY_UNIT_FILE})], on=on)  # the multinode role's: in this batch, no round trip
    return build_host_facts(lambda cls: read(cls, **fact_arguments(cls, paths)))


def gate(on=None) -> Decision | RefusedHost:
    """The gate's answer for a host (this one by default), once per run: the weights fan-out asks
    it for the other hosts before their own turn, so a host that will be refused seeds nobody."""
    on = host if on is None else on
    run = runstate.current()
    decisions = run.decisions
    if on.name not in decisions and kind(inventory_settings()[on.name]) == GROUP:
        decisions.update(_group_gate(inventory_settings()[on.name].node_group))
    if on.name not in decisions:
        stack = load_stack()
        settings = inventory_settings()[on.name]  # bad inventory stops the run before any fact is read
        try:
            refused = unknown_address(on, settings.bind_address)
            if refused is not None:
                raise refused
            try:
                facts = gather_facts(with_models_dir(stack["paths"], settings.models_dir), on)
            except EOFError:  # pyinfra asked for the sudo password with no terminal to read it from
                raise RefusedHost(on.name, *SUDO_PASSWORD_NEEDED) from None
            address, why = host_address(on)
            decisions[on.name] = decide(on.name, facts, stack, settings, bind_address=address, address_reason=why)
        except RefusedHost as refused:
            decisions[on.name] = refused
    if isinstance(decisions[on.name], Decision):
        try:
            check_wheel_binary(decisions[on.name])
        except RefusedHost as refused:
            decisions[on.name] = refused
    if isinstance(decisions[on.name], Decision) and on.name not in run.venv_read:
        # once, when planned: while executing, factcache drops the answer after each command, so a
        # later gate() call would read the venv over SSH again (and see what this run installed)
        run.venv_read.add(on.name)
        decision, failed = decisions[on.name], tuple(reachrecord.failed_urls(on.name))
        if dry_run() and dry_reach_wanted(on.name):
            rows = dry_reach(on, decision)
            run.reach[on.name] = rows
            failed = tuple(r.url for r in rows if r.ok is False and r.url)  # this check, not the record's
        if not dry_run() and python_to_fetch(decision, failed):
            fetch_python_build(decision.stack.tools["uv"]["version"], decision.stack.profile["python"]["version"])
        decisions[on.name] = with_cached_python(
            mark_installed(decision, on.get_fact(VenvPackages, venv=release_venv(decision)) or {}), python_builds(),
            failed, python_downloaded())
    return decisions[on.name]


@functools.lru_cache(maxsize=8)
def _wheel_needs(path: str, size: int, mtime_ns: int) -> dict:
    """elfneeds.wheel_needs, once per wheel file (size and mtime in the key): not once per host, and
    kept in the controller cache, not once per run (artifacts.wheel_needs_cached)."""
    return wheel_needs_cached(Path(path), wheel_needs)


def check_wheel_binary(decision: Decision) -> None:
    """When the vLLM wheel is in the controller wheelhouse, the GLIBC_ and GLIBCXX_ versions its shared
    objects need against the host's glibc and libstdc++ (installs.binary_needs_check): refused here, before
    any host is touched, rather than an import error after the driver and CUDA are in."""
    vllm = decision.stack.profile["vllm"]
    local = wheelhouse_dir(decision)
    stem = re.sub(r"[-_.]+", "_", vllm["dist"])
    wheels = sorted(local.glob(f"{stem}-{vllm['version']}-*.whl")) if local.is_dir() else []
    if not wheels or not (decision.facts.glibc or decision.facts.libstdcxx):
        return
    stat = wheels[0].stat()
    needs = _wheel_needs(str(wheels[0]), stat.st_size, stat.st_mtime_ns)
    binary_needs_check(decision.host, decision.facts.glibc, decision.stack, needs, decision.facts.libstdcxx)


def _group_gate(name: str) -> dict[str, Decision | RefusedHost]:
    """Every member of a serving group decided at once, from all their facts (multinode.decide_group):
    a member's plan depends on the others' GPUs, and none serves without all of them."""
    stack, settings = load_stack(), inventory_settings()
    members, refused = [], {}
    for each in state.inventory:
        if settings[each.name].node_group != name:
            continue
        data = dict(each.data.dict())
        try:
            facts = gather_facts(with_models_dir(stack["paths"], settings[each.name].models_dir), each)
        except RefusedHost as error:
            refused[each.name] = error
            continue
        members.append(Member(each.name, facts, settings[each.name], node_address(settings[each.name], data),
                              lab_address(data)))
    if refused:
        first, error = next(iter(refused.items()))
        return {**{m.name: RefusedHost(m.name, f"serving group '{name}': member {first} is refused: {error.cause}",
                                       error.fix) for m in members}, **refused}
    return decide_group(name, members, stack)


def preflight() -> Decision | None:
    """The plan for this host, printed; None when refused (the host is then marked failed)."""
    oporder.register_deploy_file(state.current_deploy_filename)  # before this host's first operation
    decision = gate()
    if isinstance(decision, RefusedHost):
        refuse(decision)
        return None
    if not take_lock():
        return None
    return carried(decision)


def carried(decision: Decision) -> Decision:
    """The flags the last deploy of this plan verified on after a retry (plan/retry.py carry_over),
    read from the host's release record: a re-deploy changes nothing instead of restarting on the
    flags that failed. One service only: copies and serving groups are not retried."""
    if decision.copies or decision.group is not None:
        return decision
    paths, model = decision.stack.paths, decision.stack.model
    answer = host.get_fact(ReleaseRecords, record=release_record_file(paths), kept_dir=rollback_dir(paths))
    try:
        record = parse_record(answer.get("current"))
    except ValueError:
        return decision  # pruning and the rollback name an unreadable record
    if record is None or record.model_ref != f"{model['id']}@{model['revision']}" \
            or record.links.get(decision.stack.layout.current_release) != release_dir(decision):
        return decision
    serve, why = retry.carry_over(decision.stack, decision.serve, decision.draft_path, record.flags,
                                  record.attempts)
    if why is None:
        return decision
    note(why, always=True)
    runstate.current().carried[host.name] = record.attempts  # the record this deploy writes keeps them
    decision = replace(decision, serve=serve)
    runstate.current().decisions[host.name] = decision
    return decision



