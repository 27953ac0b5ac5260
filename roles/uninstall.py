"""Uninstall: remove what the deploy made, each removal listed in the plan first.

The service, its health check, endpoint and timer, a seed server, the firewall unit and its
nftables table, the unit files, /opt/qwen27b (release venvs, uv, Python, wheelhouse),
/etc/qwen27b (env files, keys, tokens, release records), /var/lib/qwen27b, apt's proxy setting and
login, /run/qwen27b, node_exporter's qwen27b.prom, the service user and group. The weights (20+ GiB) stay unless
qwen27b_uninstall_weights is set (a later deploy then uses them again instead of fetching); the
NVIDIA driver, its apt hold and the nouveau blacklist stay unless qwen27b_uninstall_driver is set
(node_exporter, a package of the OS, stays: others may scrape it). The DeployedState fact reads what is
there; qwen27b.plan.lifecycle.uninstall_plan decides; only what is there is removed, so a second run
plans nothing, and the host can be deployed again afterwards.
"""

from __future__ import annotations

import click
from pyinfra import host, state
from pyinfra.operations import server

from qwen27b.controller import factcache, oporder
from qwen27b.controller.facts import HeldPackages, NvidiaCudaPackages, UnitFiles
from qwen27b.controller.host_facts import DeployedState
from qwen27b.controller.opsplan import planned_operations
from qwen27b.plan.hostlayout import UNIT_DIR, HostLayout
from qwen27b.controller.report import format_operations
from qwen27b.onhost.contract import TEXTFILE_DIR, TEXTFILE_NAME
from qwen27b.plan.lifecycle import (GATEWAY_USER, LOCK_DIR, NFT_TABLE, SERVICE_UNITS, Installed, UninstallOptions, probe_paths,
                                    uninstall_plan)
from qwen27b.plan.chatpage import USER as CHAT_PAGE_USER
from qwen27b.plan.gateway import plan_gateways, uninstall_notes
from qwen27b.plan.stack import load_stack, with_models_dir

from qwen27b.controller.runlife import inventory_settings

from ._run import release_lock, take_lock
from ._takeover import kept as taken_over, restore_after_uninstall, spare_foreign, stage_for_uninstall, units

TEXTFILE = f"{TEXTFILE_DIR}/{TEXTFILE_NAME}"


def uninstall() -> bool:
    """Print this host's uninstall plan and queue its removals. Returns whether anything is queued."""
    oporder.register_deploy_file(state.current_deploy_filename)
    settings = inventory_settings()[host.name]  # bad inventory stops the run before any fact is read
    paths = with_models_dir(load_stack()["paths"], settings.models_dir)  # qwen27b_models_dir: the weights there
    probe = {"paths": probe_paths(paths, UNIT_DIR, TEXTFILE), "units": list(SERVICE_UNITS),
             "accounts": [HostLayout.of(paths).service_user, GATEWAY_USER, CHAT_PAGE_USER], "nft_table": NFT_TABLE}
    factcache.prefetch([(DeployedState, probe), (HeldPackages, {}), (NvidiaCudaPackages, {}),
                        (UnitFiles, {"path": HostLayout.of(paths).state})])
    have = Installed(**host.get_fact(DeployedState, **probe), held=host.get_fact(HeldPackages) or [],
                     packages=host.get_fact(NvidiaCudaPackages) or {})
    options = UninstallOptions(weights=settings.uninstall_weights, driver=settings.uninstall_driver,
                               chat_data=settings.uninstall_chat_data)
    have, lab_units = spare_foreign(have, paths)
    removals, kept = uninstall_plan(have, paths, options, UNIT_DIR, TEXTFILE)
    kept += lab_units
    lines = [f"== {host.name}: uninstall plan ({len(removals)} removal(s))"]
    lines += [f"   remove {r.what}: {r.why}" for r in removals] or ["   nothing (more) to remove on this host"]
    lines += [f"   keep   {what}" for what in kept]
    if removals:  # a gateway's backend list is the gateway's: said here, changed by deploying the gateway
        plans = plan_gateways([(h.name, dict(h.data.dict())) for h in state.inventory],
                              {h.name: set(h.groups) for h in state.inventory}, inventory_settings())
        lines += [f"   note   {note}" for note in uninstall_notes(plans, host.name)]
    taken = taken_over(paths)  # a lab's unit the deploy took over: put back after ours are gone (roles/_takeover.py)
    lines += [f"   put back {units(taken)}: the lab's unit the deploy took over (qwen27b_take_over_unit)"] if taken else []
    if (removals or taken) and take_lock():
        stage_for_uninstall(paths)
        for removal in removals:
            server.shell(name=f"uninstall: {removal.what}", commands=list(removal.commands))
        restore_after_uninstall(taken)
        release_lock()
        # the lock's directory last, once the lock is released (nothing of the deploy stays in /run)
        server.shell(name=f"uninstall: {LOCK_DIR}", commands=[f"rmdir {LOCK_DIR} 2>/dev/null || true"])
    click.echo("\n".join(lines) + "\n\n" + format_operations(host.name, planned_operations(state, host)), err=True)
    return bool(removals or taken)
