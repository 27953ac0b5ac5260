"""Verify, from the controller: wait for readiness (with progress), the served name in
/v1/models, a streamed chat completion (TTFT, tokens/s) and, with DFlash2 on, the speculative
acceptance rate (~0 is a known V100 failure, 1Cat-vLLM issue 478). A run that changed nothing that
serves checks liveness instead (a 1-token answer, no figures: qwen27b/controller/verifyplan.py);
the summary says which check ran. A failure marks the host failed and attaches the unit's journal
and the health status to the run report.

It runs on every deploy: it is a check, not a change (the plan counts it apart). A host that fails
it after a deploy that replaced its release goes back to the kept one, a host serving copies as a
whole (every copy restarted and verified with its own key).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
import time

import click
from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from qwen27b.controller import pairmeasure, progress, runstate, runsummary
from qwen27b.controller.verifyplan import FIGURES, LIVENESS, Check, spec_judge, spec_probe, summary_detail, \
    unverifiable, which_check
from qwen27b.controller.remote import on_host
from qwen27b.controller import postdeploy as V
from qwen27b.onhost.contract import RESTART_LOOP_FINDING, UNIT_PROPERTIES, crash_loop
from qwen27b.onhost.unit import invocation_word, journal_tail_command, parse_show, show_command, state_command
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostdata import http_base
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.controller.render import (HEALTH_UNIT, RESTART_COMMAND, SERVICE_UNIT, copy_health_files,
                                       copy_health_units, instance_unit, layout, render_all)
from qwen27b.plan import retry
from qwen27b.plan import regression
from qwen27b.plan.lifecycle import Record, copy_url, parse_record, record_text, release_record_file, restored
from qwen27b.controller.report import reports_dir

from ._common import ROLLBACK_DIR, KeptFiles, SwitchedLink, api_key, check, note, previous_links

RUN_ID = time.strftime("%Y%m%d-%H%M%S")


def finish_run(run: runstate.RunState, results: list[runsummary.Outcome], argv: list[str]) -> None:
    """At exit: the verify table, every host's outcome with the re-run command, one report file."""
    path = V.write_report(run.results, reports_dir(), RUN_ID, runsummary.as_json(results)) if results or run.results else None
    if run.results:
        click.echo(f"\n--> qwen27b verify report ({path})\n{V.report_table(run.results)}\n", err=True)
    if results:
        click.echo("\n" + runsummary.summary_text(results, argv), err=True)


def verified(run: runstate.RunState) -> dict[str, tuple[str, str]]:
    """Host -> (status, the summary's detail: for an ok row, which check ran)."""
    return {r.host: (r.status, summary_detail(r.status, r.reason, r.check, r.changed, r.ttft_s, r.decode_tok_s))
            for r in run.results}


def _remote(command: str) -> list[str]:
    """A read on the host, with its sudo settings (remote.on_host); its stdout lines, [] on failure."""
    ok, output = on_host(host, command)
    return list(output.stdout_lines) if ok else []


def run_in_order(commands: list[str]) -> str | None:
    """Run commands on the host, with its sudo settings, stopping at the first failure: that command
    and its error, or None. (A restore that failed must say so, never pass silently.)"""
    for command in commands:
        ok, output = on_host(host, command)
        if not ok:
            return f"`{command}` failed: {' '.join(output.stderr_lines)[-300:] or 'no error output'}"
    return None


def copies_restart(names: list[str]) -> list[str]:
    """Each copy restarted, as the service role restarts one (after the restored template is read)."""
    return [f"systemctl stop {unit}; systemctl reset-failed {unit}; systemctl start --no-block {unit}"
            for unit in map(instance_unit, names)]


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


def _load_tick(name: str, unit: str = SERVICE_UNIT):
    """On a terminal: the host's line while vLLM loads (its shard count from this start's journal)."""
    if not progress.drawing():
        return None
    def tick(elapsed: float) -> str:
        lines = _remote(f"{state_command(unit)}; "
                        f"journalctl -o cat --no-pager _SYSTEMD_INVOCATION_ID={invocation_word(unit)} 2>/dev/null "
                        "| grep -a 'checkpoint shards' | tail -n1")
        state_now = lines[0] if lines else ""
        progress.show(name, V.load_line(elapsed, V.shards(lines[-1] if len(lines) > 1 else ""), state_now))
        return state_now

    return tick


def serving(result: V.HostResult, key: str | None, say, unit_state, start_timeout_s: int, speculative: bool,
            unit: str = SERVICE_UNIT, judge=None, watch=None, probe: dict | None = None,
            check: Check = Check(FIGURES)) -> retry.Failure | None:
    """Ready at result.url, result.served_name listed, one streamed completion, with speculative
    decoding the acceptance: fills result, raises VerifyFailed. (The rollback deploy verifies the
    release it switched to with this too.) `check` LIVENESS (nothing that serves changed): a 1-token
    answer instead of the completion and acceptance. `judge(before, after)` (the /metrics texts around the
    completion) -> (the next SpecChoice or None, engine.Verdict): the stack's floors, reported; a
    method below its floor is returned as the retry.Failure a restart on the next method fixes.
    `watch`: the start-up watchdog (wait_ready). `probe`: the method's own measuring completion (stack
    speculative.<method>.probe: n-gram drafts nothing on the chat), sent between the scrapes too."""
    base = result.url
    for chance in (1, 2):  # one death during start-up is waited out; the second is a crash loop
        try:
            try:
                result.ready_s = V.wait_ready(base, start_timeout_s, say, unit_state, tick=_load_tick(host.name, unit),
                                              watch=watch)
            finally:
                progress.done(host.name)  # loaded (or not): the checks that follow say their own lines
            # the rest of the start budget: the unit's warm-up completion (ExecStartPost) runs after /health answers
            V.wait_active(unit_state, deadline_s=max(60.0, start_timeout_s - result.ready_s))
            break
        except V.VerifyFailed as failure:
            if failure.crashed and chance == 1 and _starting_again(result, unit):
                continue
            result.died_at_start = ""  # not a fluke (a crash loop, named by the report's reason) or no death
            raise
    V.check_models(base, result.served_name, key)
    result.check, result.changed = check.kind, None if check.changed is None else list(check.changed)
    if check.kind == LIVENESS:
        result.completion_tokens = V.answer_one_token(base, result.served_name, key)
        return None
    before = V.scrape(base, key) if speculative else None
    chat = V.chat_stream(base, result.served_name, key)
    result.ttft_s, result.decode_tok_s = chat["ttft_s"], chat["decode_tok_s"]
    result.completion_tokens = chat["completion_tokens"]
    if not speculative:
        return None
    if probe:
        V.probe(base, result.served_name, key, probe["prompt"], probe["max_tokens"])
    after = V.scrape(base, key)
    result.acceptance = V.acceptance(V.spec_counters(before), V.spec_counters(after))
    switch, slow = "set qwen27b_speculative to another method (mtp) or off", None
    if judge is not None:
        nxt, verdict = judge(before, after)
        result.speculation = verdict.reason
        if nxt is not None:
            switch = f"set qwen27b_speculative to {nxt.method} and re-deploy ({nxt.reason})"
            result.speculation += f"; next: {nxt.method}"
            slow = retry.Failure(retry.ACCEPTANCE, verdict.reason, nxt)
    if result.acceptance is not None and result.acceptance < 0.01:
        raise V.VerifyFailed(f"speculative acceptance {result.acceptance:.1%}: the drafted tokens are rejected "
                             "(1Cat-vLLM issue 478: DFlash2 on an NVFP4 target at V100 TP4); check the draft and "
                             f"target, or {switch}", retry=slow)
    if slow is not None:
        say(f"speculation below the stack's floor: {switch}")
    return slow


def _unit_properties(unit: str = SERVICE_UNIT) -> dict:
    return parse_show("\n".join(_remote(show_command(unit, UNIT_PROPERTIES))))


def _restart_watch(unit: str, timeout_s: float = 120, starting_counts: bool = False, said=None) -> dict | None:
    """Watch systemd restart a unit that died during start-up, every 2 s for up to `timeout_s`: its
    properties once a crash loop is evident (a second death, or the start limit), or, with
    `starting_counts`, once it is starting again after one automatic restart; None at the deadline.
    `said(properties)` whenever its restart count or sub-state changes meanwhile."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        props = _unit_properties(unit)
        if crash_loop(props):
            return props
        if starting_counts and props.get("SubState") in ("start", "start-post", "running") \
                and props.get("NRestarts", "0") not in ("", "0"):
            return props
        now = (props.get("NRestarts"), props.get("SubState"))
        if said is not None and now != last:
            said(props)
        last = now
        time.sleep(2)
    return None


def _starting_again(result: V.HostResult, unit: str, timeout_s: float = 120) -> bool:
    """The service died during start-up: True once systemd has it starting again after one automatic
    restart (a fluke, e.g. memory or a port the stopped process had not released yet: the restart is
    what Restart=on-failure is for), noted in result.died_at_start; False once a crash loop is evident
    (a second death, or the start limit) or after `timeout_s`."""
    props = _restart_watch(unit, timeout_s, starting_counts=True)
    if props is None or crash_loop(props):
        return False
    result.died_at_start = (f"{unit} died once during start-up and systemd restarted it "
                            f"(NRestarts {props['NRestarts']}): read `journalctl -u {unit}`")
    say(f"{result.died_at_start}; waiting for that start (a second death is a crash loop)")
    return True


def _until_restart_loop_is_evident(say, timeout_s: float = 120, unit: str = SERVICE_UNIT) -> None:
    """A unit that died once may be a fluke: wait (bounded) for systemd's second automatic restart or
    its start limit, so the report, the health check and systemd name the same crash loop."""
    _restart_watch(unit, timeout_s, said=lambda props: say(
        f"the service died during start-up; watching systemd restart it "
        f"({props.get('NRestarts', '?')} restart(s), {props.get('SubState', '?')})"))


def _health_verdict(status_file: str, result: V.HostResult, unit: str = SERVICE_UNIT,
                    health_unit: str = HEALTH_UNIT) -> None:
    """One health check run on the host, as its timer runs it; its restart-loop sentence (read from
    systemd's counters) becomes the report's reason, so the two say the same thing. A copy's: its
    unit and its own check (qwen27b-health@NAME.service)."""
    result.unit = _unit_properties(unit)
    status = "\n".join(_remote(f"systemctl start {health_unit} >/dev/null 2>&1; "
                               f"cat {status_file} 2>/dev/null"))
    try:
        result.health = json.loads(status) if status else None
    except ValueError:
        result.health = {"raw": status.splitlines()}
    findings = (result.health or {}).get("findings") or []
    loop = [f["text"] for f in findings if f.get("kind") == RESTART_LOOP_FINDING]
    if loop:
        result.reason = loop[0]


def failed(result: V.HostResult, failure: V.VerifyFailed, status_file: str) -> None:
    """A failed verify's evidence into the report: systemd's crash loop once evident, the health
    check's verdict and the unit's journal."""
    result.status, result.reason = "failed", str(failure)
    if failure.crashed:
        _until_restart_loop_is_evident(say)
    _health_verdict(status_file, result)
    result.journal = _remote(journal_tail_command(SERVICE_UNIT))


def say(message: str) -> None:
    click.echo(f"    [{host.name}] {message}", err=True)


def unit_state(unit: str = SERVICE_UNIT) -> str:
    return " ".join(_remote(state_command(unit)))


def _copy_row(decision: Decision, copy: Decision) -> V.HostResult:
    """A copy's report row: its URL and served name, the host's model."""
    model, serve = decision.stack.model, copy.serve
    row = V.HostResult(host.name, model=model["id"], revision=model["revision"],
                       served_name=serve.value("--served-model-name"),
                       url=http_base(serve.value('--host'), serve.value('--port')))
    runstate.current().results.append(row)
    return row


def _serve_copy(result: V.HostResult, name: str, copy: Decision, reach: Record | None = None,
                check: Check = Check(FIGURES)) -> None:
    """serving() on one copy: its unit, URL and own key; raises VerifyFailed. `reach`: after a
    rollback, the restored release's record (address, served name, time-out, speculation; the port
    stays the copy's). `check`: the copy's (which_check)."""
    for measured in ("ready_s", "ttft_s", "decode_tok_s", "completion_tokens", "acceptance"):
        setattr(result, measured, None)  # a row verified again (after a rollback) shows that start's numbers
    unit = instance_unit(name)
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


def _copy_failed(result: V.HostResult, decision: Decision, name: str, failure: V.VerifyFailed) -> None:
    """A failed copy's evidence, as failed() gathers a host's: systemd's crash loop once evident, its
    own health check's verdict and its unit's journal."""
    unit = instance_unit(name)
    result.status, result.reason = "failed", str(failure)
    if failure.crashed:
        _until_restart_loop_is_evident(say, unit=unit)
    _health_verdict(copy_health_files(decision.stack.paths, name)["health_status"], result, unit,
                    copy_health_units(name)[0])  # its restart-loop sentence, if any, becomes the reason
    result.reason = f"copy {name} ({unit}): {result.reason}"
    result.journal = _remote(journal_tail_command(unit))


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
            _copy_failed(result, decision, instance.name, failure)
            break
        result.status = "ok"
        say(f"copy {instance.name} verified at {result.url}: {_answered(result)}")
    else:
        _remote(f"rm -rf {ROLLBACK_DIR}.prev")  # every copy verified: the release this one replaced is the rollback target
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


def watchdog(decision: Decision, unit: str = SERVICE_UNIT):
    """The start-up watchdog (plan/retry.py start_stalled) on this host's clock and journal: the
    host's time, the unit's state and the last lines of this start, in one read."""
    rule = (decision.stack.retry or {}).get("start_watchdog")
    if not rule:
        return None

    def watch(_elapsed: float) -> str | None:
        lines = _remote(f"date +%s.%N; {state_command(unit)}; journalctl -o short-unix --no-pager -n 200 "
                        f"_SYSTEMD_INVOCATION_ID={invocation_word(unit)} 2>/dev/null")
        try:
            now = float(lines[0])
        except (IndexError, ValueError):
            return None  # no reading: no verdict (the start's own timeout still applies)
        return retry.start_stalled("\n".join(lines[2:]), now, lines[1] if len(lines) > 1 else "", rule)

    return watch


def _measured(result: V.HostResult) -> dict:
    return {"ready_s": result.ready_s, "decode_tok_s": result.decode_tok_s, "acceptance": result.acceptance}


def restart_with(decision: Decision) -> str | None:
    """The unit re-rendered with this decision's flags, written, reloaded, restarted; the first
    failure, or None. (Only the unit holds the flags; its ExecStartPost and the rest are as planned.)"""
    unit_file = HostLayout.unit_file(SERVICE_UNIT)
    ok, output = on_host(host, f"cat > {unit_file}.retry && mv -f {unit_file}.retry {unit_file}",
                         _stdin=render_all(decision)["qwen27b.service.j2"])
    if not ok:
        return f"writing {unit_file} failed: {' '.join(output.stderr_lines)[-300:] or 'no error output'}"
    return run_in_order(["systemctl daemon-reload", RESTART_COMMAND])


def judge_release(result: V.HostResult, key: str | None, decision: Decision,
                  previous: list[SwitchedLink | KeptFiles]):
    """The release against the serving one measured right before the switch, in one window
    (controller/pairmeasure.py); the verdict when it stops a rollout (regressed, not judged), else None."""
    return pairmeasure.judge(result, key, decision, any(isinstance(undo, KeptFiles) for undo in previous), ROLLBACK_DIR,
                             _remote, lambda path, text: on_host(host, f"cat > {path}.figures && mv -f {path}.figures "
                                                                       f"{path}", _stdin=text), say)


def host_record(decision: Decision) -> Record | None:
    """The release record on the host now (what runs here), None when absent or unreadable."""
    try:
        return parse_record(json.loads("\n".join(_remote(f"cat {release_record_file(decision.stack.paths)}"))))
    except ValueError:
        return None


def reached(decision: Decision) -> Record:
    """How this deploy's service (or copy) is reached, in a release record's terms."""
    serve = decision.serve
    return Record({}, url=http_base(serve.value('--host'), serve.value('--port')),
                  served_name=serve.value("--served-model-name"), speculative=serve.has("--speculative-config"),
                  start_timeout_s=decision.stack.profile["serve"]["start_timeout_s"])


def restored_reach(decision: Decision, now: Record) -> Record:
    """After the rollback's swap: how the restored release is reached (its own record, which the swap
    put back: URL, served name, start time-out, speculation), `now`'s where it says nothing."""
    kept = host_record(decision)
    return restored(kept, now) if kept is not None else now


def record_attempts(decision: Decision, attempts: list[retry.Attempt]) -> None:
    """The release record (what runs here) says the flags the last start ran with and every start."""
    path = release_record_file(decision.stack.paths)
    record = host_record(decision)
    if record is None:
        return
    flags = tuple(f"{f.name} {f.value}" if f.value is not None else f.name for f in decision.serve.flags)
    record = dataclasses.replace(record, flags=flags, speculative=decision.serve.has("--speculative-config"),
                                 attempts=tuple(a.as_json() for a in attempts))
    on_host(host, f"cat > {path}.retry && mv -f {path}.retry {path}", _stdin=record_text(record))


def _starts(result: V.HostResult, key: str | None, decision: Decision,
            check: Check = Check(FIGURES)) -> tuple[Decision, V.VerifyFailed | None]:
    """Verify, and after a failure a changed flag fixes (plan/retry.py), restart with it and verify
    again, at most the stack's retry.max_attempts starts. Every start goes into result.attempts.
    `check`: the first start's (which_check); a restart with changed flags measures the figures.
    Returns the decision the host runs now and the last start's failure (None: verified)."""
    attempts, tried, current = [], [], decision
    while True:
        failure = None
        try:
            slow = serving(result, key, say, unit_state, current.stack.profile["serve"]["start_timeout_s"],
                           current.serve.has("--speculative-config"), judge=spec_judge(current, tried),
                           watch=watchdog(current), probe=spec_probe(current), check=check)
        except V.VerifyFailed as error:
            failure, slow = error, error.retry
            if slow is not None and slow.kind == retry.STALLED:
                say(f"{slow.evidence}: stopping the service before it holds the GPUs any longer")
                _remote(f"systemctl stop {SERVICE_UNIT}")
        if slow is not None and decision.group is not None:  # a serving group's stages share their flags
            slow = None
        nxt, why = retry.plan_retry(current.stack, current.serve, current.draft_path, slow, len(attempts) + 1) \
            if slow is not None else (None, "")
        attempts.append(retry.Attempt(len(attempts) + 1, retry.flags_tried(current.serve),
                                      "failed" if failure or nxt else "verified", _measured(result),
                                      why or (str(failure) if failure else "verified")))
        if nxt is None:
            break
        say(f"start {len(attempts)}: {why}")
        if slow.kind == retry.ACCEPTANCE:
            tried.append(current.serve.spec.method)
        current = dataclasses.replace(current, serve=nxt)
        trouble = restart_with(current)
        if trouble:
            failure = V.VerifyFailed(f"restarting with the retry's flags: {trouble}")
            attempts[-1] = dataclasses.replace(attempts[-1], why=f"{why}; {failure}")
            break
        for name in ("ready_s", "ttft_s", "decode_tok_s", "completion_tokens", "acceptance"):
            setattr(result, name, None)
        result.speculation, check = "", Check(FIGURES, ("the unit's flags (a retry)",))
    if len(attempts) > 1:
        result.attempts = [a.as_json() for a in attempts]
        if failure is None:
            result.reason = (f"verified on start {len(attempts)} of {len(attempts)} ({attempts[-1].flags}); "
                             + "; ".join(f"start {a.number} ({a.flags}): {a.why}" for a in attempts[:-1]))
            record_attempts(current, attempts)
    return current, failure


@check
def _check(decision: Decision, previous: list[SwitchedLink | KeptFiles], check: Check = Check(FIGURES)) -> None:
    serve, model = decision.serve, decision.stack.model
    base = http_base(serve.value('--host'), serve.value('--port'))
    result = V.HostResult(host.name, model=model["id"], revision=model["revision"],
                          served_name=serve.value("--served-model-name"), url=base)
    runstate.current().results.append(result)
    key = api_key(decision)

    current, failure = _starts(result, key, decision, check)
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
                _remote(f"rm -rf {ROLLBACK_DIR}.prev")  # the release this one replaced is the rollback target now
            return
    failed(result, failure, layout(decision)["health_status"])
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
    reason = unverifiable(decision)
    if reason:
        note(f"verify: {reason}", always=True)
        runstate.current().unverified[host.name] = reason
        python.call(name=VERIFY_OP, function=_unverified, reason=reason)
        return
    changes = runstate.current().serving_changes.get(host.name, {})
    if decision.copies:
        checks = {i.name: which_check(changes.get(instance_unit(i.name))) for i, _ in decision.copies}
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
