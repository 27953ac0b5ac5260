"""The multinode role with the others, planned in-process on recorded hosts (test_injection's
InProcessPlan; @fake hosts because V100s cannot be had here): a fresh worker gets Ray, its env file
and a running Ray worker, and no API unit; a fresh head gets the Ray unit before qwen27b.service,
which the service role starts; members that already hold all of it plan zero changes (the second
run changes nothing); a host that left its group loses the Ray unit.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

from qwen27b.controller.render import render, render_all
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.controller.render_group import ray_context
from qwen27b.onhost.contract import FIREWALL_UNIT, RAY_UNIT
from qwen27b.plan.inventory import validate_inventory
from qwen27b.plan.multinode import Member, plan_group
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts
from tests.support.inprocess import HOSTS_DIR, InProcessPlan
from tests.support.recorded import fake_responses

STACK = load_stack()
GROUP = {"qwen27b_node_group": "pair-a", "qwen27b_node_interface": "enp65s0f0", "qwen27b_interconnect_gbps": 25}
UNIT_FILE = f"/etc/systemd/system/{RAY_UNIT}"


@pytest.fixture(scope="module")
def planner():
    saved = os.environ.get("QWEN27B_CACHE")  # InProcessPlan points it at an empty cache: restored after,
    try:  # or a later module of this process looks for the controller's cache there
        with tempfile.TemporaryDirectory(prefix="qwen27b-multinode-") as cache:
            yield InProcessPlan(Path(cache))
    finally:
        if saved is None:
            os.environ.pop("QWEN27B_CACHE", None)
        else:
            os.environ["QWEN27B_CACHE"] = saved


def members(recording: str) -> tuple[dict, dict]:
    """(host data by role, decision by role): the pipeline step planned directly, so that a
    recording whose GPUs could serve alone stands for a member too."""
    data = {"head": {**GROUP, "qwen27b_node_role": "head", "qwen27b_node_address": "10.10.0.1",
                     "qwen27b_bind_address": "10.10.0.1"},
            "worker": {**GROUP, "qwen27b_node_role": "worker", "qwen27b_node_address": "10.10.0.2"}}
    settings = validate_inventory(list(data.items()))
    decisions = plan_group("pair-a", [Member(role, recorded_facts(recording), settings[role], data[role][
        "qwen27b_node_address"]) for role in data], STACK, "test")
    assert all(d.group is not None for d in decisions.values()), decisions
    return data, decisions


def plan(planner, recording, data, decision, responses=None):
    if responses is not None:  # these answers first: the @fake connector takes the first match
        recorded = fake_responses(HOSTS_DIR / recording)
        data = {**data, "fake_responses": {**responses, **{k: v for k, v in recorded.items() if k not in responses}}}
    return dict(planner(recording, data, decision))


def test_fresh_worker_gets_ray_its_env_and_a_running_ray_worker_but_no_api(planner):
    data, decisions = members("v100x2-16gb")
    ops = plan(planner, "v100x2-16gb", data["worker"], decisions["worker"])
    assert ops["Ray into the release venv (vLLM's executor across hosts)"] == [
        "/opt/qwen27b/releases/cc145ac8918e/venv/bin/python -m pip install 'ray[cgraph]>=2.48'"]
    assert f"render {UNIT_FILE}" in ops and "render /etc/qwen27b/qwen27b.env" in ops
    assert ops[f"restart {RAY_UNIT} (the Ray worker: config, release or weights changed)"] == [
        f"systemctl restart --no-block {RAY_UNIT}"]
    assert not [name for name in ops if "qwen27b.service" in name or "qwen27b-health." in name or "health-http" in name]
    names = list(ops)  # the group's ports are guarded before Ray listens
    assert names.index("load the firewall rule") < names.index(f"render {UNIT_FILE}")


def test_fresh_head_writes_the_ray_unit_before_the_service_that_starts_it(planner):
    data, decisions = members("v100x2-16gb")
    ops = plan(planner, "v100x2-16gb", data["head"], decisions["head"])
    names = list(ops)
    assert names.index(f"render {UNIT_FILE}") < names.index("render /etc/systemd/system/qwen27b.service")
    assert "restart qwen27b.service (config, release or weights changed)" in ops
    assert not [name for name in names if name.startswith(f"restart {RAY_UNIT}")]  # PartOf=: restarted with it


def _converged(decision, role: str) -> dict:
    """What the converged fixture answers once it is this member: Ray in the venv, the Ray unit,
    the group's env file and firewall, the units running (record_state's helpers)."""
    spec = importlib.util.spec_from_file_location("record_state", HOSTS_DIR / "v100x4-converged" / "record_state.py")
    rs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rs)
    recorded = fake_responses(HOSTS_DIR / "v100x4-converged")
    venv_key = next(k for k in recorded if str(k).endswith("venv/bin/python -I -c"))
    responses = {venv_key: {"stdout": recorded[venv_key]["stdout"] + ["ray==2.60.0"], "success": True},
                 "dpkg -l": {"stdout": recorded["dpkg -l"]["stdout"] + ["ii  nftables  1.0  amd64  installed"],
                             "success": True}}
    states = [(FIREWALL_UNIT, "exited")] + ([(RAY_UNIT, "running")] if role == "worker" else [])
    for unit, sub in states:
        responses[f"systemctl show --all --property Id --property SubState {unit}"] = {
            "stdout": [f"Id={unit}", f"SubState={sub}"], "success": True}
        responses[f"systemctl show --all --property Id --property UnitFileState {unit}"] = {
            "stdout": [f"Id={unit}", "UnitFileState=enabled"], "success": True}
    rendered, contexts = render_all(decision), firewall_contexts(decision)
    files = [(UNIT_FILE, render("qwen27b-ray.service.j2", ray_context(decision))),
             ("/etc/qwen27b/qwen27b.env", rendered["qwen27b.env.j2"]),
             ("/etc/qwen27b/firewall.nft", render("qwen27b-firewall.nft.j2", contexts["qwen27b-firewall.nft.j2"])),
             (f"/etc/systemd/system/{FIREWALL_UNIT}", render("qwen27b-firewall.service.j2",
                                                              contexts["qwen27b-firewall.service.j2"]))]
    if role == "head":
        files += [(f"/etc/systemd/system/{template[:-3]}", rendered[template]) for template in rendered
                  if template != "qwen27b.env.j2"]
        # the head's release record (roles/service.py): its URL is the head's, not the fixture's
        files.append((rs.release_record_file(decision.stack.paths), rs.record_text(rs.release_record(decision))))
    for dest, text in files:
        for entry in rs.put(dest, text.encode()):
            responses[entry["match"]] = {"stdout": entry["stdout"], "success": True}
    return responses


@pytest.mark.parametrize("role", ["worker", "head"])
def test_a_converged_member_plans_no_change(planner, role):
    data, decisions = members("v100x4-converged")
    ops = plan(planner, "v100x4-converged", data[role], decisions[role], _converged(decisions[role], role))
    assert {name: commands for name, commands in ops.items() if commands} == {}
    if role == "worker":
        assert f"{RAY_UNIT} enabled and running" in ops


def test_a_host_that_left_its_group_loses_the_ray_unit(planner):
    from qwen27b.plan.gate import decide
    from qwen27b.plan.hostdata import settings_for

    host = "v100x4-converged"
    decision = decide(host, recorded_facts(host), STACK, settings_for(host, {}))
    ops = plan(planner, host, {}, decision, {f"test -e {UNIT_FILE} ": {"stdout": [
        f"user=root group=root mode=-rw-r--r-- atime=1 mtime=1 ctime=1 size=900 '{UNIT_FILE}'"], "success": True}})
    assert f"stop {RAY_UNIT} (no longer in a serving group)" in ops and "systemd daemon-reload (Ray unit removed)" in ops
    assert ops[f"remove {UNIT_FILE}"] == [f"rm -f {UNIT_FILE}"]
