"""The start-and-watch engine, shared by verify (roles/verify.py) and rollback (roles/rollback.py):
wait for a started unit to serve (with the load line on a terminal and the start-up watchdog), a
death during start-up waited out once, then a crash loop named as systemd and the health check name
it; a failed start's evidence (health verdict, journal) into the report row; and the retry engine
(plan/retry.py): restart with the flag a failure names, at most the stack's retry.max_attempts
starts, each start kept in the release record. Here, in the controller, so that no role reaches into
another's private steps (issue 50).
"""

from __future__ import annotations

import dataclasses
import json
import time

import click
from pyinfra import host

from qwen27b.controller import postdeploy as V
from qwen27b.controller import progress
from qwen27b.controller.remote import on_host
from qwen27b.controller.render import RESTART_COMMAND, render_all
from qwen27b.controller.render_copies import copy_health_files, copy_health_units, instance_unit
from qwen27b.onhost.contract import HEALTH_UNIT, SERVICE_UNIT
from qwen27b.controller.verifyplan import FIGURES, LIVENESS, Check, spec_judge, spec_probe
from qwen27b.onhost.contract import RESTART_LOOP_FINDING, UNIT_PROPERTIES, crash_loop
from qwen27b.onhost.unit import invocation_word, journal_tail_command, parse_show, show_command, state_command
from qwen27b.plan import retry
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan.lifecycle import Record, parse_record, record_text, release_record_file


def host_lines(command: str) -> list[str]:
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


def _load_tick(name: str, unit: str = SERVICE_UNIT):
    """On a terminal: the host's line while vLLM loads (its shard count from this start's journal)."""
    if not progress.drawing():
        return None
    def tick(elapsed: float) -> str:
        lines = host_lines(f"{state_command(unit)}; "
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
    return parse_show("\n".join(host_lines(show_command(unit, UNIT_PROPERTIES))))


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


def health_verdict(status_file: str, result: V.HostResult, unit: str = SERVICE_UNIT,
                    health_unit: str = HEALTH_UNIT) -> None:
    """One health check run on the host, as its timer runs it; its restart-loop sentence (read from
    systemd's counters) becomes the report's reason, so the two say the same thing. A copy's: its
    unit and its own check (qwen27b-health@NAME.service)."""
    result.unit = _unit_properties(unit)
    status = "\n".join(host_lines(f"systemctl start {health_unit} >/dev/null 2>&1; "
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
    health_verdict(status_file, result)
    result.journal = host_lines(journal_tail_command(SERVICE_UNIT))


def say(message: str) -> None:
    click.echo(f"    [{host.name}] {message}", err=True)


def unit_state(unit: str = SERVICE_UNIT) -> str:
    return " ".join(host_lines(state_command(unit)))


def copy_failed(result: V.HostResult, decision: Decision, name: str, failure: V.VerifyFailed) -> None:
    """A failed copy's evidence, as failed() gathers a host's: systemd's crash loop once evident, its
    own health check's verdict and its unit's journal."""
    unit = instance_unit(name)
    result.status, result.reason = "failed", str(failure)
    if failure.crashed:
        _until_restart_loop_is_evident(say, unit=unit)
    health_verdict(copy_health_files(decision.stack.paths, name)["health_status"], result, unit,
                    copy_health_units(name)[0])  # its restart-loop sentence, if any, becomes the reason
    result.reason = f"copy {name} ({unit}): {result.reason}"
    result.journal = host_lines(journal_tail_command(unit))


def watchdog(decision: Decision, unit: str = SERVICE_UNIT):
    """The start-up watchdog (plan/retry.py start_stalled) on this host's clock and journal: the
    host's time, the unit's state and the last lines of this start, in one read."""
    rule = (decision.stack.retry or {}).get("start_watchdog")
    if not rule:
        return None

    def watch(_elapsed: float) -> str | None:
        lines = host_lines(f"date +%s.%N; {state_command(unit)}; journalctl -o short-unix --no-pager -n 200 "
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


def _read_record(path: str) -> Record | None:
    try:
        return parse_record(json.loads("\n".join(host_lines(f"cat {path} 2>/dev/null")) or "null"))
    except ValueError:
        return None


def host_record(decision: Decision) -> Record | None:
    """The release record on the host now (what runs here), None when absent or unreadable."""
    try:
        return parse_record(json.loads("\n".join(host_lines(f"cat {release_record_file(decision.stack.paths)}"))))
    except ValueError:
        return None


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


def start_and_watch(result: V.HostResult, key: str | None, decision: Decision,
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
                host_lines(f"systemctl stop {SERVICE_UNIT}")
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
