"""Verify, from the controller: wait for readiness (with progress), the served name in
/v1/models, a streamed chat completion (TTFT, tokens/s) and, with DFlash2 on, the speculative
acceptance rate (~0 is a known V100 failure, 1Cat-vLLM issue 478). A run that changed nothing that
serves checks liveness instead (a 1-token answer, no figures: qwen27b/controller/verifyplan.py);
the summary says which check ran. A failure marks the host failed and attaches the unit's journal
and the health status to the run report.

It runs on every deploy: it is a check, not a change (the plan counts it apart). A host that fails
it after a deploy that replaced its release goes back to the kept one, a host serving copies as a
whole (every copy restarted and verified with its own key). The start-and-watch and retry engine
it shares with the rollback is qwen27b/controller/startwatch.py; the run report, runreport.py.
"""

from __future__ import annotations

import functools
import shlex

import click
from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from qwen27b.controller import postdeploy as V
from qwen27b.controller import engineword_read, pairmeasure, progress, render_copies, runstate, unitwords
from qwen27b.controller.remote import on_host
from qwen27b.controller.render import RESTART_COMMAND
from qwen27b.onhost.contract import SERVICE_UNIT
from qwen27b.controller.startwatch import (copies_restart, copy_failed, failed, host_lines, host_record, run_in_order,
                                           say, serving, start_and_watch, unit_state)
from qwen27b.controller.verifyplan import FIGURES, LIVENESS, Check, probe_address, unverifiable, which_check
from qwen27b.plan import regression, retry
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostdata import http_base
from qwen27b.plan.lifecycle import Record, copy_url, restored

from ._common import ROLLBACK_DIR, KeptFiles, SwitchedLink, api_key, check, note, previous_links


def _rollback_commands(previous: list[SwitchedLink | KeptFiles], restart: list[str] | None = None) -> list[str]:
    """Point every switched symlink back, restore the kept unit and env, restart (`restart`: a host
    serving copies restarts each copy, not qwen27b.service)."""
    commands = []
    for undo in previous:
        if isinstance(undo, KeptFiles):
            for path in undo.paths:
                commands.append(f"cp -a {ROLLBACK_DIR}/{path.rsplit('/', 1)[-1]} {path}")
            # what was kept before this deploy is the rollback target again (none: nothing is)
            commands.append(f"if [ -d {ROLLBACK_DIR}.prev ]; then rm -rf {ROLLBACK_DIR} && mv -T {ROLLBACK_DIR}.prev "
                            f"{ROLLBACK_DIR}; else rm -rf {ROLLBACK_DIR}; fi")
            commands.append("systemctl daemon-reload")
        else:
            commands.append(f"ln -sfn {shlex.quote(undo.target)} {shlex.quote(undo.link + '.new')} && "
                            f"mv -Tf {shlex.quote(undo.link + '.new')} {shlex.quote(undo.link)}")
    return commands + (restart or [RESTART_COMMAND])



def _host_data() -> dict:
    """The host's inventory data (its ssh_hostname: where a wildcard-bound service is probed)."""
    data = getattr(host, "data", None)
    return {"ssh_hostname": data.get("ssh_hostname")} if data is not None else {}


def _copy_row(decision: Decision, copy: Decision) -> V.HostResult:
    """A copy's report row: its URL and served name, the host's model."""
    model, serve = decision.stack.model, copy.serve
    row = V.HostResult(host.name, model=model["id"], revision=model["revision"],
                       served_name=serve.value("--served-model-name"),
                       url=http_base(probe_address(serve.value('--host'), _host_data()) or serve.value('--host'), serve.value('--port')))
    runstate.current().results.append(row)
    return row


def _serve_copy(result: V.HostResult, name: str, copy: Decision, reach: Record | None = None,
                check: Check = Check(FIGURES)) -> None:
    """serving() on one copy: its unit, URL and own key; raises VerifyFailed. `reach`: after a
    rollback, the restored release's record (address, served name, time-out, speculation; the port
    stays the copy's). `check`: the copy's (which_check)."""
    for measured in ("ready_s", "ttft_s", "decode_tok_s", "completion_tokens", "acceptance"):
        setattr(result, measured, None)  # a row verified again (after a rollback) shows that start's numbers
    unit = render_copies.instance_unit(name)
    timeout, speculative = copy.stack.profile["serve"]["start_timeout_s"], copy.serve.has("--speculative-config")
    if reach is not None:
        result.url, result.served_name = copy_url(reach.url, copy.serve.value("--port")), reach.served_name
        timeout, speculative = reach.start_timeout_s, reach.speculative
    serving(result, api_key(copy), say, functools.partial(unit_state, unit), timeout, speculative, unit=unit,
            check=check)


def _answered(result: V.HostResult) -> str:
    """What verify's line says the check found: the figures, or the liveness answer."""
    if result.check == LIVENESS:
        return "liveness: /health, /v1/models and a 1-token answer (nothing that serves changed: no new figures)"
    return f"TTFT {result.ttft_s * 1000:.0f} ms, {result.decode_tok_s or 0:.1f} tok/s"


@check
def _check_copies(decision: Decision, previous: list[SwitchedLink | KeptFiles], checks: dict | None = None) -> None:
    """Each copy (qwen27b_instances) at its own URL with its own key, one report row each. The copies
    share one release, so a copy that fails after a deploy that replaced something rolls the whole
    host back, as one service is (the swap `qwen27b rollback` makes): the kept env files, template
    and record restored, the links pointed back, every copy restarted and verified with its own key;
    every row then says `rolled back` with the copy that failed and why."""
    rows: dict[str, V.HostResult] = {}
    for instance, copy in decision.copies:
        result = rows[instance.name] = _copy_row(decision, copy)
        try:
            _serve_copy(result, instance.name, copy, check=(checks or {}).get(instance.name, Check(FIGURES)))
        except V.VerifyFailed as failure:
            copy_failed(result, decision, instance.name, failure)
            break
        result.status = "ok"
        say(f"copy {instance.name} verified at {result.url}: {_answered(result)}")
    else:
        host_lines(f"rm -rf {ROLLBACK_DIR}.prev")  # every copy verified: the release this one replaced is the rollback target
        return
    why = result.reason
    if not previous:
        raise OperationError(f"verify failed: {why} (its journal and health status in the run report)")
    names = [instance.name for instance, _ in decision.copies]
    say(f"verify failed ({why}): rolling the whole host back to the previous release, every copy ({', '.join(names)})")
    trouble = run_in_order(_rollback_commands(previous, copies_restart(names)))
    try:
        if trouble:
            raise V.VerifyFailed(f"restoring the previous release: {trouble}")
        reach = restored_reach(decision, reached(decision.copies[0][1]))
        for instance, copy in decision.copies:
            row = rows.get(instance.name)
            if row is None:  # a copy after the failed one: its row is made now
                row = rows[instance.name] = _copy_row(decision, copy)
            try:
                _serve_copy(row, instance.name, copy, reach)
            except V.VerifyFailed as again:
                raise V.VerifyFailed(f"copy {instance.name}: {again}") from None
            say(f"copy {instance.name} verified on the previous release at {row.url}")
    except V.VerifyFailed as again:
        for row in rows.values():  # the run summary reads the host's last row: every row says it
            row.status, row.reason = "failed", f"{why}; rollback did not recover: {again}"
        raise OperationError(f"verify failed and rollback did not recover: {again}") from None
    for row in rows.values():
        row.status, row.reason = "rolled back", f"rolled back: {why}"
    raise OperationError(f"verify failed, the previous release was restored and every copy verified: rolled back: {why}")


def judge_release(result: V.HostResult, key: str | None, decision: Decision,
                  previous: list[SwitchedLink | KeptFiles]):
    """The release against the serving one measured right before the switch, in one window
    (controller/pairmeasure.py); the verdict when it stops a rollout (regressed, not judged), else None."""
    return pairmeasure.judge(result, key, decision, any(isinstance(undo, KeptFiles) for undo in previous), ROLLBACK_DIR,
                             host_lines, lambda path, text: on_host(host, f"cat > {path}.figures && mv -f {path}.figures "
                                                                       f"{path}", _stdin=text), say)


def reached(decision: Decision) -> Record:
    """How this deploy's service (or copy) is reached, in a release record's terms."""
    serve = decision.serve
    return Record({}, url=http_base(probe_address(serve.value('--host'), _host_data()) or serve.value('--host'), serve.value('--port')),
                  served_name=serve.value("--served-model-name"), speculative=serve.has("--speculative-config"),
                  start_timeout_s=decision.stack.profile["serve"]["start_timeout_s"])


def restored_reach(decision: Decision, now: Record) -> Record:
    """After the rollback's swap: how the restored release is reached (its own record, which the swap
    put back: URL, served name, start time-out, speculation), `now`'s where it says nothing."""
    kept = host_record(decision)
    return restored(kept, now) if kept is not None else now


@check
def _check(decision: Decision, previous: list[SwitchedLink | KeptFiles], check: Check = Check(FIGURES)) -> None:
    serve, model = decision.serve, decision.stack.model
    base = http_base(probe_address(serve.value('--host'), _host_data()) or serve.value('--host'), serve.value('--port'))
    result = V.HostResult(host.name, model=model["id"], revision=model["revision"],
                          served_name=serve.value("--served-model-name"), url=base)
    runstate.current().results.append(result)
    key = api_key(decision)
    # the installed engine's own profile against this unit's flags: a report line, never a failure
    result.engine_word = engineword_read.read(host, unitwords.layout(decision)["venv"], serve.flags, decision.stack.draft)

    current, failure = start_and_watch(result, key, decision, check)
    if failure is None:
        say(f"verified: {_answered(result)}")
        try:
            regressed = judge_release(result, key, current, previous)
        except V.VerifyFailed as error:
            regressed, failure = None, V.VerifyFailed(f"measuring the figures on the stack's prompt set: {error}")
        # a regression this deploy caused is rolled back here when asked (there is a kept release to go to);
        # otherwise the report names it and `qwen27b rollout` stops
        if regressed is not None and regressed.verdict == regression.REGRESSED \
                and decision.settings.rollback_on_regression and previous:
            failure = V.VerifyFailed(f"regressed against the previous release, qwen27b_rollback_on_regression: "
                                     f"{regressed.text()}")
        elif failure is None:
            result.status = "ok"
            if any(isinstance(undo, KeptFiles) for undo in previous):
                host_lines(f"rm -rf {ROLLBACK_DIR}.prev")  # the release this one replaced is the rollback target now
            return
    failed(result, failure, unitwords.layout(decision)["health_status"])
    if len(result.attempts) > 1:
        result.reason += f" (after {len(result.attempts)} starts: see attempts in the run report)"
    if not previous:
        raise OperationError(f"verify failed: {result.reason} (journal and health status in the run report)")
    say(f"verify failed ({result.reason}): rolling back to the previous release")
    trouble = run_in_order(_rollback_commands(previous))
    try:
        if trouble:
            raise V.VerifyFailed(f"restoring the previous release: {trouble}")
        reach = restored_reach(decision, reached(decision))
        result.url, result.served_name = reach.url, reach.served_name  # the row says what serves now
        serving(result, key, say, unit_state, reach.start_timeout_s, reach.speculative)
    except V.VerifyFailed as again:
        result.reason += f"; rollback did not recover: {again}"
        raise OperationError(f"verify failed and rollback did not recover: {again}") from None
    result.status = "rolled back"
    result.reason = f"rolled back: {result.reason}"
    raise OperationError(f"verify failed, the previous release was restored and verified: {result.reason}")


def _unverified(state, host, reason: str) -> bool:
    """Fail the host with the reason (a False status: pyinfra adds no traceback, as it does for a raise)."""
    click.echo(f"    [{host.name}] {reason}", err=True)
    return False


VERIFY_OP = "verify: readiness, /v1/models, an answer (the figures after a change to what serves, else liveness)"


def verify(decision: Decision) -> None:
    """Queue the verify check. A service the controller cannot reach still gets the operation: it
    fails the host with the reason, so the run exits non-zero and its summary says `unverified`
    (an endpoint nobody checked is never reported ok). Which check runs (verifyplan.which_check) is
    decided here, from what the service role saw change, and said in the host's plan."""
    if decision.group is not None and decision.group.role == "worker":
        note(f"verify: the worker of serving group '{decision.group.name}' is verified through its head "
             f"({decision.group.head_address}): the API answers only once every stage is up")
        return
    reason = unverifiable(decision, _host_data())
    if reason:
        note(f"verify: {reason}", always=True)
        runstate.current().unverified[host.name] = reason
        python.call(name=VERIFY_OP, function=_unverified, reason=reason)
        return
    changes = runstate.current().serving_changes.get(host.name, {})
    if decision.copies:
        checks = {i.name: which_check(changes.get(render_copies.instance_unit(i.name))) for i, _ in decision.copies}
        for name, check in checks.items():
            note(check.plan_line().replace("verify: ", f"verify: copy {name}: ", 1))
        # one name on every host: pyinfra merges the names an operation has on different hosts (one with
        # copies a and b beside one with a only printed both); the report names each copy's row
        op = python.call(name=f"verify: each copy at its own URL with its own key: {VERIFY_OP[len('verify: '):]}",
                         function=_check_copies, decision=decision, previous=previous_links(), checks=checks)
        progress.watch_self(op, host)
        return
    if decision.group is None:
        for line in retry.plan_notes(decision.stack, decision.serve):
            note(line)
    check = which_check(changes.get(SERVICE_UNIT))
    note(check.plan_line())
    op = python.call(name=VERIFY_OP, function=_check, decision=decision, previous=previous_links(), check=check)
    progress.watch_self(op, host)
