"""Rollback on demand: switch a host back to the release its last switching deploy replaced
(release dir, model revision, unit, env), restart, verify, without a failed deploy first.

The previous release is known on the host itself: every deploy that replaces a running release
keeps its unit, env and release record in /etc/qwen27b/rollback/ (roles/service.py), read here
by the ReleaseRecords fact; qwen27b.plan.lifecycle decides (a host with nothing recorded, or
whose previous release was pruned, is refused naming the fix). The running release changes places
with the kept one, so a second rollback rolls forward again. If the release rolled back to does
not verify, the host is switched back to what it ran and that is verified: the host never ends
up on a release that failed its check while a working one was at hand.
"""

from __future__ import annotations

import click
from pyinfra import host, state
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python, server

from qwen27b.controller import oporder, runstate
from qwen27b.controller import postdeploy as V
from qwen27b.controller.host_facts import ReleaseRecords
from qwen27b.controller.opsplan import planned_operations
from qwen27b.controller.render import RESTART_COMMAND, serving_files
from qwen27b.controller.report import format_operations
from qwen27b.onhost.secretfile import load_secret
from qwen27b.plan.gate import RefusedHost
from qwen27b.plan.serving import COPIES, kind
from qwen27b.plan.lifecycle import NoRollback, Record, RollbackPlan, loopback_url, parse_record, plan_rollback, release_record_file, swap_commands
from qwen27b.plan.stack import health_status_file, load_stack

from ._common import ROLLBACK_DIR, check
from .preflight import inventory_settings, refuse, release_lock, take_lock
from .verify import failed, run_in_order, say, serving, unit_state

THEN = ["systemctl daemon-reload", RESTART_COMMAND]  # after the swap: the restored unit read, the service restarted


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
    paths = load_stack()["paths"]
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


def rollback() -> bool:
    """Queue this host's rollback (nothing when refused). Returns whether it was planned."""
    oporder.register_deploy_file(state.current_deploy_filename)
    settings = inventory_settings()[host.name]  # bad inventory stops the run before any fact is read
    if kind(settings) == COPIES:
        refuse(RefusedHost(host.name, "the rollback swaps qwen27b.service's unit and env; this host serves copies "
                           "(qwen27b_instances), which it does not roll back",
                           "deploy the release you want: pin it with qwen27b_stack_overrides and run "
                           f"`pyinfra INVENTORY deploy.py -y --limit {host.name}`"))
        return False
    paths = load_stack()["paths"]
    files = serving_files(paths)
    answer = host.get_fact(ReleaseRecords, record=release_record_file(paths), kept_dir=ROLLBACK_DIR)
    try:
        plan = plan_rollback(parse_record(answer["current"]), parse_record(answer["previous"]), answer["kept"],
                             answer["missing"], files)
    except NoRollback as nothing:
        refuse(RefusedHost(host.name, nothing.cause, nothing.fix))
        return False
    except ValueError as error:
        refuse(RefusedHost(host.name, f"a release record on the host is unreadable ({error})",
                           f"deploy the release you want instead (`pyinfra INVENTORY deploy.py -y --limit {host.name}`)"))
        return False
    if not take_lock():
        return False
    server.shell(name="rollback: switch to the previous release (symlinks, unit, env, record) and restart",
                 commands=swap_commands(plan.target.links, files, ROLLBACK_DIR, THEN))
    if loopback_url(plan.target.url):
        say("verify: skipped - the service binds to loopback only, the controller cannot reach it")
    else:
        python.call(name="verify: the release rolled back to (readiness, /v1/models, streamed completion)",
                    function=_verify, plan=plan, key_file=settings.api_key_file, files=files,
                    status_file=health_status_file(paths))
    release_lock()
    click.echo("\n".join([f"== {host.name}: rollback plan"] + [f"   {line}" for line in plan.lines(paths)]) + "\n\n"
               + format_operations(host.name, planned_operations(state, host)), err=True)
    return True
