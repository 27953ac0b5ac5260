"""The run's shared steps for the roles (roles share only through underscore-named modules): a
refused host failed and counted, the host's deploy lock taken and released (deploy, rollback,
uninstall, gateway), the roles queued for a host, and its plan printed in one block.
"""

from __future__ import annotations

import click
from pyinfra import host, state
from pyinfra.operations import server

from qwen27b.controller import factcache, hostlock, runstate
from qwen27b.controller.artifacts import ArtifactError
from qwen27b.controller.host_facts import DeployLock
from qwen27b.controller.opsplan import planned_operations
from qwen27b.controller.report import format_operation_lines, format_plan, format_refusal
from qwen27b.plan.gate import Decision, RefusedHost

from ._common import note, take_notes

_OWNER = hostlock.me()  # this deploy, as the host locks name it


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
