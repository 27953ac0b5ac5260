"""The run's life, whichever file pyinfra runs (deploy.py, rollback.py, uninstall.py): the inventory
checked once before any host is touched, each host's connection error kept, Ctrl-C that waits for
the running operation and exits 130, and the run's end (the summary and report, runreport.py).

Here, not in a role: it is the run's machinery, not a step of any host's plan, and config.py,
the roles and the test deploy files all hook into it (issue 50).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from pathlib import Path

import click
import gevent
from pyinfra import state
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

from qwen27b.controller import apikey, factcache, progress, runstate, runsummary
from qwen27b.controller.remote import no_delay_on_connect
from qwen27b.controller.runreport import finish_run, verified
from qwen27b.plan.hostdata import PREFIX, BadHostData, Settings
from qwen27b.plan.urlsecret import with_lab_key
from qwen27b.plan.inventory import check_listed_once, validate_inventory


class BadInventory(PyinfraError):
    """Raised before any fact is read: the message names host, key and fix."""


def inventory_settings() -> dict[str, Settings]:
    """Validate every host's data once per run (ports are checked across hosts)."""
    run = runstate.current()
    if run.settings is None:
        hosts = [(h.name, dict(h.data.dict())) for h in state.inventory]
        if any(PREFIX + "api_key_file" not in data for _, data in hosts):
            path = apikey.key_file(inventory_file())
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


def inventory_file() -> str | None:
    """The inventory file pyinfra read (check_inventory_file), beside which the lab's keys live."""
    return _run.get("inventory_file")


DEPLOY_FILE = Path(__file__).resolve().parents[2] / "deploy.py"  # the checkout's (installed editable, as templates/)


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
