"""Preflight: read the host's facts, run the compatibility gate, take the host's deploy lock,
print the plan; at the end of the run, the summary of every host.

Nothing here changes a host but the lock. Bad inventory data stops the whole run before any host
is touched; a host the gate refuses, or one another deploy is working on, is marked failed (so the
run exits non-zero) and gets no operations. The others go on.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import signal
import sys
from dataclasses import replace
from pathlib import Path

import click
import gevent
from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state
from pyinfra.operations import server

from qwen27b.controller import apikey, factcache, hostlock, oporder, progress
from qwen27b.controller import reachrecord, runstate, runsummary
from qwen27b.controller.artifacts import (ArtifactError, fetch_python_build, python_builds, python_downloaded,
                                         wheel_needs_cached)
from qwen27b.plan.elfneeds import wheel_needs
from qwen27b.plan.gate import (Decision, HostFacts, RefusedHost, binary_needs_check, host_fetches, mark_installed,
                             with_cached_python)
from qwen27b.controller.host_facts import DeployLock, ReleaseRecords, VenvPackages
from qwen27b.plan import retry
from qwen27b.plan.lifecycle import parse_record, release_record_file, rollback_dir
from qwen27b.controller.gate_facts import GATE_FACTS, build_host_facts, fact_arguments
from qwen27b.controller.address import host_address, unknown_address
from qwen27b.plan.hostdata import PREFIX, BadHostData, Settings, lab_address, node_address, with_lab_key
from qwen27b.plan.inventory import check_listed_once, validate_inventory
from qwen27b.controller.opsplan import planned_operations
from qwen27b.controller.remote import SUDO_PASSWORD_NEEDED, no_delay_on_connect
from qwen27b.controller.report import format_operation_lines, format_plan, format_refusal
from qwen27b.plan.stack import load_stack
from qwen27b.plan.serving import GROUP, decide, kind
from qwen27b.plan.multinode import Member, decide_group
from pyinfra.facts.files import File

from ._common import (RAY_UNIT_FILE, dry_run, note, python_to_fetch, release_dir, release_venv, take_notes,
                      wheelhouse_dir)

_OWNER = hostlock.me()  # this deploy, as the host locks name it


class BadInventory(PyinfraError):
    """Raised before any fact is read: the message names host, key and fix."""


def inventory_settings() -> dict[str, Settings]:
    """Validate every host's data once per run (ports are checked across hosts)."""
    run = runstate.current()
    if run.settings is None:
        hosts = [(h.name, dict(h.data.dict())) for h in state.inventory]
        if any(PREFIX + "api_key_file" not in data for _, data in hosts):
            path = apikey.key_file(_run.get("inventory_file"))
            try:
                made = apikey.ensure(path)
            except OSError as error:
                raise BadInventory(f"bad inventory data, no host was touched: a host names no qwen27b_api_key_file and "
                                   f"the lab key cannot be made at {path}: {error.strerror}. Fix: set "
                                   f"{apikey.STATE_ENV} to a writable directory, qwen27b_api_key_file to a 0600 key "
                                   "file, or qwen27b_api_key_file: none for an open API") from None
            run.lab_key = (str(path), apikey.how_to_use(path, made))
            hosts = [(name, with_lab_key(data, str(path))) for name, data in hosts]
        try:
            run.settings = validate_inventory(hosts, {h.name: set(h.groups) for h in state.inventory})
        except BadHostData as error:
            raise BadInventory(f"bad inventory data, no host was touched: {error}") from None
        watch_ctrl_c()
        factcache.install(state)  # each fact read once while nothing changes the host
    return run.settings


# The process's handle on its run, for what runs outside pyinfra's context: the SIGINT handler and
# the atexit summary (the State, argv, the main greenlet, whether Ctrl-C was pressed). A signal
# handler is per process, so this one store is per process too.
_run: dict = {}
DEPLOY_FILE = Path(__file__).resolve().parents[1] / "deploy.py"


def _runs_deploy_py(argv: list[str]) -> bool:
    """Is this pyinfra run one of deploy.py (not rollback.py, uninstall.py or another file)?"""
    return any(arg.endswith(".py") and Path(arg).resolve() == DEPLOY_FILE for arg in argv[1:])


def watch_connections() -> None:
    """From config.py, which pyinfra reads before it loads the inventory and connects. Each host's
    SSH error is kept for the run summary (`unreachable: <the error>`), and a run in which no host
    could be reached still ends with a summary: pyinfra stops ("No hosts remaining!") before the
    deploy file, and so preflight, ever runs. paramiko's own tracebacks of a failed handshake
    (printed by Python's last-resort log handler) are dropped: pyinfra's line per host and the
    summary say it; `--debug-all` still shows them. Only for runs of this project's deploy.py. For
    every run (rollback and uninstall too): each SSH connection without Nagle's waits (remote.no_delay)."""
    check_inventory_file()
    deploy_run = _runs_deploy_py(sys.argv)
    run_state = ctx_state.get()
    init = run_state.init  # callbacks can be added only once pyinfra has initialised the State

    def init_and_watch(*args, **kwargs):
        init(*args, **kwargs)
        no_delay_on_connect(run_state)  # every run: deploy, rollback, uninstall
        if deploy_run:
            run_state.add_callback_handler(_ConnectErrors())

    run_state.init = init_and_watch  # this State only (an instance attribute), as factcache hooks get_fact
    if not deploy_run:
        return
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    _run.update(state=run_state, argv=list(sys.argv), main=gevent.getcurrent())
    atexit.register(_finish_unstarted_run)


def check_inventory_file() -> None:
    """The inventory file's groups as written, before pyinfra merges entries of one name (and before
    it runs nothing, for an inventory of no host): inventory.check_listed_once; and the file's name,
    beside which the lab key lives. pyinfra's CLI reads the file through this one function; the
    wrapper lives in this process only. Every run (deploy, rollback, uninstall): each reads the key."""
    from pyinfra_cli import inventory as cli_inventory

    read = cli_inventory._get_groups_from_filename

    def read_and_check(filename):
        _run["inventory_file"] = filename  # where the lab key lives (controller/apikey.py)
        groups = read(filename)
        try:
            check_listed_once(groups)
        except BadHostData as error:
            raise BadInventory(f"bad inventory, no host was touched: {error}") from None
        return groups

    cli_inventory._get_groups_from_filename = read_and_check


class _ConnectErrors(BaseStateCallback):
    @staticmethod
    def host_connect_error(state, host, error) -> None:
        runstate.of(state).unreachable[host.name] = " ".join(str(error).split())


def watch_ctrl_c() -> None:
    """Once per run, in the main greenlet: our Ctrl-C handling and the run summary at exit (a second
    call in the same run, e.g. from a deploy file pyinfra runs once per host, does nothing)."""
    if _run.get("started") and _run.get("state") is ctx_state.get():
        return
    if _run.get("state") is not ctx_state.get():  # config.py was not read (another cwd, --config)
        _run.update(state=ctx_state.get(), argv=list(sys.argv), main=gevent.getcurrent())
    _run["started"] = True
    atexit.register(_finish_run)
    progress.install(_run["state"])  # before _StopAfterOperation: its exit must find the lines cleared
    _run["state"].add_callback_handler(_StopAfterOperation())
    signal.signal(signal.SIGINT, _interrupted)


def _interrupted(signum, frame) -> None:
    """Ctrl-C. pyinfra's own handler exits 0, and only once the running remote command has ended
    (a weight download can take an hour): the first Ctrl-C says so and exits 130 once the running
    operation has ended (`_StopAfterOperation`); a second one stops at once (the SSH sessions close,
    the host keeps what is done, e.g. a download's part file). An interrupted deploy must never look
    like a success.

    Python runs this handler in whichever greenlet happens to be current, often paramiko's
    transport "thread": an exception raised here would end that SSH connection instead of the run
    (threading drops a SystemExit silently, the operation fails, pyinfra exits 1). So it raises
    nothing itself; the exit is raised in the main greenlet."""
    run_state = _run["state"]
    interrupted_at = runstate.of(run_state).interrupted_at
    if _run.get("interrupted"):
        click.echo("\n--> Ctrl-C again: stopping now (exit 130)", err=True)
        _finish_run()  # os._exit skips atexit: the summary is printed here instead
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    for each in run_state.inventory:
        if each in run_state.active_hosts:
            interrupted_at[each.name] = runsummary.unfinished_operation(run_state, each) or "the end of the run"
    _run["interrupted"] = True  # also with no host active
    running = ", ".join(sorted(set(interrupted_at.values()))) or "nothing"
    click.echo(f"\n--> interrupted (Ctrl-C): waiting for the running operation ({running}) to end, then stopping; "
               "Ctrl-C again stops at once. Done work is kept, a re-run resumes (exit 130)", err=True)
    if not run_state.is_executing:  # still connecting or planning: no operation to wait for
        _exit_in_main()


def _exit_in_main() -> None:
    main = _run["main"]
    if gevent.getcurrent() is main:
        sys.exit(130)
    gevent.get_hub().loop.run_callback(main.throw, SystemExit(130))


class _StopAfterOperation(BaseStateCallback):
    """After each operation (in pyinfra's main greenlet): stop the run once Ctrl-C was pressed."""

    @staticmethod
    def operation_end(state, op_hash) -> None:
        if _run.get("interrupted"):
            sys.exit(130)


def _finish_unstarted_run() -> None:
    """At exit of a run whose deploy file never started: a summary only when some host could not be
    reached (when every host connected, pyinfra's own error above says what stopped it, e.g. bad
    inventory data)."""
    run_state = _run.get("state")
    if _run.get("started") or run_state is None or not run_state.initialised:
        return
    targeted = [h for h in run_state.inventory if run_state.is_host_in_limit(h)]
    if all(h in run_state.activated_hosts for h in targeted):
        return
    _finish_run(started=False)


def _finish_run(started: bool = True) -> None:
    from .verify import finish_run, verified

    progress.stop()
    run = runstate.of(_run["state"])
    try:
        results = runsummary.outcomes(_run["state"], run.refused, verified(run), interrupted=run.interrupted_at,
                                      raised=run.raised, unreachable=run.unreachable, started=started,
                                      unverified=run.unverified,
                                      planned=run.planned if _runs_deploy_py(_run["argv"]) else None,
                                      aborted=run.aborted, dry="--dry" in _run["argv"][1:],
                                      driver_first=run.driver_first)
    except Exception as error:  # noqa: BLE001 (the summary must never hide the run's own output)
        click.echo(f"qwen27b: no run summary ({type(error).__name__}: {error}); the output above has each host", err=True)
        results = []
    finish_run(run, results, _run["argv"])


def refuse(refused: RefusedHost) -> None:
    """Print the refusal, count it for the run summary and fail the host (no operation for it)."""
    click.echo(format_refusal(refused), err=True)
    runstate.current().refused[host.name] = " ".join(f"{cause}. Fix: {fix}." for cause, fix in refused.problems)[:-1]
    state.fail_hosts({host})


def take_lock() -> bool:
    """One deploy at a time on this host: take /run/qwen27b/deploy.lock, or refuse the host."""
    held = hostlock.parse(host.get_fact(DeployLock))
    stale = None
    if held is not None:
        if not hostlock.is_stale(held, _OWNER.controller):
            refuse(RefusedHost(host.name, *hostlock.refusal(host.name, held)))
            return False
        stale = held
        note(f"lock: the deploy that held this host ({held.describe()}) is gone (interrupted?): taking its lock over", always=True)
    lock = server.shell(name="lock: one deploy at a time on this host", commands=[hostlock.take_command(_OWNER, stale)])
    factcache.changes_only(lock, DeployLock)  # the lock file only: the facts read to plan stay valid
    return True


def release_lock() -> None:
    """The last operation of a deploy that got to the end (a failed one leaves a stale lock)."""
    unlock = server.shell(name="unlock: this deploy is done", commands=[hostlock.release_command(_OWNER)])
    factcache.changes_only(unlock, DeployLock)


class UnreadableFact(RefusedHost):
    """A fact's output could not be parsed (pyinfra logged the line; the host is already failed)."""


def gather_facts(models_path: str, on=None) -> HostFacts:
    """Every fact the gate reads. A fact whose output the parser refuses (garbled, truncated, from
    an older or newer tool) makes pyinfra log the line, fail the host and hand back the default:
    refuse the host naming the fact and its command, rather than plan on that default."""
    on = host if on is None else on

    def read(cls, **kwargs):
        was_failed = on in state.failed_hosts
        try:
            value = on.get_fact(cls, **kwargs)
        except PyinfraError:  # "No hosts remaining!": this was the last host, failed by the fact
            if was_failed or on not in state.failed_hosts:
                raise
        if on in state.failed_hosts and not was_failed:
            raise UnreadableFact(on.name, f"the {cls.__name__} fact's output could not be parsed (the line above "
                                 f"names it); its command: {cls().command(**kwargs)}",
                                 "run that command on the host and compare with the expected format; a half-installed "
                                 "driver or tool usually explains it (reinstall it, or reboot after a driver upgrade), "
                                 "then re-run the deploy")
        return value

    paths = {"models": models_path}
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
                facts = gather_facts(stack["paths"]["models"], on)
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


def dry_reach_wanted(name: str) -> bool:
    """The reach check runs on every `--dry` (issue 30), but not for a @fake host (its answers are
    recordings, nothing is behind it); QWEN27B_DRY_REACH=1 forces it there (tests), =0 turns it off."""
    wanted = os.environ.get("QWEN27B_DRY_REACH")
    return wanted == "1" or (wanted != "0" and not name.startswith("@fake/"))


def dry_reach(on, decision: Decision) -> list:
    """`qwen27b reach` inside the gate on `--dry`: from the host, a HEAD request to each source its plan
    fetches from (gate.host_fetches), through its proxy, as a read-only fact (host_facts.ReachProbe),
    before anything is installed. A fact's command is argv: a URL or proxy with a login is not sent
    (its row says so: `qwen27b reach` sends them on stdin). Rows as reach.rows_for makes them (ok
    None: not checked); the failures are recorded as `qwen27b reach` records them."""
    from qwen27b.controller.host_facts import ReachProbe
    from qwen27b.plan.hostdata import redact_url, url_has_password
    from qwen27b.tools import reach

    fetches, proxy = host_fetches(decision, python_builds()), decision.settings.http_proxy
    if proxy and url_has_password(proxy):
        why = "not checked: the proxy's login would reach the probe's command line; run `qwen27b reach`"
        return [reach.Row(on.name, f.what, redact_url(f.url), None, why, "") for f in fetches]
    plain = [f for f in fetches if not url_has_password(f.url)]
    output = on.get_fact(ReachProbe, payload=reach.probe_input(plain, proxy, DRY_REACH_TIMEOUT_S)) if plain else []
    answered = any(line.startswith("{") for line in output)
    error = None if answered or not plain else (output[-1][:200] if output else "the probe printed nothing")
    rows = {f.what: row for f, row in zip(plain, reach.rows_for(on.name, plain, "\n".join(output), error))}
    out = [rows.get(f.what) or reach.Row(on.name, f.what, redact_url(f.url), None, "not checked: its login would reach "
                                         "the probe's command line; run `qwen27b reach`", "") for f in fetches]
    reachrecord.save({on.name: [f.url for f in plain if rows[f.what].ok is False]})
    return out


DRY_REACH_TIMEOUT_S = 5.0  # per HEAD request, as `qwen27b reach`'s default


@functools.lru_cache(maxsize=8)
def _wheel_needs(path: str, size: int, mtime_ns: int) -> dict:
    """elfneeds.wheel_needs, once per wheel file (size and mtime in the key): not once per host, and
    kept in the controller cache, not once per run (artifacts.wheel_needs_cached)."""
    return wheel_needs_cached(Path(path), wheel_needs)


def check_wheel_binary(decision: Decision) -> None:
    """When the vLLM wheel is in the controller wheelhouse, the GLIBC_ and GLIBCXX_ versions its shared
    objects need against the host's glibc and libstdc++ (gate.binary_needs_check): refused here, before
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
            facts = gather_facts(stack["paths"]["models"], each)
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


DRIVER_FIRST_ROLES = ("toolchain", "nvidia")  # base packages and headers, then the driver and its reboot


def run_roles(decision: Decision, roles) -> bool:
    """Queue each role's operations for this host. An ArtifactError (a controller-side artifact that
    could not be prepared: offline, PyPI unreachable) fails this host with its message and fix, not a
    traceback; anything else is a bug and propagates, but the run summary still counts the host
    failed, never "ok". Returns whether every role was planned. A driver-first decision (GPU memory
    unknown until the driver answers) runs the roles up to the driver's reboot only."""
    if getattr(decision, "driver_first", False):
        roles = [role for role in roles if role.__name__ in DRIVER_FIRST_ROLES]
        runstate.current().driver_first.add(host.name)  # the run summary says to run again
        note("serving: not deployed this run (the GPU memory is read after the driver's reboot): re-run the deploy "
             "then", always=True)
    try:
        for role in roles:
            role(decision)
    except ArtifactError as error:
        click.echo(f"== {host.name}: FAILED while planning (nothing will be run on this host)\n   {error}\n", err=True)
        runstate.current().raised[host.name] = " ".join(str(error).split())
        state.fail_hosts({host})
        return False
    except BaseException as error:
        _raised(error)
        raise
    return True


def _raised(error: BaseException) -> None:
    """The deploy file raised on this host (a bug): pyinfra stops the whole run; kept for the summary."""
    run = runstate.current()
    run.raised[host.name] = f"the deploy file raised {type(error).__name__}: {error}"
    run.aborted.add(host.name)


def show_planned_operations() -> None:
    """Print this host's plan in one block (report.format_plan): what changes in a normal run, all of
    it with -v (pyinfra's verbosity flag, which also prints its own no-op reasons)."""
    try:
        decision = runstate.current().decisions.get(host.name)
        operations = planned_operations(state, host)
        if decision is None:  # a gateway host: its plan's lines (roles/gateway.py notes), then its operations
            lines = [text.rstrip("\n") for text, _ in take_notes()]
            click.echo("\n".join(lines + [format_operation_lines(host.name, operations, verbose=state.print_noop_info)]),
                       err=True)
        else:
            click.echo(format_plan(decision, take_notes(), operations, verbose=state.print_noop_info), err=True)
        runstate.current().planned.add(host.name)
    except BaseException as error:  # a bug: the summary counts the host failed, never "ok"
        _raised(error)
        raise
