"""Preflight: read the host's facts, run the compatibility gate, take the host's deploy lock,
print the plan; at the end of the run, the summary of every host.

Nothing here changes a host but the lock. Bad inventory data stops the whole run before any host
is touched; a host the gate refuses, or one another deploy is working on, is marked failed (so the
run exits non-zero) and gets no operations. The others go on.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

import click
from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from pyinfra.operations import server

from qwen27b import facts as F
from qwen27b import hostlock, runsummary
from qwen27b.gate import Decision, HostFacts, RefusedHost, decide
from qwen27b.host_facts import DeployLock
from qwen27b.hostdata import BadHostData, Settings, lab_address, validate_inventory
from qwen27b.opsplan import planned_operations
from qwen27b.report import format_decision, format_operations, format_refusal
from qwen27b.stack import load_stack

from ._common import note, take_notes

_validated: dict[int, dict[str, Settings]] = {}
_refused: dict[str, str] = {}  # host -> cause, for the run summary
_OWNER = hostlock.me()  # this deploy, as the host locks name it


class BadInventory(PyinfraError):
    """Raised before any fact is read: the message names host, key and fix."""


def inventory_settings() -> dict[str, Settings]:
    """Validate every host's data once per run (ports are checked across hosts)."""
    key = id(state)
    if key not in _validated:
        hosts = [(h.name, dict(h.data.dict())) for h in state.inventory]
        try:
            _validated[key] = validate_inventory(hosts)
        except BadHostData as error:
            raise BadInventory(f"bad inventory data, no host was touched: {error}") from None
        _run.update(state=ctx_state.get(), argv=list(sys.argv))
        atexit.register(_finish_run)
        signal.signal(signal.SIGINT, _interrupted)
    return _validated[key]


_interrupted_at: dict[str, str] = {}  # host -> the operation Ctrl-C stopped
_run: dict = {}  # pyinfra's State of this run (the context object is not set at exit) and argv


def _interrupted(signum, frame) -> None:
    """Ctrl-C. pyinfra's own handler exits 0, and only once the running remote command has ended
    (a weight download can take an hour): the first Ctrl-C says so and exits 130 that way; a second
    one stops at once (the SSH sessions close, the host keeps what is done, e.g. a download's part
    file). An interrupted deploy must never look like a success."""
    run_state = _run["state"]
    if _interrupted_at:
        click.echo("\n--> Ctrl-C again: stopping now (exit 130)", err=True)
        _finish_run()  # os._exit skips atexit: the summary is printed here instead
        sys.stderr.flush()
        os._exit(130)
    for each in run_state.inventory:
        if each in run_state.active_hosts:
            _interrupted_at[each.name] = runsummary.unfinished_operation(run_state, each) or "the end of the run"
    running = ", ".join(sorted(set(_interrupted_at.values()))) or "nothing"
    click.echo(f"\n--> interrupted (Ctrl-C): waiting for the running operation ({running}) to end, then stopping; "
               "Ctrl-C again stops at once. Done work is kept, a re-run resumes (exit 130)", err=True)
    sys.exit(130)


def _finish_run() -> None:
    from .verify import finish_run, verified

    try:
        results = runsummary.outcomes(_run["state"], _refused, verified(), interrupted=_interrupted_at)
    except Exception as error:  # noqa: BLE001 (the summary must never hide the run's own output)
        click.echo(f"qwen27b: no run summary ({type(error).__name__}: {error}); the output above has each host", err=True)
        results = []
    finish_run(results, _run["argv"])


def _refuse(refused: RefusedHost) -> None:
    click.echo(format_refusal(refused), err=True)
    _refused[host.name] = f"{refused.cause}. Fix: {refused.fix}"
    state.fail_hosts({host})


def take_lock() -> bool:
    """One deploy at a time on this host: take /run/qwen27b/deploy.lock, or refuse the host."""
    held = hostlock.parse(host.get_fact(DeployLock))
    stale = None
    if held is not None:
        if not hostlock.is_stale(held, _OWNER.controller):
            _refuse(RefusedHost(host.name, *hostlock.refusal(host.name, held)))
            return False
        stale = held
        note(f"lock: the deploy that held this host ({held.describe()}) is gone (interrupted?): taking its lock over")
    server.shell(name="lock: one deploy at a time on this host", commands=[hostlock.take_command(_OWNER, stale)])
    return True


def release_lock() -> None:
    """The last operation of a deploy that got to the end (a failed one leaves a stale lock)."""
    server.shell(name="unlock: this deploy is done", commands=[hostlock.release_command(_OWNER)])


def gather_facts(models_path: str, on=None) -> HostFacts:
    on = host if on is None else on
    os_release = on.get_fact(F.OsRelease)
    return HostFacts(
        os=os_release,
        kernel=on.get_fact(F.KernelRelease),
        gpus=on.get_fact(F.NvidiaGpus) or [],
        pci_gpus=on.get_fact(F.NvidiaPciDevices) or [],
        kernel_module=on.get_fact(F.NvidiaKernelModule) or {},
        nouveau_loaded=bool(on.get_fact(F.NouveauLoaded)),
        secure_boot=on.get_fact(F.SecureBoot) or "unsupported",
        disk=on.get_fact(F.DiskFree, path=models_path),
        memory=on.get_fact(F.MemoryInfo),
        pythons=on.get_fact(F.PythonVersions) or {},
        xids=on.get_fact(F.XidErrors) or [],
        packages=on.get_fact(F.NvidiaCudaPackages) or {},
        held=on.get_fact(F.HeldPackages) or [],
    )


_decisions: dict[tuple[int, str], Decision | RefusedHost] = {}


def gate(on=None) -> Decision | RefusedHost:
    """The gate's answer for a host (this one by default), once per run: the weights fan-out asks
    it for the other hosts before their own turn, so a host that will be refused seeds nobody."""
    on = host if on is None else on
    key = (id(state), on.name)
    if key not in _decisions:
        stack = load_stack()
        facts = gather_facts(stack["paths"]["models"], on)
        try:
            _decisions[key] = decide(on.name, facts, stack, inventory_settings()[on.name],
                                     bind_address=lab_address(dict(on.data.dict())))
        except RefusedHost as refused:
            _decisions[key] = refused
    return _decisions[key]


def preflight() -> Decision | None:
    """The plan for this host, printed; None when refused (the host is then marked failed)."""
    decision = gate()
    if isinstance(decision, RefusedHost):
        _refuse(decision)
        return None
    note(format_decision(decision))
    if not take_lock():
        return None
    return decision


def show_planned_operations() -> None:
    """Print this host's whole plan in one block: decision, role notes, operations with commands."""
    notes = take_notes()
    decision, role_notes = notes[0], [f"   {n}" for n in notes[1:]]
    click.echo(decision + "\n".join(role_notes) + "\n\n" + format_operations(host.name, planned_operations(state, host)),
               err=True)
