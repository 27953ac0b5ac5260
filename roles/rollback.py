"""Rollback on demand: switch a host back to the release its last switching deploy replaced
(release dir, model revision, unit, env, health check unit), restart, verify, without a failed deploy first.

The previous release is known on the host itself: every deploy that replaces a running release
keeps its units, env and release record in /etc/qwen27b/rollback/ (roles/service.py), read here
by the ReleaseRecords fact; qwen27b.plan.lifecycle decides (a host with nothing recorded, or
whose previous release was pruned, is refused naming the fix). The running release changes places
with the kept one, so a second rollback rolls forward again. If the release rolled back to does
not verify, the host is switched back to what it ran and that is verified: the host never ends
up on a release that failed its check while a working one was at hand. A host serving copies
(qwen27b_instances) is rolled back as a whole, since its copies share one release: every copy's
env file, the templated unit, every copy's health check unit and the record swapped, each copy restarted and verified at its own
URL with its own key (a failed copy switches the whole host back).
"""

from __future__ import annotations

import functools

import click
from pyinfra import host, state
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python, server

from qwen27b.controller import oporder, runstate
from qwen27b.controller import postdeploy as V
from qwen27b.controller.host_facts import ReleaseRecords
from qwen27b.controller.opsplan import planned_operations
from qwen27b.controller.releasefiles import copies_serving_files, kept_health_units, serving_files
from qwen27b.controller.render import RESTART_COMMAND
from qwen27b.controller.render_copies import copy_health_files, copy_health_units, instance_unit
from qwen27b.controller.report import format_operations
from qwen27b.controller.runlife import inventory_settings
from qwen27b.controller.startwatch import (copies_restart, failed, health_verdict, host_lines, run_in_order, say, serving,
                                           unit_state)
from qwen27b.onhost.secretfile import load_secret
from qwen27b.onhost.unit import journal_tail_command
from qwen27b.plan.gate import RefusedHost
from qwen27b.plan.copykeys import instances_of
from qwen27b.plan.serving import COPIES, kind
from qwen27b.plan.lifecycle import NoRollback, Record, RollbackPlan, copy_url, loopback_url, parse_record, plan_rollback, release_record_file, swap_commands
from qwen27b.plan.stack import health_status_file, load_stack, with_models_dir

from ._common import ROLLBACK_DIR, check
from ._run import refuse, release_lock, take_lock
from ._takeover import kept, restore_on_rollback

THEN = ["systemctl daemon-reload", RESTART_COMMAND]  # after the swap: the restored unit read, the service restarted


def _paths() -> dict:
    """This host's paths: the stack's, its models under qwen27b_models_dir where set (the release
    record's model link then names the revision there, and the plan lines say which)."""
    return with_models_dir(load_stack()["paths"], inventory_settings()[host.name].models_dir)


def _switch(links: dict[str, str], files: list[str]) -> str | None:
    """Run the swap on the host now (from verify, after a failed check); the first failure, or None."""
    return run_in_order(swap_commands(links, files, ROLLBACK_DIR, THEN))


def _result(record: Record) -> V.HostResult:
    model, _, revision = record.model_ref.partition("@")
    return V.HostResult(host.name, model=model, revision=revision, served_name=record.served_name, url=record.url)


@check
def _verify(plan: RollbackPlan, key_file: str | None, files: list[str], status_file: str) -> None:
    key = load_secret(key_file, "VLLM_API_KEY") if key_file else None  # read here: never an operation argument
    result = _result(plan.target)
    runstate.current().results.append(result)
    try:
        serving(result, key, say, unit_state, plan.target.start_timeout_s, plan.target.speculative)
        result.status = "ok"
        say(f"rolled back and verified: TTFT {result.ttft_s * 1000:.0f} ms, {result.decode_tok_s or 0:.1f} tok/s")
        return
    except V.VerifyFailed as failure:
        failed(result, failure, status_file)
    paths = _paths()
    result.reason = f"the previous release ({plan.target.short(paths)}) did not verify: {result.reason}"
    say(f"{result.reason}; switching back to {plan.back.short(paths)}")
    trouble = _switch(plan.back.links, files)
    again = _result(plan.back)
    try:
        if trouble:
            raise V.VerifyFailed(trouble)
        serving(again, key, say, unit_state, plan.back.start_timeout_s, plan.back.speculative)
    except V.VerifyFailed as error:
        result.reason += f"; switching back did not recover either: {error}"
        raise OperationError(f"rollback failed: {result.reason}") from None
    result.reason += f"; switched back to {plan.back.short(paths)}, which verified"
    raise OperationError(f"rollback failed: {result.reason}")


def copies_then(copies: list[tuple]) -> list[str]:
    """After the swap on a host serving copies: the restored template read, each copy restarted."""
    return ["systemctl daemon-reload"] + copies_restart([name for name, _, _ in copies])


def _verify_each_copy(record: Record, copies: list[tuple]) -> str | None:
    """Each copy at its own URL with its own key, one report row each; the first failure, or None."""
    paths = _paths()
    for name, port, key_file in copies:
        unit = instance_unit(name)
        result = _result(record)
        result.url = copy_url(record.url, port)
        runstate.current().results.append(result)
        key = load_secret(key_file, "VLLM_API_KEY") if key_file else None  # read here: never an operation argument
        try:
            serving(result, key, say, functools.partial(unit_state, unit), record.start_timeout_s, record.speculative,
                    unit=unit)
            result.status = "ok"
            say(f"copy {name} verified at {result.url}: TTFT {result.ttft_s * 1000:.0f} ms")
        except V.VerifyFailed as failure:
            result.status, result.reason = "failed", f"copy {name} ({unit}): {failure}"
            health_verdict(copy_health_files(paths, name)["health_status"], result, unit, copy_health_units(name)[0])
            result.journal = host_lines(journal_tail_command(unit))
            return result.reason
    return None


@check
def _verify_copies(plan: RollbackPlan, copies: list[tuple], files: list[str], then: list[str]) -> None:
    """The rollback of a host serving copies: every copy verified on the release rolled back to; if
    one fails, the host is switched back and every copy verified there."""
    paths = _paths()
    trouble = _verify_each_copy(plan.target, copies)
    if trouble is None:
        say("rolled back and verified: every copy")
        return
    reason = f"the previous release ({plan.target.short(paths)}) did not verify: {trouble}"
    say(f"{reason}; switching back to {plan.back.short(paths)}")
    again = run_in_order(swap_commands(plan.back.links, files, ROLLBACK_DIR, then)) or _verify_each_copy(plan.back, copies)
    if again:
        raise OperationError(f"rollback failed: {reason}; switching back did not recover either: {again}")
    raise OperationError(f"rollback failed: {reason}; switched back to {plan.back.short(paths)}, which verified")


def rollback() -> bool:
    """Queue this host's rollback (nothing when refused). Returns whether it was planned."""
    oporder.register_deploy_file(state.current_deploy_filename)
    settings = inventory_settings()[host.name]  # bad inventory stops the run before any fact is read
    paths = _paths()
    copies = [(i.name, i.port, i.api_key_file or settings.api_key_file) for i in instances_of(settings)] \
        if kind(settings) == COPIES else []
    names = [name for name, _, _ in copies]
    files = copies_serving_files(paths, names) if copies else serving_files(paths)
    then = copies_then(copies) if copies else THEN
    answer = host.get_fact(ReleaseRecords, record=release_record_file(paths), kept_dir=ROLLBACK_DIR)
    try:
        plan = plan_rollback(parse_record(answer["current"]), parse_record(answer["previous"]), answer["kept"],
                             answer["missing"], files, kept_health_units(names if copies else None))
    except NoRollback as nothing:
        if kept(paths):  # no release of ours before this one: the lab's unit its deploy took over goes back
            return restore_on_rollback(paths)
        refuse(RefusedHost(host.name, nothing.cause, nothing.fix))
        return False
    except ValueError as error:
        refuse(RefusedHost(host.name, f"a release record on the host is unreadable ({error})",
                           f"deploy the release you want instead (`pyinfra INVENTORY deploy.py -y --limit {host.name}`)"))
        return False
    if not take_lock():
        return False
    files = list(plan.restore)  # what was kept: a rollback dir kept before issue 56 has no health unit
    server.shell(name="rollback: switch to the previous release (symlinks, units, env, record) and restart"
                 + (f" each copy ({', '.join(names)})" if copies else ""),
                 commands=swap_commands(plan.target.links, files, ROLLBACK_DIR, then))
    if loopback_url(plan.target.url):
        say("verify: skipped - the service binds to loopback only, the controller cannot reach it")
    elif copies:
        python.call(name="verify: each copy on the release rolled back to (readiness, /v1/models, streamed completion)",
                    function=_verify_copies, plan=plan, copies=copies, files=files, then=then)
    else:
        python.call(name="verify: the release rolled back to (readiness, /v1/models, streamed completion)",
                    function=_verify, plan=plan, key_file=settings.api_key_file, files=files,
                    status_file=health_status_file(paths))
    release_lock()
    click.echo("\n".join([f"== {host.name}: rollback plan"] + [f"   {line}" for line in plan.lines(paths)]) + "\n\n"
               + format_operations(host.name, planned_operations(state, host)), err=True)
    return True
