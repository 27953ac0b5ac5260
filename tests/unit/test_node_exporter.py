"""qwen27b_node_exporter on recorded hosts, planned in-process (test_injection's InProcessPlan): a
fresh host gets Debian's prometheus-node-exporter without Recommends, its textfile directory
writable by the service user, the service enabled and running, and the firewall rule for the
scrapers; a host already holding all that plans zero changes (the second run changes nothing)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

from qwen27b.controller.host_facts import DirectoryStates
from qwen27b.controller.render import render, render_all
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.onhost.contract import FIREWALL_UNIT
from qwen27b.plan.settings import NODE_EXPORTER_UNIT
from qwen27b.onhost.contract import TEXTFILE_DIR
from qwen27b.plan.gate import decide
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts
from roles.node_exporter import textfile_dir_spec
from tests.support.inprocess import HOSTS_DIR, InProcessPlan
from tests.support.recorded import fake_responses

STACK = load_stack()
DATA = {"qwen27b_node_exporter": True, "qwen27b_metrics_allow": ["10.0.0.5/32"]}


def _record_state():
    """The converged fixture's own helpers (put, stat_of): the same fact answers, one definition."""
    path = HOSTS_DIR / "v100x4-converged" / "record_state.py"
    spec = importlib.util.spec_from_file_location("record_state", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def planner():
    with tempfile.TemporaryDirectory(prefix="qwen27b-node-exporter-") as cache:
        yield InProcessPlan(Path(cache))


def plan(planner, host: str, data: dict, responses: dict | None = None) -> dict[str, list[str]]:
    decision = decide(host, recorded_facts(host), STACK, settings_for(host, data))
    if responses is not None:  # these answers first: the @fake connector takes the first match
        recorded = fake_responses(HOSTS_DIR / host)
        data = {**data, "fake_responses": {**responses, **{k: v for k, v in recorded.items() if k not in responses}}}
    return dict(planner(host, data, decision))


def test_fresh_host_gets_node_exporter_its_textfile_dir_and_the_scrapers_rule(planner):
    ops = plan(planner, "v100x4-2204-fresh", DATA)
    install_name = "prometheus-node-exporter (node_exporter, from the OS archive)"
    install = ops[install_name]
    assert any("install" in c and "--no-install-recommends" in c and "prometheus-node-exporter" in c for c in install)
    assert ops["node_exporter's textfile dir, writable by qwen27b"] == [
        f"mkdir -p {TEXTFILE_DIR}", f"chown root:qwen27b {TEXTFILE_DIR}", f"chmod 2775 {TEXTFILE_DIR}"]
    assert ops[f"{NODE_EXPORTER_UNIT} enabled and running"] == [f"systemctl start {NODE_EXPORTER_UNIT}",
                                                               f"systemctl enable {NODE_EXPORTER_UNIT}"]
    assert ops["load the firewall rule"] == ["nft -c -f /etc/qwen27b/firewall.nft",
                                             f"systemctl reenable {FIREWALL_UNIT}", f"systemctl reload-or-restart {FIREWALL_UNIT}"]
    assert ops["(re)start qwen27b-health-http.socket (its unit changed)"]
    names = list(ops)  # the rule first: node_exporter never listens unguarded
    assert names.index("load the firewall rule") < names.index(install_name)


def test_without_the_key_nothing_of_node_exporter_is_planned(planner):
    ops = plan(planner, "v100x4-2204-fresh", {})
    assert not [name for name in ops if "node_exporter" in name or "node-exporter" in name or "firewall" in name]


def test_a_converged_host_with_node_exporter_plans_no_change(planner):
    """The converged fixture plus what node_exporter adds, as the host answers once it is there: the
    package, the directory (2775 root:qwen27b), the units running and the rendered files."""
    rs, host = _record_state(), "v100x4-converged"
    decision = decide(host, recorded_facts(host), STACK, settings_for(host, DATA))
    dpkg = fake_responses(HOSTS_DIR / host)["dpkg -l"]["stdout"]
    path, owner, group, mode = textfile_dir_spec("qwen27b")
    responses = {
        "dpkg -l": {"stdout": dpkg + [f"ii  {p}  1.0  amd64  installed" for p in ("prometheus-node-exporter", "nftables")],
                    "success": True},
        DirectoryStates().command([path]): {"stdout": [f"{mode} {owner} {group} directory"], "success": True},
    }
    for unit, sub in ((NODE_EXPORTER_UNIT, "running"), (FIREWALL_UNIT, "exited")):
        responses[f"systemctl show --all --property Id --property SubState {unit}"] = {
            "stdout": [f"Id={unit}", f"SubState={sub}"], "success": True}
        responses[f"systemctl show --all --property Id --property UnitFileState {unit}"] = {
            "stdout": [f"Id={unit}", "UnitFileState=enabled"], "success": True}
    contexts = firewall_contexts(decision)
    rendered = render_all(decision)
    files = [(decision.stack.paths["config"] + "/firewall.nft", render("qwen27b-firewall.nft.j2", contexts["qwen27b-firewall.nft.j2"])),
             (f"/etc/systemd/system/{FIREWALL_UNIT}", render("qwen27b-firewall.service.j2",
                                                              contexts["qwen27b-firewall.service.j2"])),
             ("/etc/systemd/system/qwen27b-health-http.socket", rendered["qwen27b-health-http.socket.j2"]),
             # the service Requires= the firewall now there is one
             ("/etc/systemd/system/qwen27b.service", rendered["qwen27b.service.j2"])]
    for dest, text in files:
        for entry in rs.put(dest, text.encode()):
            responses[entry["match"]] = {"stdout": entry["stdout"], "success": True}
    ops = plan(planner, host, DATA, responses)
    assert f"{NODE_EXPORTER_UNIT} enabled and running" in ops and f"{FIREWALL_UNIT} enabled and active" in ops
    assert {name: commands for name, commands in ops.items() if commands} == {}
