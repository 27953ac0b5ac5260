"""A lab's unit taken over by a deploy (roles/takeover.py, plan/foreignunit.py) put back: by
`qwen27b rollback` when there is no earlier release of ours to go back to, and by `qwen27b uninstall`
(the kept copies moved to /run first, since the uninstall removes the state dir; restored last)."""

from __future__ import annotations

import dataclasses
import shlex

import click
from pyinfra import host, state
from pyinfra.operations import server

from qwen27b.controller.facts import UnitFiles
from qwen27b.controller.opsplan import planned_operations
from qwen27b.controller.report import format_operations
from qwen27b.plan.foreignunit import foreign, restore_commands
from qwen27b.plan.hostlayout import UNIT_DIR, HostLayout
from qwen27b.plan.lifecycle import SERVICE_UNITS, Installed

from ._run import release_lock, take_lock

STAGED = "/run/qwen27b-takeover"  # the uninstall's copy of the kept take-over, outside what it removes


def kept(paths: dict) -> list[str]:
    """The kept take-over's manifest lines on this host ([]: nothing taken over)."""
    return (host.get_fact(UnitFiles, path=HostLayout.of(paths).state) or {}).get("kept", [])


def spare_foreign(have: Installed, paths: dict) -> tuple[Installed, list[str]]:
    """What the uninstall sees, less the lab's own units on our names (never ours to stop or remove),
    and a line for each kept."""
    lab = [u.name for u in foreign(host.get_fact(UnitFiles, path=HostLayout.of(paths).state))]
    files = {f"{UNIT_DIR}/{name}" for name in lab}
    return (dataclasses.replace(have, paths={p: o for p, o in have.paths.items() if p not in files},
                                units={u: s for u, s in have.units.items() if u not in lab}),
            [f"{UNIT_DIR}/{name}: the lab's own unit (not rendered by qwen27b), left as it is" for name in lab])


def units(manifest: list[str]) -> str:
    return ", ".join(line.split()[1] for line in manifest if line.startswith("unit "))


def restore_on_rollback(paths: dict) -> bool:
    """Queue the taken-over unit's return (ours stopped and disabled first) under the host's lock, and
    print the plan; whether it was queued (False: the lock is held)."""
    if not take_lock():
        return False
    manifest = kept(paths)
    server.shell(name=f"rollback: put back {units(manifest)} (taken over by the first deploy), ours stopped",
                 commands=restore_commands(HostLayout.of(paths).takeover_dir, list(SERVICE_UNITS)))
    release_lock()
    click.echo(f"== {host.name}: rollback plan\n   no earlier release of qwen27b here: put back {units(manifest)}, "
               "the lab's unit the first deploy took over\n\n" + format_operations(host.name, planned_operations(state, host)),
               err=True)
    return True


def stage_for_uninstall(paths: dict) -> None:
    """Before the uninstall's removals: the kept copies moved to /run."""
    manifest = kept(paths)
    if manifest:
        server.shell(name=f"uninstall: keep the taken-over {units(manifest)} aside in {STAGED}",
                     commands=[f"rm -rf {STAGED}",
                               f"cp -a {shlex.quote(HostLayout.of(paths).takeover_dir)} {STAGED}"])


def restore_after_uninstall(manifest: list[str]) -> None:
    if manifest:
        server.shell(name=f"uninstall: put back {units(manifest)} (taken over by the deploy)",
                     commands=restore_commands(STAGED, list(SERVICE_UNITS)))
