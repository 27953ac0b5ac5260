"""The end of a run, for many hosts: one line per host (ok, rolled back, refused, unreachable,
failed at which operation and why), and the command that re-runs only the hosts that failed.

pyinfra keeps going on the other hosts when one fails; this is what the lab admin reads to know
which ones, why, and what to run next. `outcomes` reads pyinfra's State (after the run);
the rest is pure and unit-tested.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass

from qwen27b.controller import runstate
from qwen27b.plan.urlsecret import shown_argv

OK_STATUSES = ("ok", "planned")  # planned: a --dry run, nothing executed
DRIVER_FIRST = ("the driver only (the GPU memory is read once it answers): re-run the deploy after its reboot "
                "to serve")


@dataclass
class Outcome:
    host: str
    status: str  # ok | planned | unverified | rolled back | failed | refused | unreachable | interrupted | not run
    detail: str = ""
    again: bool = False  # done as planned, but the plan was the driver only: the deploy must run once more

    @property
    def failed(self) -> bool:
        return self.status not in OK_STATUSES


def _operations(state, host, with_hash: bool = False):
    """(operation name, its OperationMeta) for each operation queued for this host, in run order
    (`with_hash`: and its hash last)."""
    for op_hash in state.get_op_order():
        data = state.ops.get(host, {}).get(op_hash)
        if data is not None:
            name = ", ".join(sorted(state.op_meta[op_hash].names))
            yield (name, data.operation_meta, op_hash) if with_hash else (name, data.operation_meta)


def _failed_operation(state, host) -> tuple[str, str] | None:
    """(operation name, last lines of its output) of the operation that failed on this host. An
    upload that raised (an SFTP PermissionError) leaves no output: its cause and fix, as
    operations.CheckedUpload kept them, take the output's place."""
    for name, meta, op_hash in _operations(state, host, with_hash=True):
        if meta.is_complete() and not meta.did_succeed():
            output = getattr(meta, "_combined_output", None)  # pyinfra's CommandOutput of OutputLine
            lines = [getattr(item, "line", str(item)) for item in (output or [])]
            text = " ".join(str(line).strip() for line in lines[-3:])[-300:]
            upload = runstate.of(state).upload_errors.get((host.name, op_hash))
            return name, upload or text
    return None


def unfinished_operation(state, host) -> str | None:
    """The first operation not yet complete on this host: the one running when Ctrl-C came (read
    it in the signal handler: pyinfra may report that operation "Success" while it disconnects)."""
    return next((name for name, meta in _operations(state, host) if not meta.is_complete()), None)


def unreachable_detail(name: str, error: str | None) -> str:
    """One line: the connector's own error (pyinfra's "Could not connect (...)", "SSH error (...)")
    and what to check."""
    return (f"{error or 'could not connect over SSH'}: check the address, that sshd runs and the key is "
            f"accepted (ssh {name} true)")


def outcomes(state, refused: dict[str, str], verified: dict[str, tuple[str, str]],
             interrupted: dict[str, str] | None = None, raised: dict[str, str] | None = None,
             unreachable: dict[str, str] | None = None, started: bool = True,
             unverified: dict[str, str] | None = None, planned: set[str] | None = None,
             aborted: set[str] | None = None, dry: bool = True,
             driver_first: set[str] | None = None) -> list[Outcome]:
    """Every host the run targeted. `refused`: host -> cause (preflight); `verified`: host ->
    (status, reason) from the verify role; `interrupted`: host -> the operation Ctrl-C stopped;
    `raised`: host -> the error its deploy file raised while planning (never "ok", even in --dry);
    `unreachable`: host -> its SSH error; `started`: False when pyinfra stopped before the deploy
    file ran (no host reachable): a host that did connect is then "not run"; `unverified`: host ->
    why verify could not reach its service (its verify operation failed the host on purpose);
    `planned`: the hosts whose deploy file ran to its end (None: not tracked); `aborted`: the hosts
    whose deploy file raised (pyinfra then stops the whole run): a host left unplanned, or planned
    but never run because of them, is "not run", never "planned" or "ok". `dry`: a --dry run; in a
    real one a host with nothing queued (a second uninstall) is "ok: nothing to do", not "planned".
    `driver_first`: the hosts whose run installs the driver only (gate.Decision.driver_first): ok or
    planned, said so, and `again` (the summary names the command that serves them after the reboot)."""
    unverified = unverified or {}
    out = []
    for host in state.inventory:
        if not state.is_host_in_limit(host):
            continue
        name = host.name
        if host not in state.activated_hosts:
            out.append(Outcome(name, "unreachable", unreachable_detail(name, (unreachable or {}).get(name))))
        elif not started:
            out.append(Outcome(name, "not run", "pyinfra stopped before the deploy started (its error is above)"))
        elif name in refused:
            out.append(Outcome(name, "refused", refused[name]))
        elif raised and name in raised:
            out.append(Outcome(name, "failed", f"while planning: {raised[name]}"))
        elif name in verified and verified[name][0] != "ok":
            out.append(Outcome(name, *verified[name]))
        elif host in state.failed_hosts:
            failed = _failed_operation(state, host)
            if failed and name in unverified and failed[0].startswith("verify:"):
                out.append(Outcome(name, "unverified", unverified[name]))
                continue
            detail = f"at '{failed[0]}': {failed[1]}" if failed else "see the output above"
            out.append(Outcome(name, "failed", detail))
        elif name in verified:
            out.append(Outcome(name, *verified[name]))
        elif interrupted and interrupted.get(name):
            out.append(Outcome(name, "interrupted",
                               f"Ctrl-C during '{interrupted[name]}': re-run to finish (done work is kept)"))
        else:
            queued = list(_operations(state, host))
            ran = any(meta.is_complete() for _, meta in queued)
            if not ran and (aborted or (planned is not None and name not in planned)):  # pyinfra stopped the run
                why = (f"the deploy file raised on {', '.join(sorted(aborted))}" if aborted
                       else "the deploy file stopped before this host's plan was complete (its error is above)")
                out.append(Outcome(name, "not run", f"{why}: no operation ran"))
                continue
            unfinished = next((op for op, meta in queued if not meta.is_complete()), None)
            if unfinished and not dry:  # pyinfra itself stopped (an internal error): never "ok"
                out.append(Outcome(name, "failed", f"the run stopped during '{unfinished}' (pyinfra's error is "
                                                   "above): re-run to finish, done work is kept"))
                continue
            if not ran and not queued and not dry:
                out.append(Outcome(name, "ok", "nothing to do"))
                continue
            if driver_first and name in driver_first:
                out.append(Outcome(name, "ok" if ran else "planned", DRIVER_FIRST, again=True))
                continue
            out.append(Outcome(name, "ok" if ran else "planned", "" if ran else unverified.get(name, "")))
    return out


def rerun_command(argv: list[str], failed: list[str]) -> str:
    """The same pyinfra command line (argv[0] is pyinfra's, whichever way it was started), limited
    to the failed hosts (an earlier --limit dropped), its passwords shown as *** (urlsecret.shown_argv)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--limit":
            skip = True
            continue
        if arg.startswith("--limit="):
            continue
        kept.append(arg)
    limits = [part for host in failed for part in ("--limit", host)]
    return " ".join(shlex.quote(a) for a in shown_argv(["pyinfra", *kept[1:], *limits]))


def summary_table(results: list[Outcome]) -> str:
    width = max([len("host")] + [len(r.host) for r in results])
    status_width = max([len("outcome")] + [len(r.status) for r in results])
    lines = [f"{'host'.ljust(width)}  {'outcome'.ljust(status_width)}  detail",
             f"{'-' * width}  {'-' * status_width}  ------"]
    lines += [f"{r.host.ljust(width)}  {r.status.ljust(status_width)}  {r.detail}".rstrip() for r in results]
    return "\n".join(lines)


def summary_text(results: list[Outcome], argv: list[str]) -> str:
    failed = [r.host for r in results if r.failed]
    head = f"--> qwen27b run summary: {len(results) - len(failed)} of {len(results)} host(s) ok"
    text = f"{head}\n{summary_table(results)}\n"
    if failed:
        text += f"\nre-run only the failed host(s), after fixing the cause:\n    {rerun_command(argv, failed)}\n"
    again = [r.host for r in results if r.again and not r.failed]
    if again:
        text += ("\nre-run the deploy after the driver's reboot, to serve on the host(s) whose driver came first:\n"
                 f"    {rerun_command(argv, again)}\n")
    return text


def as_json(results: list[Outcome]) -> list[dict]:
    return [asdict(r) | {"failed": r.failed} for r in results]
