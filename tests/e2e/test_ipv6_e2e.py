"""An IPv6-only lab, end to end (issue 24): a serving host re-deployed with `qwen27b_bind_address`
and `ssh_hostname` set to its IPv6 address, written bare in the inventory as a person writes it
(`fd00:231:2::2`, no brackets). Before issue 25's URL builder, the unit's start-up probe, the health
check's --url and release.json held `http://fd00:231:2::2:8000`, which curl and httpx reject: the
unit never finished starting.

Real parts only: the lab's host 0 (left serving by test_faults; run alone, deployed fresh over IPv4
first), its namespace's unique-local address (tests/support/testhosts network.py), pyinfra's SSH
connector over IPv6, a real vLLM CPU server bound to the address, the health check as its timer runs
it, the controller's verify and a real client over IPv6. One re-deploy, one restart. The same re-deploy
pushes the checkpoint from the controller (`qwen27b_model_source: controller`, its directory emptied
first), as the sudo lab's `admin` (issue 48: the upload staged under /var/lib/qwen27b, 0750, failed with
Permission denied; the tier's other deploys fetch from the mirror, so none pushed it). The Prometheus
module after it re-deploys the host on its IPv4 lab address with node_exporter, a restart it makes
anyway (conftest's LAB_ORDER): IPv6 costs host 0's chain no start of its own.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from qwen27b.controller.artifacts import dir_manifest
from tests.support.e2e_deploy import API_KEY, GOOD, PORT, deploy, health_run, latest_report, make_lab, serving_record, show

pytestmark = pytest.mark.e2e
TIMES: dict[str, float] = {}
HEALTH_PORT = 9120  # qwen27b_health_port's default
MODELS = "/var/lib/qwen27b/models"


@pytest.fixture(scope="module")
def v6(testhost, mirror, artifacts, tmp_path_factory):
    """Host 0 serving over IPv4, with the revision it runs (REV_B after test_faults), so that the
    re-deploy changes the address only."""
    started = time.monotonic()
    host = testhost
    assert host.address6, "the test hosts have no IPv6 address (tests/support/testhosts/network.py)"
    lab = make_lab(host, host.lab.inventory, mirror, tmp_path_factory.mktemp("ipv6"))
    try:
        record = serving_record(lab, TIMES, "fresh deploy over IPv4 (module alone)")
        assert record["url"] == f"http://{host.address}:{PORT}", record  # serving on IPv4 before
        revision = record["model_ref"].rsplit("@", 1)[1]
        lab["same"] = {} if revision == GOOD.split("@")[1] else {"qwen27b_stack_overrides": {"model_revision": revision}}
        lab["artifacts"] = artifacts
        yield lab
    finally:
        TIMES["module"] = time.monotonic() - started
        print("\n" + "\n".join(f"  {what:44} {secs:6.1f} s" for what, secs in TIMES.items()))


def test_a_serving_host_moved_to_its_ipv6_address_starts_verifies_and_answers(v6):
    host, address = v6["host"], v6["host"].address6
    base = f"http://[{address}]:{PORT}"
    pid = show(v6, "MainPID")
    t0 = time.monotonic()
    # the checkpoint comes from the controller this time, into its emptied directory (issue 48)
    model = host.run(f"readlink -e {MODELS}/current").stdout.strip()
    assert model.startswith(f"{MODELS}/"), model
    host.run(f"find {model} -mindepth 1 -delete")
    # bare, as a person writes it: SSH over IPv6 and the service bound there
    rc, out = deploy(v6, {**v6["same"], "ssh_hostname": address, "qwen27b_bind_address": address,
                          "qwen27b_model_source": "controller", "qwen27b_model_local_dir": str(v6["artifacts"])})
    TIMES["re-deploy on IPv6 (one restart, verify; the checkpoint pushed)"] = time.monotonic() - t0
    assert rc == 0, out[-5000:]
    # pushed as admin with sudo: staged where admin can reach (not below /var/lib/qwen27b, 0750), then moved
    assert re.search(r"push the checkpoint \(verified by sha256\)", out), out[-5000:]
    files = [line for line in host.run(f"find {model} -mindepth 1 -printf '%u %m %f\\n'").stdout.split("\n")
             if line and not line.split()[-1].startswith(".")]  # the hidden hash cache (FileHashes) aside
    assert sorted(line.split()[-1] for line in files) == sorted(dir_manifest(v6["artifacts"])), files
    assert all(line.startswith("root 644 ") for line in files), files
    assert host.run("find / -xdev -maxdepth 4 -name '.qwen27b-incoming-*'", check=False).stdout.strip() == ""
    report = latest_report(v6)
    assert report["status"] == "ok" and report["completion_tokens"] > 0, report  # the controller's verify
    # pyinfra reached the host over IPv6 (from the controller's end of the veth)
    gateway6 = host.lab.host(host.name)["gateway6"]
    logins = host.run("journalctl -o cat --no-pager _COMM=sshd-session _COMM=sshd | grep 'Accepted publickey for'",
                      check=False).stdout
    assert f"from {gateway6} " in logins, logins[-2000:]
    # the unit finished starting: its start-up check (the warm-up, ExecStartPost) called the bracketed URL
    assert host.run("systemctl is-active qwen27b.service").stdout.strip() == "active"
    assert show(v6, "MainPID") != pid  # one restart onto the new address
    unit = host.run("systemctl cat qwen27b.service").stdout
    assert f"--host {address} " in unit or f"--host {address}\n" in unit, unit
    post = next(line for line in unit.splitlines() if line.startswith("ExecStartPost="))
    assert re.search(rf"--url '?{re.escape(base)}'? ", post) and f"http://{address}:" not in unit, post
    # the health check, as its timer runs it, with its --url
    health = host.run("systemctl cat qwen27b-health.service").stdout
    assert re.search(rf"--url '?{re.escape(base)}'? ", health), health  # systemd's quotes around it, or none
    status = health_run(v6)
    assert status["code"] == 0 and status["url"] == base, status["findings"]
    # its endpoint's socket moved too (restarted on the changed ListenStream=), and a local client
    # connecting to the address (the socket's IPAddressAllow= admits it) reads the OK verdict
    assert f"[{address}]:{HEALTH_PORT}" in host.run(f"ss -Hltn 'sport = :{HEALTH_PORT}'").stdout
    endpoint = host.run(f"curl -fsS --noproxy '*' http://[{address}]:{HEALTH_PORT}/").stdout
    assert json.loads(endpoint)["verdict"] == "OK", endpoint
    # the release record verify and rollback read
    record = json.loads(host.run("cat /etc/qwen27b/release.json").stdout)
    assert record["url"] == base, record
    # a real client over IPv6; the IPv4 address no longer serves
    models = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30,
                       trust_env=False)
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["smollm2-135m"], models.text
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{host.address}:{PORT}/health", timeout=5, trust_env=False)
