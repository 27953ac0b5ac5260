"""Step 1, the symptom: does the service start, did it fail at load or at inference, does /health
answer; judged on the current invocation, earlier failures are history."""

from __future__ import annotations

from qwen27b.controller.remote import SUDO_PASSWORD_NEEDED

from .context import Ctx, run_failure
from .model import CHAT_PAGE_KEY, FAIL, INFO, OK, SKIP, WARN, Check


def _history_check(ctx: Ctx) -> Check:
    """Failed runs before the current start: one line of history, not a verdict."""
    view = ctx.view
    last = view.history[-1]
    phase, why = run_failure(last)
    before = ("before the current start (by hand, a deploy or a reboot, not systemd's automatic restart)"
              if view.chain else "before the unit was stopped")
    label = f" (invocation {last.invocation})" if last.invocation else ""
    read = (f"journalctl _SYSTEMD_INVOCATION_ID={last.invocation} + INVOCATION_ID={last.invocation}" if last.invocation
            else f"journalctl -u {ctx.unit_name}")
    return Check(1, "journal: history", INFO,
                 f"{len(view.history)} earlier run(s) in the journal window failed {before}; not judged; "
                 f"the last{label} at {phase}: {why}",
                 f"nothing to do unless it comes back; that run: {read}")


def step1(ctx: Ctx) -> list[Check]:
    """The symptom: does it start; did it fail at load or at inference; does /health answer. Judged on
    the current invocation (and the automatic restarts into it); earlier failures are history."""
    checks = []
    u = ctx.unit
    state = f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}"
    detail = (f"result {u.get('Result', '?')}, {u.get('NRestarts', '0')} automatic restart(s), "
              f"main exit status {u.get('ExecMainStatus', '?')}")
    view = ctx.view
    ctx.symptom = {"state": None, "summary": "", "phase": None, "cause": None, "cause_step": None}
    if ctx.snap.error:
        sudo_cause, sudo_fix = SUDO_PASSWORD_NEEDED
        checks.append(Check(1, "host reachable", FAIL, ctx.snap.error,
                            sudo_fix if ctx.snap.error.startswith(sudo_cause)
                            else "check the inventory's ssh_hostname / ssh_user / ssh_key and that sshd runs"))
        ctx.symptom.update(state="unreachable", summary=ctx.snap.error)
        return checks
    if not u or u.get("LoadState") in (None, "not-found"):
        checks.append(Check(1, "service", FAIL, f"{ctx.unit_name} is not installed (LoadState {u.get('LoadState', 'unknown')})",
                            "run the deploy: pyinfra INVENTORY deploy.py -y"))
        ctx.symptom.update(state="missing", summary=f"{ctx.unit_name} not installed")
        return checks
    failing = view.failing
    cause = failing.cause if failing else None
    phase = None
    why = ""
    if failing is not None:
        phase, why = run_failure(failing)
        ctx.symptom.update(phase=phase, cause=cause.pattern.kind if cause else None,
                           cause_step=cause.step if cause else None)
    ctx.symptom.update(invocation=view.current.invocation if view.current else None, history=len(view.history))
    active, sub = u.get("ActiveState"), u.get("SubState")
    healthy = ctx.serving and ctx.health in (None, "200")
    previous_failed = any(r.failed for r in view.chain if r is not view.current)
    if healthy and view.recovered:
        checks.append(Check(1, "service", WARN, f"{state}, serving again after a failure at {phase} that systemd "
                            f"restarted automatically: {why}; {detail}",
                            f"read that run in `journalctl -u {ctx.unit_name}`: the step named holds the cause"))
        ctx.symptom.update(state="serving", summary=f"serving, recovered from a failure at {phase}")
    elif healthy:
        checks.append(Check(1, "service", OK, f"{state} since {u.get('ActiveEnterTimestamp') or '?'}; {detail}"))
        ctx.symptom.update(state="serving", summary="serving")
    elif active == "activating" and sub in ("start", "start-pre", "start-post") and failing is None:
        last = view.current.lines[-1].msg[:160] if view.current and view.current.lines else "no log yet"
        checks.append(Check(1, "service", WARN, f"{state}: loading (last log line: {last}); {detail}",
                            "wait for the weights to load (minutes on V100); if it never ends see step 5's known bugs"))
        ctx.symptom.update(state="loading", summary="still loading")
    elif active == "inactive" and failing is None and (u.get("Result") == "success" or not view.chain):
        before = ""
        if view.history and not view.chain:
            before = "; the run before failed at %s: %s" % run_failure(view.history[-1])
        checks.append(Check(1, "service", FAIL, f"{state}: stopped (by an admin?){before}; {detail}",
                            f"systemctl start {ctx.unit_name}" + (" (the step named in the journal history may fail it again)"
                                                         if before else "")))
        ctx.symptom.update(state="stopped", summary="stopped")
    else:
        if ctx.serving:
            summary = f"running but /health answers {ctx.health}"
        elif active == "activating" and failing is not None and failing is not view.current:
            summary = f"crash loop ({state}, restarting)"
        else:
            summary = state
        if failing is not None:
            summary += f": failed at {phase}: {why}"
        elif not previous_failed:
            summary += ": no failure in the current invocation's journal"
        checks.append(Check(1, "service", FAIL, f"{summary}; {detail}",
                            "the step named holds the cause" if cause else
                            f"read `journalctl -u {ctx.unit_name} -n 200`: the last exception is the cause"))
        ctx.symptom.update(state="failing", summary=summary)
    if ctx.serving:
        where = f"{ctx.flags.get('--host')}:{ctx.flags.get('--port')}"
        if ctx.health is None:
            checks.append(Check(1, "/health", SKIP, "not probed (no --port in the unit, or curl missing on the host)"))
        elif ctx.health == "200":
            checks.append(Check(1, "/health", OK, f"200 from {where}"))
        else:
            checks.append(Check(1, "/health", FAIL, f"answers {ctx.health} (000: no connection) at {where}",
                                "503: the engine died, read the journal; 000: vLLM is not listening on that address"))
    if failing is not None and failing.consequences:
        also = "; ".join(f.pattern.what for f in failing.consequences[:3])
        checks.append(Check(1, "journal: also seen", OK, f"after the cause, likely consequences: {also}"))
    if view.history:
        checks.append(_history_check(ctx))
    return checks


def chat_page_check(ctx: Ctx) -> list[Check]:
    """The chat page (a gateway host with qwen27b_chat_page): its unit runs and Open WebUI answers
    /health on loopback. No check where there is no page and none is asked for."""
    lines = (ctx.snap.text(CHAT_PAGE_KEY) or "").splitlines()
    props = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("Journal="))
    wanted = ctx.snap.data.get("qwen27b_chat_page") is True
    if props.get("LoadState") != "loaded":
        return [Check(1, "chat page", FAIL, "qwen27b_chat_page is set, but qwen27b-chat-page.service is not installed",
                      "run the deploy for this gateway host")] if wanted else []
    state = f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"
    journal = " | ".join(line[len("Journal="):] for line in lines if line.startswith("Journal="))[-400:]
    if props.get("ActiveState") == "active" and props.get("Health") == "200":
        return [Check(1, "chat page", OK, f"{state}; Open WebUI answers /health on loopback")]
    return [Check(1, "chat page", FAIL, f"{state}, {props.get('NRestarts', '0')} restart(s), /health on loopback "
                  f"answers {props.get('Health', '?')} (000: not listening); last journal lines: {journal or 'none'}",
                  "read `journalctl -u qwen27b-chat-page -n 100`; a page still starting answers within a minute")]
