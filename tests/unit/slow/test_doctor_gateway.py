"""doctor on a gateway host (issue 48 item 6): a host of the qwen27b_gateway group has no
qwen27b.service, model or release venv, and doctor judged it by the serving chain (three false
failures, exit 1). It now reads and judges the gateway's nginx, pool, usage counters and chat page:
through pyinfra's own connectors (@fake hosts answering the recorded script), and from snapshots."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qwen27b.controller import remote
from qwen27b.plan.stack import load_stack
from qwen27b.tools.doctor import HostSnapshot, diagnose
from qwen27b.tools.doctor import gateway as G
from tests.support.doctor_shim import SHIM
from tests.support.paths import ROOT

STACK = load_stack()
ACTIVE = "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n"
HEALTHY = {G.NGINX_SHOW: ACTIVE, G.POOL_SHOW: ACTIVE,
           G.POOL_RECORD: 'age=1\n{"pool": ["gpu-1", "gpu-2"], "drained": [], "failed_open": false}',
           G.LISTEN: "200", G.USAGE: "lua=yes\nseries=12\ncode=200", "chat-page.txt": "LoadState=not-found\n"}


def snapshot(**outputs) -> HostSnapshot:
    return HostSnapshot(host="gw", outputs={**HEALTHY, **outputs}, data={"ssh_hostname": "10.0.0.9"}, gateway=True)


def test_a_healthy_gateway_has_its_own_checks_and_none_of_a_serving_host():
    report = diagnose(snapshot(), STACK)
    assert [(c.check, c.verdict) for c in report.checks] == [
        ("gateway: nginx", "ok"), ("gateway: pool", "ok"), ("gateway: usage counters", "ok")], report.checks
    assert report.first_failure is None and report.unit == "qwen27b-gateway.service"
    assert "http://10.0.0.9:8000/health answers 200" in report.checks[0].evidence


@pytest.mark.parametrize("outputs, check, verdict, words", [
    ({G.NGINX_SHOW: "LoadState=not-found\n"}, "gateway: nginx", "fail", "not installed"),
    ({G.NGINX_SHOW: "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n"}, "gateway: nginx", "fail",
     "failed/failed"),
    ({G.LISTEN: "000"}, "gateway: nginx", "fail", "nothing answers"),
    ({G.LISTEN: "502"}, "gateway: nginx", "warn", "answers 502"),
    ({G.POOL_SHOW: "LoadState=loaded\nActiveState=inactive\nSubState=dead\n"}, "gateway: pool", "fail", "nobody takes"),
    ({G.POOL_RECORD: 'age=1\n{"pool": ["gpu-1"], "drained": ["gpu-2"], "failed_open": false}'}, "gateway: pool", "warn",
     "drained: gpu-2"),
    ({G.POOL_RECORD: 'age=1\n{"pool": ["gpu-1", "gpu-2"], "drained": [], "failed_open": true}'}, "gateway: pool", "fail",
     "failing open"),
    ({G.POOL_RECORD: 'age=400\n{"pool": ["gpu-1"], "drained": []}'}, "gateway: pool", "fail", "not watching"),
    ({G.USAGE: "lua=yes\nseries=0\ncode=000"}, "gateway: usage counters", "fail", "answers 000"),
    ({G.USAGE: "lua=no\nseries=0\ncode=000"}, "gateway: usage counters", "info", "no Lua module"),
    ({"chat-page.txt": "LoadState=loaded\nActiveState=active\nSubState=running\nHealth=000\n"}, "chat page", "fail",
     "answers 000"),
])
def test_each_gateway_fault_is_named_by_its_check(outputs, check, verdict, words):
    report = diagnose(snapshot(**outputs), STACK)
    mine = [c for c in report.checks if c.check == check]
    assert [c.verdict for c in mine] == [verdict] and words in mine[0].evidence, report.checks
    assert (report.first_failure is not None) == (verdict == "fail")


def test_a_gateway_snapshot_is_saved_and_replayed_as_a_gateway(tmp_path):
    snapshot().save(tmp_path / "gw")
    again = HostSnapshot.load(tmp_path / "gw")
    assert again.gateway and diagnose(again, STACK).as_dict() == diagnose(snapshot(), STACK).as_dict()


def test_the_gateways_address_reaches_the_shell_only_as_an_address():
    assert G.where({"ssh_hostname": "gw.lab; rm -rf /", "qwen27b_gateway_port": "80"}, None) == ("http", "127.0.0.1", 8000)
    assert G.where({"qwen27b_gateway_bind_address": "fd00::9", "qwen27b_gateway_port": 8443,
                    "qwen27b_gateway_tls_lab_ca": "~/ca"}) == ("https", "fd00::9", 8443)
    assert "https://[fd00::9]:8443/health" in G.commands(STACK, {"qwen27b_gateway_bind_address": "fd00::9",
                                                                 "qwen27b_gateway_port": 8443,
                                                                 "qwen27b_gateway_tls_cert": "c"})[G.LISTEN]


INVENTORY = """
import json
from pathlib import Path
answers = json.loads(Path("answers.json").read_text())
backend = json.loads(Path("backend.json").read_text())
lab = [("@fake/gpu-1", {**backend, "fake_delay": 0, "ssh_port": 2201, "ssh_user": "doc1"})]
qwen27b_gateway = [("@fake/gw", {"ssh_hostname": "10.0.0.9", "fake_delay": 0, "ssh_port": 2202, "ssh_user": "doc2",
                                "fake_responses": {"@@recorded@@ BEGIN gateway-show.txt": answers.splitlines()}})]
"""


def test_doctor_on_an_inventory_with_a_gateway_judges_the_gateway_as_one_and_exits_0(tmp_path):
    """The real CLI over pyinfra's @fake connector: the gateway host is read with the gateway's script
    (one run) and has no service/model/venv failure; a healthy backend beside it keeps its chain."""
    from tests.support.doctor_shim import phases

    main, http, recorded = phases("cpu-healthy")
    (tmp_path / "answers.json").write_text(json.dumps(remote.render_output(HEALTHY, "recorded")))
    (tmp_path / "backend.json").write_text(json.dumps({**recorded, "fake_responses": {
        "@@recorded@@ BEGIN health.txt": http.splitlines(), "@@recorded@@ BEGIN systemctl-show.txt": main.splitlines()}}))
    (tmp_path / "inventory.py").write_text(INVENTORY)
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", SHIM, "inventory.py", "--json"], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=300)
    reports = {r["host"]: r for r in json.loads(result.stdout or "{}").get("hosts", [])}
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    gw = reports["@fake/gw"]
    assert [c["check"] for c in gw["checks"]] == ["gateway: nginx", "gateway: pool", "gateway: usage counters"], gw
    assert gw["status"] == "ok" and gw["unit"] == "qwen27b-gateway.service"
    runs = [line.split()[1:4] for line in result.stderr.splitlines() if line.startswith("RUN @fake/gw")]
    assert len(runs) == 1, result.stderr[-2000:]  # one script: nothing of a serving host's second (HTTP) phase
    assert reports["@fake/gpu-1"]["status"] in ("ok", "warn"), reports["@fake/gpu-1"]["headline"]
