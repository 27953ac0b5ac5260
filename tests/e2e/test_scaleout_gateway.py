"""The gateway end to end on three real test hosts: nginx and qwen27b-gateway-pool on the first
(group qwen27b_gateway), the CPU smoke profile on the other two (real vLLM, SmolLM2-135M), all from
one `pyinfra <inventory> deploy.py -y`, as a lab would run it.

The file sorts after the modules that deploy the session's one test host (test_deploy, test_faults,
test_prometheus_e2e): its three hosts replace that host, and coming earlier would make the next
module deploy a fresh one again (~4 min of CI).

Three hosts rather than the gateway beside a backend: the inventory keeps one qwen27b deployment
per machine, and the gateway is cheap (nginx ~10 MB, the watcher ~15 MB: docs/scale-out.md); the
two vLLM servers take ~3.5 GiB each. The hosts reach each other as on a lab LAN (link_peers); all
traffic stays on their namespaces' addresses.

In file order, one deployment: deploy and verify -> a re-run changes nothing on the gateway ->
keys (the gateway's accepted; the backends' key, an unknown one or none refused) -> streaming and
/v1/models once -> both backends used -> one backend's vLLM SIGKILLed under bounded load (failed
requests counted, the pool's failover time measured; it returns when healthy) -> a rolling restart of
both backends, each drained first through the rollout's seam (gateway_drain), under steady load:
no failed request -> no key anywhere it must not be. The figures print (-s) and go to docs/scale-out.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from qwen27b.controller import postdeploy as V
from tests.e2e.test_deploy import ROOT, artifacts, deploy, mirror  # noqa: F401 (module fixtures, shared helpers)

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("testhosts", [3], indirect=True)]
BACKEND_KEY = "q27-backend-" + os.urandom(8).hex()
CLIENT_KEYS = ["q27-team-a-" + os.urandom(8).hex(), "q27-team-b-" + os.urandom(8).hex()]
NAME = "smollm2-135m"
POOL_FILE = "/var/lib/qwen27b-gateway/pool.json"


@pytest.fixture(scope="module")
def gw(testhosts, mirror, tmp_path_factory):  # noqa: F811 (the mirror fixture imported above)
    """An inventory: host 0 in the qwen27b_gateway group, hosts 1 and 2 its backends; key files 0600."""
    testhosts.lab.link_peers()
    work = tmp_path_factory.mktemp("gateway")
    files = {}
    for name, key in [("backend", BACKEND_KEY), ("team-a", CLIENT_KEYS[0]), ("team-b", f"OPENAI_API_KEY={CLIENT_KEYS[1]}")]:
        files[name] = work / f"{name}.key"
        files[name].write_text(key + "\n")
        files[name].chmod(0o600)
    gateway, backends = testhosts[0], list(testhosts)[1:]
    backend_data = {"qwen27b_profile": "cpu-smoke", "qwen27b_model_source": "mirror",
                    "qwen27b_model_mirror": f"http://127.0.0.1:{mirror.server_address[1]}",
                    "qwen27b_http_proxy": "http://127.0.0.1:3128", "qwen27b_api_key_file": str(files["backend"]),
                    "qwen27b_metrics_allow": [f"{gateway.address}/32"]}
    gateway_data = {"qwen27b_gateway_key_files": [str(files["team-a"]), str(files["team-b"])]}
    inventory = work / "lab.py"
    inventory.write_text(
        "import runpy\n"
        f"_hosts = [(n, {{k: v for k, v in d.items() if k != 'testhost_root'}}) for n, d in "
        f"runpy.run_path({str(testhosts.lab.inventory)!r})['testhosts']]\n"
        f"qwen27b_gateway = [(_hosts[0][0], {{**_hosts[0][1], **{gateway_data!r}}})]\n"
        f"backends = [(n, {{**d, **{backend_data!r}}}) for n, d in _hosts[1:]]\n")
    return {"inventory": inventory, "work": work, "logs": [], "host": gateway, "backends": backends,
            "base": f"http://{gateway.address}:8000", "figures": {}}


def client(key: str | None = CLIENT_KEYS[0], timeout: float = 120) -> httpx.Client:
    return httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else {})


def pool(gw) -> dict:
    return json.loads(gw["host"].run(f"cat {POOL_FILE}").stdout)


BODY = {"model": NAME, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 8}


class Load:
    """Bounded steady load from the controller: `threads` clients sending chat completions to the
    gateway until stopped (or `limit_s`); every failure kept with its time (no client retry)."""

    def __init__(self, base: str, threads: int = 2, limit_s: float = 600, pause_s: float = 0.0):
        self.base, self.stop, self.deadline = base, threading.Event(), time.monotonic() + limit_s
        self.pause_s = pause_s
        self.ok, self.failed, self.lock = 0, [], threading.Lock()
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        with client() as c:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                try:
                    r = c.post(f"{self.base}/v1/chat/completions", json=BODY)
                    why = None if r.status_code == 200 else f"HTTP {r.status_code} {r.text[:100]}"
                except httpx.HTTPError as error:
                    why = f"{type(error).__name__}: {error}"
                with self.lock:
                    if why is None:
                        self.ok += 1
                    else:
                        self.failed.append((time.monotonic(), why))
                self.stop.wait(self.pause_s)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def test_gateway_and_two_backends_deploy_in_one_run_and_verify(gw):
    started = time.monotonic()
    rc, out = deploy(gw)
    gw["figures"]["deploy_s"] = round(time.monotonic() - started)
    assert rc == 0, out[-5000:]
    assert "--> qwen27b run summary: 3 of 3 host(s) ok" in out, out[-3000:]
    assert f"[{gw['host'].name}] gateway verified: {NAME}" in out, out[-3000:]
    t = gw["host"].testinfra()
    for unit in ("qwen27b-gateway", "qwen27b-gateway-pool"):
        assert t.service(unit).is_enabled and t.service(unit).is_running
    assert not t.service("nginx").is_running and not t.service("nginx").is_enabled  # the package's own server
    keys = t.file("/etc/qwen27b-gateway/keys.conf")
    assert (keys.user, keys.mode) == ("root", 0o600)
    assert sorted(pool(gw)["pool"]) == sorted(b.name for b in gw["backends"])


def test_second_run_changes_nothing_on_the_gateway(gw):
    pid = gw["host"].run("systemctl show -p MainPID --value qwen27b-gateway").stdout.strip()
    rc, out = deploy(gw, argv=[str(gw["inventory"]), "deploy.py", "-y", "--limit", gw["host"].name])
    assert rc == 0, out[-4000:]
    assert re.search(rf"== {gw['host'].name}: \d+ operation\(s\) planned, 0 would change the host", out), out[-3000:]
    assert gw["host"].run("systemctl show -p MainPID --value qwen27b-gateway").stdout.strip() == pid


def test_only_the_gateways_keys_are_accepted(gw):
    base = gw["base"]
    for key in CLIENT_KEYS:
        with client(key) as c:
            assert c.get(f"{base}/v1/models").status_code == 200
    for key in (None, BACKEND_KEY, "q27-unknown"):
        with client(key) as c:
            answer = c.get(f"{base}/v1/models")
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
            assert c.post(f"{base}/v1/chat/completions", json=BODY).status_code == 401
    with client(CLIENT_KEYS[0]) as c:  # a client key is no backend key: the backends refuse it
        assert c.get(f"http://{gw['backends'][0].address}:8000/v1/models").status_code == 401


def test_streaming_and_one_model_through_the_gateway(gw):
    with client() as c:
        models = c.get(f"{gw['base']}/v1/models").json()["data"]
    assert [m["id"] for m in models] == [NAME]  # two backends, one served name, listed once
    chat = V.chat_stream(gw["base"], NAME, CLIENT_KEYS[1], max_tokens=24)
    assert chat["completion_tokens"] > 1 and chat["ttft_s"] > 0
    chunks = 0
    with client() as c, c.stream("POST", f"{gw['base']}/v1/chat/completions", json={**BODY, "stream": True}) as r:
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
    assert r.status_code == 200 and chunks > 1  # chunk by chunk, not one buffered answer
    gw["figures"]["stream_ttft_ms"] = round(chat["ttft_s"] * 1000)


def test_requests_reach_both_backends(gw):
    with client() as c:
        for _ in range(8):
            assert c.post(f"{gw['base']}/v1/chat/completions", json=BODY).status_code == 200
    log = gw["host"].run("journalctl --no-pager -t qwen27b_gateway -n 200", timeout=60).stdout
    used = {b.name for b in gw["backends"] if f"upstream={b.address}:8000" in log}
    assert used == {b.name for b in gw["backends"]}, log[-2000:]


def _pool_watch(gw, stop: threading.Event, seen: list) -> None:
    """(time, pool) whenever the gateway's pool changes, read over one SSH call a second."""
    last = None
    while not stop.is_set():
        try:
            now = pool(gw)["pool"]
        except Exception:  # noqa: BLE001 (a read that lost a race with the rename: next second)
            now = last
        if now != last:
            seen.append((time.monotonic(), now))
            last = now
        time.sleep(0.5)


def test_a_killed_backend_leaves_the_pool_under_load_without_failed_requests_and_returns(gw):
    victim = gw["backends"][1]
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_pool_watch, args=(gw, stop, seen))
    watcher.start()
    try:
        with Load(gw["base"], threads=4, limit_s=120) as load:
            time.sleep(5)
            killed_at = time.monotonic()
            victim.run("kill -9 $(systemctl show -p MainPID --value qwen27b.service)")
            time.sleep(15)
        out_at = next((t for t, members in seen if t >= killed_at and victim.name not in members), None)
        deadline = time.monotonic() + 300  # systemd restarts it (RestartSec 10) and vLLM loads (~45 s)
        while time.monotonic() < deadline and victim.name not in pool(gw)["pool"]:
            time.sleep(2)
        back_at = time.monotonic()
    finally:
        stop.set()
        watcher.join()
    assert load.failed == [], load.failed
    assert out_at is not None, seen
    assert victim.name in pool(gw)["pool"], "the restarted backend did not return to the pool"
    gw["figures"]["kill"] = {"requests_ok": load.ok, "failed": len(load.failed),
                             "out_of_pool_s": round(out_at - killed_at, 1), "back_in_pool_s": round(back_at - killed_at)}
    print(f"\nkill -9 of {victim.name}'s vLLM under 4 clients: {load.ok} requests ok, {len(load.failed)} failed; "
          f"out of the pool after {out_at - killed_at:.1f} s; back in {back_at - killed_at:.0f} s")


def gateway_cli(gw, *args: str) -> list[dict]:
    """`qwen27b gateway --json ARGS` (controller/gateway_drain.py through the operator's command):
    its own process, as pyinfra's connectors patch the process they run in (gevent) and this one
    has the load's threads. One JSON object per gateway."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    result = subprocess.run([sys.executable, "-m", "qwen27b.tools.cli", "gateway", "--json", args[0],
                             str(gw["inventory"]), *args[1:]], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_rolling_restart_with_drain_under_steady_load_fails_no_request(gw):
    """The rollout's seam (controller/gateway_drain.py): drain -> restart -> undrain, one backend at a
    time; `undrain` returns once the backend is healthy and back in the pool."""
    steps = []
    # paced (one client, a request every 3 s): both vLLM CPU engines pin their OpenMP thread to core
    # 0 of these 2 shared cores; with the one left in the pool kept busy (2 clients, then 1 a second)
    # the other's start-up ran past its 300 s start timeout, twice
    with Load(gw["base"], threads=1, limit_s=900, pause_s=3.0) as load:
        time.sleep(3)
        for backend in gw["backends"]:
            began = time.monotonic()
            [drained] = gateway_cli(gw, "drain", backend.name, "--wait", "120")
            assert drained["drained"] and backend.name not in drained["pool"], drained
            restarted = backend.run("systemctl restart qwen27b.service", check=False, timeout=400)  # once ready
            assert restarted.returncode == 0, backend.run(
                "systemctl status --no-pager qwen27b.service; journalctl --no-pager -u qwen27b -n 40", check=False).stdout
            [back] = gateway_cli(gw, "undrain", backend.name, "--wait", "120")
            assert backend.name in back["pool"], back
            steps.append((backend.name, round(drained["waited_s"], 1), round(time.monotonic() - began)))
        time.sleep(3)
    assert load.failed == [], load.failed
    assert load.ok > 5
    gw["figures"]["rollout"] = {"requests_ok": load.ok, "failed": 0, "steps": steps}
    print(f"\nrolling restart of {len(steps)} backends, drained first, under a paced client: {load.ok} requests ok, "
          f"0 failed; (backend, drain wait s, step s): {steps}")


def test_no_key_anywhere_it_must_not_be(gw):
    host = gw["host"]
    places = {
        "nginx.conf": host.run("cat /etc/qwen27b-gateway/nginx.conf").stdout,
        "pool config": host.run("cat /etc/qwen27b-gateway/backends.json").stdout,
        "units": host.run("systemctl cat qwen27b-gateway qwen27b-gateway-pool").stdout,
        "process list": host.run("ps -eo args").stdout,
        "journal": host.run("journalctl --no-pager -t qwen27b_gateway -u qwen27b-gateway -u qwen27b-gateway-pool",
                            timeout=60).stdout,
        "deploy output": "".join(log.read_text() for log in gw["logs"]),
        "reports": "".join(p.read_text() for p in (gw["work"] / "reports").glob("*.json")),
    }
    leaked = [(where, i) for where, text in places.items() for i, key in enumerate([BACKEND_KEY, *CLIENT_KEYS])
              if key in text]
    assert leaked == []
    print(f"\ngateway figures: {json.dumps(gw['figures'])}")
