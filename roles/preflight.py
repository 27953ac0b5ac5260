"""Preflight: read the host's facts, run the compatibility gate, print the plan.

Nothing here changes a host. Bad inventory data stops the whole run before any host is touched;
a host the gate refuses is marked failed (so the run exits non-zero) and gets no operations.
"""

from __future__ import annotations

import click
from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError

from qwen27b import facts as F
from qwen27b.gate import Decision, HostFacts, RefusedHost, decide
from qwen27b.hostdata import BadHostData, Settings, lab_address, validate_inventory
from qwen27b.opsplan import planned_operations
from qwen27b.report import format_decision, format_operations, format_refusal
from qwen27b.stack import load_stack

from ._common import note, take_notes

_validated: dict[int, dict[str, Settings]] = {}


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
    return _validated[key]


def gather_facts(models_path: str) -> HostFacts:
    os_release = host.get_fact(F.OsRelease)
    return HostFacts(
        os=os_release,
        kernel=host.get_fact(F.KernelRelease),
        gpus=host.get_fact(F.NvidiaGpus) or [],
        pci_gpus=host.get_fact(F.NvidiaPciDevices) or [],
        kernel_module=host.get_fact(F.NvidiaKernelModule) or {},
        nouveau_loaded=bool(host.get_fact(F.NouveauLoaded)),
        secure_boot=host.get_fact(F.SecureBoot) or "unsupported",
        disk=host.get_fact(F.DiskFree, path=models_path),
        memory=host.get_fact(F.MemoryInfo),
        pythons=host.get_fact(F.PythonVersions) or {},
        xids=host.get_fact(F.XidErrors) or [],
        packages=host.get_fact(F.NvidiaCudaPackages) or {},
        held=host.get_fact(F.HeldPackages) or [],
    )


def preflight() -> Decision | None:
    """The plan for this host, printed; None when refused (the host is then marked failed)."""
    settings = inventory_settings()[host.name]
    stack = load_stack()
    facts = gather_facts(stack["paths"]["models"])
    try:
        decision = decide(host.name, facts, stack, settings, bind_address=lab_address(dict(host.data.dict())))
    except RefusedHost as refused:
        click.echo(format_refusal(refused), err=True)
        state.fail_hosts({host})
        return None
    note(format_decision(decision))
    return decision


def show_planned_operations() -> None:
    """Print this host's whole plan in one block: decision, role notes, operations with commands."""
    notes = take_notes()
    decision, role_notes = notes[0], [f"   {n}" for n in notes[1:]]
    click.echo(decision + "\n".join(role_notes) + "\n\n" + format_operations(host.name, planned_operations(state, host)),
               err=True)
