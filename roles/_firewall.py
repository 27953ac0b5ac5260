"""The firewall's shared step (a serving host's roles/firewall.py, a gateway host's roles/gateway.py): an
nftables table of its own, loaded by a oneshot unit the guarded units require (fail closed at boot); a new rule
file checked with `nft -c`, swapped in one transaction, so a broken one leaves the old table loaded (test:
tests/unit/slow/test_firewall_swap.py); removed, unlinked before it is stopped, when the host data drops it."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.operations import files, server, systemd

from qwen27b.controller.render import render
from qwen27b.onhost.contract import FIREWALL_UNIT
from qwen27b.plan.hostlayout import HostLayout

from ._common import apt_install, note

UNIT_FILE = HostLayout.unit_file(FIREWALL_UNIT)


def load_commands(rules_file: str) -> list[str]:
    """Check the new rule file, then swap it in. The file replaces the table in one transaction
    (`nft -f` of `table; delete table; table {...}`): one that fails leaves the old table loaded. A
    restart would run ExecStop's `delete table` first (no table while vLLM serves, if the new one
    then failed) and, through the guarded units' Requires=, restart them: reload, or start when
    not active. `reenable`: the `.requires/` links follow the unit's RequiredBy= (copies replacing
    one service, node_exporter added), none left behind."""
    return [f"nft -c -f {rules_file}", f"systemctl reenable {FIREWALL_UNIT}",
            f"systemctl reload-or-restart {FIREWALL_UNIT}"]


# Unlinked from the guarded units first (disable, then daemon-reload drops the loaded Requires=), and
# only then stopped: stopping a unit others require would stop them with it (a serving vLLM).
REMOVE_COMMANDS = [f"systemctl disable {FIREWALL_UNIT}", "systemctl daemon-reload", f"systemctl stop {FIREWALL_UNIT}",
                   f"rm -f {UNIT_FILE}", "systemctl daemon-reload"]


def apply_firewall(contexts: dict[str, dict]) -> None:
    """The rule and its unit from `contexts` (controller/render_firewall.firewall_contexts or
    gateway_render.firewall_contexts); none: the table and unit removed where a deploy made them."""
    if not contexts:
        if host.get_fact(File, path=UNIT_FILE):
            server.shell(name=f"unlink, stop and remove {FIREWALL_UNIT} (qwen27b_firewall_allow unset)",
                         commands=REMOVE_COMMANDS)
        return
    context = contexts["qwen27b-firewall.nft.j2"]
    for rule in context["rules"]:
        networks = ", ".join(n for _, n in rule["allowed"])
        note(f"firewall: port {rule['port']}/tcp only from " + (f"{networks} and the host itself" if networks else
             "the host itself") + f", {rule['what']} (nftables table inet qwen27b)")
    apt_install("nftables (the firewall rule's tool)", ["nftables"])
    rules = files.put(name="render the firewall rule", src=StringIO(render("qwen27b-firewall.nft.j2", context)),
                      dest=context["rules_file"], user="root", group="root", mode="0644")
    unit = files.put(name=f"render {UNIT_FILE}", src=StringIO(render("qwen27b-firewall.service.j2", context)),
                     dest=UNIT_FILE, user="root", group="root", mode="0644")
    if unit.will_change:
        systemd.daemon_reload(name="systemd daemon-reload (firewall unit changed)")
    if rules.will_change or unit.will_change:
        server.shell(name="load the firewall rule", commands=load_commands(context["rules_file"]))
    else:
        systemd.service(name=f"{FIREWALL_UNIT} enabled and active", service=FIREWALL_UNIT, running=True, enabled=True)
