"""The firewall fails closed (issue 25): a new rule file that does not load leaves the old table in
place, and the units it guards need it at boot.

The swap runs for real: the firewall role's planned "load the firewall rule" commands, in a network
namespace of their own (`unshare --net`: the namespace goes with the process), with the rendered
unit's ExecStart/ExecReload/ExecStop played by a `systemctl` stand-in. Before, the role ran
`systemctl restart`: ExecStop deleted the table, the broken file then loaded nothing, and vLLM kept
serving with no rule at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from qwen27b.controller.render import render, render_all
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.onhost.contract import FIREWALL_UNIT
from qwen27b.plan.gate import decide
from qwen27b.plan.hostdata import settings_for
from recordings import recorded_facts
from tests.support.inprocess import STACK, InProcessPlan

HOST = "v100x4-2204-fresh"
DATA = {"qwen27b_firewall_allow": ["10.0.0.0/24"]}
needs_netns = pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None or os.geteuid() != 0,
                                 reason="needs nft, unshare and root (a network namespace of the test's own)")

# `systemctl VERB UNIT` for the firewall unit: its Exec lines from the rendered unit file; "active"
# is a file, as systemd's state would be.
SYSTEMCTL = r"""#!/bin/sh
verb=$1; unit=$2; dir=$(dirname "$0")
run() { sed -n "s|^$1=||p" "$dir/unit" | sh -e || exit 1; }
case $verb in
  enable|reenable|disable|daemon-reload) exit 0 ;;
  start) run ExecStart && touch "$dir/active" ;;
  stop) run ExecStop; rm -f "$dir/active" ;;
  restart) [ -e "$dir/active" ] && run ExecStop; rm -f "$dir/active"; run ExecStart && touch "$dir/active" ;;
  reload|reload-or-restart|try-reload-or-restart)
    if [ -e "$dir/active" ]; then run ExecReload; else run ExecStart && touch "$dir/active"; fi ;;
  *) echo "systemctl stand-in: $verb" >&2; exit 2 ;;
esac
"""


def planned_load_commands(decision, monkeypatch) -> list[str]:
    monkeypatch.setenv("QWEN27B_CACHE", "")  # InProcessPlan sets it: restored after the test
    with tempfile.TemporaryDirectory(prefix="qwen27b-fw-") as cache:
        ops = InProcessPlan(Path(cache))(HOST, DATA, decision)
    found = [commands for op, commands in ops if op == "load the firewall rule"]
    assert found, [op for op, _ in ops]
    return found[0]


def swap_then_break(tmp_path, context: dict, planned: list[str]) -> tuple[str, str]:
    """The rule of `context` loaded by the `planned` commands, then a broken file through the same
    commands (which must fail): the table listed before and after, as nft prints it."""
    live = context["rules_file"]
    rules = tmp_path / "firewall.nft"
    commands = [c.replace(live, str(rules)) for c in planned]
    good = render("qwen27b-firewall.nft.j2", context)
    # what a bad value once rendered: the template's header (the swap), then a line nft cannot parse
    broken = good.replace("ip saddr 10.0.0.0/24", "ip6 saddr fe80::%eth0;touch/64")
    assert broken != good
    (tmp_path / "unit").write_text(render("qwen27b-firewall.service.j2", context).replace(live, str(rules)))
    (tmp_path / "systemctl").write_text(SYSTEMCTL)
    (tmp_path / "systemctl").chmod(0o755)
    step = "\n".join(commands)
    script = f"""
set -u
cp {tmp_path}/good.nft {rules}
( set -e
{step}
) || exit 10
nft list table inet qwen27b > {tmp_path}/before.txt || exit 11
cp {tmp_path}/broken.nft {rules}
( set -e
{step}
) && exit 12
nft list table inet qwen27b > {tmp_path}/after.txt || exit 13
"""
    (tmp_path / "good.nft").write_text(good)
    (tmp_path / "broken.nft").write_text(broken)
    result = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert result.returncode == 0, (result.returncode, commands, result.stderr)
    return (tmp_path / "before.txt").read_text(), (tmp_path / "after.txt").read_text()


@needs_netns
def test_a_rule_file_that_does_not_load_leaves_the_old_table(tmp_path, monkeypatch):
    decision = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, DATA))
    context = firewall_contexts(decision)["qwen27b-firewall.nft.j2"]
    before, after = swap_then_break(tmp_path, context, planned_load_commands(decision, monkeypatch))
    assert "ip saddr 10.0.0.0/24" in before
    assert after == before  # the old table, whole


def test_the_units_the_firewall_guards_require_it_through_its_own_unit():
    """Fail closed at boot without touching the guarded units' files: the firewall unit's RequiredBy=
    links it into each one's .requires/ when enabled, its Before= orders it first. The service's unit
    file is the same with or without the firewall, so adding or removing it restarts no vLLM."""
    guarded = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, DATA))
    unit = render("qwen27b-firewall.service.j2", firewall_contexts(guarded)["qwen27b-firewall.service.j2"]).splitlines()
    assert "RequiredBy=qwen27b.service" in unit and "Before=qwen27b.service" in unit
    open_host = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, {}))
    assert render_all(guarded)["qwen27b.service.j2"] == render_all(open_host)["qwen27b.service.j2"]
    assert FIREWALL_UNIT not in render_all(guarded)["qwen27b.service.j2"]
    node = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, {**DATA, "qwen27b_node_exporter": True}))
    assert "RequiredBy=qwen27b.service prometheus-node-exporter.service" in \
        render("qwen27b-firewall.service.j2", firewall_contexts(node)["qwen27b-firewall.service.j2"]).splitlines()


def test_removing_the_firewall_unlinks_it_before_stopping_it():
    """Stopping a unit that others require stops them too: disable (drops the .requires/ links) and
    daemon-reload come first, so removing the firewall leaves a serving vLLM running."""
    from roles.firewall import REMOVE_COMMANDS
    order = [c.split()[1] if c.startswith("systemctl") else c.split()[0] for c in REMOVE_COMMANDS]
    assert order.index("disable") < order.index("daemon-reload") < order.index("stop")
    assert order[-1] == "daemon-reload" and f"rm -f /etc/systemd/system/{FIREWALL_UNIT}" in REMOVE_COMMANDS


@needs_netns
def test_the_gateways_rule_loads_and_guards_its_api_chat_page_and_usage_ports(tmp_path):
    """A gateway host's rule (gateway_render.firewall_contexts), loaded for real by nft in a network
    namespace of the test's own: the API's and the chat page's ports from qwen27b_firewall_allow, the
    usage counters' port from qwen27b_gateway_metrics_allow, loopback always; the unit requires the
    gateway's unit (fail closed at boot)."""
    import dataclasses

    from qwen27b.controller import gateway_render as G
    from qwen27b.plan.chatpage import ChatPage
    from qwen27b.plan.gateway import Backend, GatewayPlan

    page = ChatPage(port=8080, admin_email="admin@qwen27b.lab", accounts=())
    plan = GatewayPlan("gw", "10.0.0.9", 8000, ("k",), (Backend("b", "10.0.0.21", 8000, 9120),), None, None, 600,
                       metrics_allow=("10.0.0.5/32",), chat_page=page, firewall_allow=("10.0.0.0/24", "fd00::/8"))
    context = G.firewall_contexts(plan)["qwen27b-firewall.nft.j2"]
    assert [(r["port"], [n for _, n in r["allowed"]]) for r in context["rules"]] == [
        (8000, ["10.0.0.0/24", "fd00::/8"]), (8080, ["10.0.0.0/24", "fd00::/8"]), (9121, ["10.0.0.5/32"])]
    assert "RequiredBy=qwen27b-gateway.service" in render("qwen27b-firewall.service.j2", context).splitlines()
    assert G.firewall_contexts(dataclasses.replace(plan, firewall_allow=None)) == {}
    rules = tmp_path / "gateway.nft"
    rules.write_text(render("qwen27b-firewall.nft.j2", context))
    result = subprocess.run(["unshare", "--net", "sh", "-c", f"nft -f {rules} && nft list table inet qwen27b"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "ip saddr 10.0.0.0/24 tcp dport 8080 accept" in result.stdout
    assert "ip6 saddr fd00::/8 tcp dport 8000 accept" in result.stdout
    assert "tcp dport 9121 reject with tcp reset" in result.stdout


@needs_netns
def test_a_gateway_rule_file_that_does_not_load_leaves_the_gateway_closed(tmp_path):
    """Issue 56 item 3: a gateway host's rule goes through the same shared step (roles/_firewall.py
    apply_firewall plans load_commands for its rule file), so a broken file there also fails the
    deploy and leaves the gateway's old table loaded, its API and chat page ports still closed to
    other networks, never an open host."""
    from qwen27b.controller import gateway_render as G
    from qwen27b.plan.chatpage import ChatPage
    from qwen27b.plan.gateway import Backend, GatewayPlan
    from roles._firewall import load_commands

    page = ChatPage(port=8080, admin_email="admin@qwen27b.lab", accounts=())
    plan = GatewayPlan("gw", "10.0.0.9", 8000, ("k",), (Backend("b", "10.0.0.21", 8000, 9120),), None, None, 600,
                       chat_page=page, firewall_allow=("10.0.0.0/24",))
    context = G.firewall_contexts(plan)["qwen27b-firewall.nft.j2"]
    before, after = swap_then_break(tmp_path, context, load_commands(context["rules_file"]))
    for port in (8000, 8080):
        assert f"ip saddr 10.0.0.0/24 tcp dport {port} accept" in before
        assert f"tcp dport {port} reject with tcp reset" in before
    assert after == before


@needs_netns
def test_the_uninstalls_table_removal_passes_after_the_firewall_units_stop_removed_it(tmp_path):
    """Found by the gateway module's uninstall on a test host (issue 56): the plan stops the firewall unit,
    whose ExecStop deletes the table, then ran `nft delete table inet qwen27b`, which failed on the table
    already gone and stopped the uninstall half way. Run for real in a network namespace: the table
    loaded, the unit's ExecStop, then the removal's commands pass; a table loaded by hand (no unit) is
    deleted by them."""
    from qwen27b.plan.lifecycle import NFT_TABLE, Installed, UninstallOptions, uninstall_plan
    from qwen27b.plan.stack import load_stack

    have = Installed(units={FIREWALL_UNIT: "active"}, nft=[NFT_TABLE])
    (removal,) = [r for r in uninstall_plan(have, load_stack()["paths"], UninstallOptions(), "/etc/systemd/system",
                                            "/x/q.prom")[0] if r.what == f"nftables table {NFT_TABLE}"]
    decision = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, DATA))
    context = firewall_contexts(decision)["qwen27b-firewall.nft.j2"]
    rules = tmp_path / "firewall.nft"
    rules.write_text(render("qwen27b-firewall.nft.j2", context))
    stop = [line.split("=", 1)[1] for line in render("qwen27b-firewall.service.j2", context).splitlines()
            if line.startswith("ExecStop=")]
    assert stop and "delete table" in stop[0]
    remove = " && ".join(f"( {c} )" for c in removal.commands)
    script = (f"nft -f {rules} && {stop[0]} && {remove} || exit 10\n"  # the unit stopped first: gone already
              f"nft -f {rules} && {remove} || exit 11\n"  # loaded by hand: the removal deletes it
              f"! nft list table {NFT_TABLE} >/dev/null 2>&1 || exit 12\n")
    result = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, (result.returncode, removal.commands, result.stderr)
