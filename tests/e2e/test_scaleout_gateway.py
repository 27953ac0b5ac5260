"""The gateway end to end on three real test hosts: nginx and qwen27b-gateway-pool on one (group
qwen27b_gateway), the CPU smoke profile on the other two (real vLLM, SmolLM2-135M), all from one
`pyinfra <inventory> deploy.py -y`, as a lab would run it, as root (the other modules deploy as
admin+sudo: both ways proven); the chat page's deploy and the gateway host's uninstall run as the
README's admin+sudo user (issue 56 item 5).

The tier's one lab (tests/e2e/conftest.py LAB_ORDER, issue 31): the backends are hosts 1 and 2, the
lifecycle's pair, both already serving (A after the sources, B after its rollback), so the
first deploy re-keys and re-renders them (one restart each) rather than installing again: a lab
putting a gateway in front of hosts it already runs. The gateway goes on a bare host: host 0 where
host 0's chain runs in the other process (./run tests), else a fourth host (conftest's
gateway_host). The uninstall module follows on B. Run alone, the module's first deploy installs both
backends fresh.

Three hosts rather than the gateway beside a backend: the inventory keeps one qwen27b deployment
per machine, and the gateway is cheap (nginx ~10 MB, the watcher ~15 MB: docs/scale-out.md); the
two vLLM servers take ~3.5 GiB each. The hosts reach each other as on a lab LAN (link_peers); all
traffic stays on their namespaces' addresses.

In file order, one deployment: deploy and verify -> a re-run changes nothing on the gateway ->
keys (the gateway's accepted; the backends' key, an unknown one or none refused) -> streaming and
/v1/models once -> both backends used -> one backend's vLLM SIGKILLed under bounded load (failed
requests counted, the pool's failover time measured; it returns when healthy) -> the other one's
engine core frozen under load (its health check names the stall and restarts it; the pool drops
and regains it) -> a rolling restart of
both backends, each drained first through the rollout's seam (gateway_drain), under steady load:
no failed request -> TLS, limits, rotated keys -> the fleet status -> the chat page as admin+sudo, with the gateway host's
firewall (issue 29: Open WebUI installed and verified, Alice in Chromium, her usage under her key;
issue 56: qwen27b_firewall_allow on the gateway host) -> the firewall refuses an address outside its
list -> no key anywhere it must not be -> `qwen27b uninstall --chat-data` of the gateway host as
admin+sudo. The figures print (-s) and go to docs/scale-out.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import threading
import time

from pathlib import Path

import httpx
import pytest

from qwen27b.controller import postdeploy as V
from qwen27b.plan.gateway import VERIFY
from tests.support.e2e_deploy import REV_B, ROOT, SUDO, deploy
from tests.support.firewall_probe import controller_address, curl_code, nft_usable, stranger

pytestmark = pytest.mark.e2e
BACKEND_KEY = "q27-backend-" + os.urandom(8).hex()
CLIENT_KEYS = ["q27-team-a-" + os.urandom(8).hex(), "q27-team-b-" + os.urandom(8).hex()]
NAME = "smollm2-135m"
POOL_FILE = "/var/lib/qwen27b-gateway/pool.json"
# The backends' health check at test speed: every 10 s, an engine stalled after 10 s without a
# generated token while requests run, and the idle engine's 1-token probe at most every 20 s
# (production: 30 s, the stack's 120 s and 20 s, issue 56 item 2). The idle probe matters: a core frozen
# between two requests leaves vLLM's gauges (published by that core) at "nothing running", so only the
# probe names it; at the stack's former 300 s the test's window ended first (the clean-clone CI of
# 2026-12-05: OK for 5 minutes, the probe's CRITICAL just before the deadline). The 20 s here is now the
# stack's own value, kept explicit so the test's timing does not move with it
STALL_AFTER_S = 10
IDLE_PROBE_EVERY_S = 20
# the stall named after ~10-20 s, the third CRITICAL run 20 s later, the stop (30 s at most): a restart
# by then, with room for a loaded machine (one on a test host alone took 62 s)
RESTART_WITHIN_S = 300
# the frozen engine's load: two clients, each a request every ~2 s (0.5 s before issue 31; the
# other backend then served ~4 a second for minutes, on the cores the rest of the tier shares)
FREEZE_PAUSE_S = 2.0
# the killed backend's four clients: a request each every ~0.5 s (back to back before issue 31: both
# backends' engines, then the survivor's, took the shared cores whole for the test's 20 s)
KILL_PAUSE_S = 0.5
# This module proves the drain, not speed: verify measures on prompt sets of its own (fewer tokens, one
# run; a set is its prompts and max_tokens), so a backend's first deploy here is not compared with the
# figures the lifecycle module left on it. The rollout's release is compared with the serving one measured
# right before the switch (issue 58), both under the other backend's paced client; one run of each once
# measured an equal release TTFT +817% against stored figures (CI of 2026-12-06), so the rollout here takes
# the widest limits and load allowances the stack allows: the gate's judgement is the lifecycle module's.
WIDE_GATE = {"max_ttft_rise": 9.99, "max_decode_drop": 0.99,
             "load": {"max_requests_diff": 1000, "max_cpu_diff": 1.0, "max_gpu_diff": 100}}
LIVENESS = {"liveness": {"stall_after_s": STALL_AFTER_S, "idle_probe_every_s": IDLE_PROBE_EVERY_S}}
WATCH = {"qwen27b_health_interval_s": 10,
         "qwen27b_stack_overrides": {"serve": {**LIVENESS, "regression": {"max_tokens": 16, "repeats": 1}}}}
ROLLOUT_OVERRIDES = {"serve": {**LIVENESS, "regression": {"max_tokens": 12, "repeats": 1, **WIDE_GATE}}}


@pytest.fixture(scope="module")
def gw(testhosts, gateway_host, mirror, tmp_path_factory):
    """An inventory: the gateway host in the qwen27b_gateway group, hosts 1 and 2 its backends; key files
    0600. After the module the gateway's units stop: its pool's probes leave the backends alone."""
    hosts = testhosts
    work = tmp_path_factory.mktemp("gateway")
    files = {}
    for name, key in [("backend", BACKEND_KEY), ("team-a", CLIENT_KEYS[0]), ("team-b", f"OPENAI_API_KEY={CLIENT_KEYS[1]}")]:
        files[name] = work / f"{name}.key"
        files[name].write_text(key + "\n")
        files[name].chmod(0o600)
    gateway, backends = gateway_host, [hosts[1], hosts[2]]
    backend_data = {"qwen27b_profile": "cpu-smoke", "qwen27b_model_source": "mirror",
                    "qwen27b_model_mirror": f"http://127.0.0.1:{mirror.server_address[1]}",
                    "qwen27b_http_proxy": "http://127.0.0.1:3128", "qwen27b_api_key_file": str(files["backend"]),
                    "qwen27b_metrics_allow": [f"{gateway.address}/32"], **WATCH}
    gateway_data = {"qwen27b_gateway_key_files": [str(files["team-a"]), str(files["team-b"])]}
    inventory = work / "lab.py"
    # QWEN27B_E2E_EXTRA (tests/e2e/test_deploy.py's deploy(extra=...)) adds host data to the backends
    # for one run: the rollout's upgrade; the gateway's own keys, its firewall and the SSH user (SUDO:
    # the chat page's runs) go to the gateway only
    inventory.write_text(
        "import json, os, runpy\n"
        f"_hosts = {{n: {{k: v for k, v in d.items() if k != 'testhost_root'}} for n, d in "
        f"runpy.run_path({str(hosts.lab.inventory)!r})['testhosts']}}\n"
        "EXTRA = json.loads(os.environ.get('QWEN27B_E2E_EXTRA', '{}'))\n"
        "GATEWAY_EXTRA = {k: v for k, v in EXTRA.items() if k.startswith(('qwen27b_gateway_', 'qwen27b_chat_page'))\n"
        "                 or k in ('qwen27b_firewall_allow', 'ssh_user', '_sudo')}\n"
        f"qwen27b_gateway = [({gateway.name!r}, {{**_hosts[{gateway.name!r}], **{gateway_data!r}, **GATEWAY_EXTRA}})]\n"
        f"backends = [(n, {{**_hosts[n], **{backend_data!r}, **{{k: v for k, v in EXTRA.items() if k not in GATEWAY_EXTRA}}}}) "
        f"for n in {[b.name for b in backends]!r}]\n")
    yield {"inventory": inventory, "work": work, "logs": [], "host": gateway, "backends": backends,
           "base": f"http://{gateway.address}:8000", "figures": {}}
    gateway.run("systemctl stop qwen27b-chat-page.service qwen27b-gateway-pool.service qwen27b-gateway.service",
                check=False, timeout=120)


def client(key: str | None = CLIENT_KEYS[0], timeout: float = 120) -> httpx.Client:
    return httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else {})


def pool(gw) -> dict:
    return json.loads(gw["host"].run(f"cat {POOL_FILE}").stdout)


BODY = {"model": NAME, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 8}


def answered(r: httpx.Response) -> bool:
    """A chat completion that really generated: tokens counted and a finish reason."""
    try:
        body = r.json()
        return body["usage"]["completion_tokens"] > 0 and body["choices"][0]["finish_reason"] in ("stop", "length")
    except (ValueError, KeyError, IndexError, TypeError):
        return False


class Load:
    """Bounded steady load from the controller: `threads` clients sending chat completions to the
    gateway until stopped (or `limit_s`), thread i with key keys[i % len(keys)] (the gateway's fair
    share holds one key to the pool's slots less one); every failure kept with its time (no client retry)."""

    def __init__(self, base: str, threads: int = 2, limit_s: float = 600, pause_s: float = 0.0,
                 keys: tuple = CLIENT_KEYS[:1]):
        self.base, self.stop, self.deadline = base, threading.Event(), time.monotonic() + limit_s
        self.pause_s = pause_s
        self.ok, self.failed, self.lock = 0, [], threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(keys[i % len(keys)],)) for i in range(threads)]

    def _run(self, key: str) -> None:
        with client(key) as c:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                try:
                    r = c.post(f"{self.base}/v1/chat/completions", json=BODY)
                    why = None if r.status_code == 200 else f"HTTP {r.status_code} {r.text[:100]}"
                    if why is None and not answered(r):  # a 200 must carry a real completion
                        why = f"HTTP 200 without a completion: {r.text[:600]}"
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


def usage_counters(gw) -> dict[str, float]:
    """The gateway's usage counters ({'qwen27b_gateway_..._total{key="NAME"}': value}), read on the
    gateway host from its loopback listener."""
    text = gw["host"].run("python3 -c 'import urllib.request as u; "
                          "print(u.urlopen(\"http://127.0.0.1:9121/metrics\", timeout=10).read().decode())'").stdout
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("qwen27b_gateway_")}


def request_log(gw, n: int = 200) -> list[dict]:
    """The gateway's request log: its last JSON lines in the journal (tag qwen27b_gateway, written by the
    gateway's unit: a line forged with `logger` is not one, as `qwen27b gateway usage` reads it)."""
    out = gw["host"].run(f"journalctl --no-pager -o cat _SYSTEMD_UNIT=qwen27b-gateway.service "
                         f"SYSLOG_IDENTIFIER=qwen27b_gateway -n {n}", timeout=60).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_requests_reach_both_backends_each_one_log_line_with_its_keys_name(gw):
    with client() as c:
        for _ in range(8):
            assert c.post(f"{gw['base']}/v1/chat/completions", json=BODY).status_code == 200
    with client(CLIENT_KEYS[1]) as c:
        assert c.post(f"{gw['base']}/v1/chat/completions", json=BODY).status_code == 200
    chats = [r for r in request_log(gw) if r["path"] == "/v1/chat/completions"][-9:]
    used = {b.name for b in gw["backends"] if any(r["backend"] == f"{b.address}:8000" for r in chats)}
    assert used == {b.name for b in gw["backends"]}, chats
    assert [r["key"] for r in chats] == ["team-a"] * 8 + ["team-b"] and {r["status"] for r in chats} == {200}, chats
    assert not [r for r in chats if BODY["messages"][0]["content"] in json.dumps(r)]  # no prompt text
    # issue 51: a line forged with the request log's tag from a login session is not usage (journald's
    # _SYSTEMD_UNIT tells nginx's lines from it); the gateway's own lines are
    forged = json.dumps({"key": "team-b", "status": 200, "request_time": 0, "prompt_tokens": "999999"})
    gw["host"].run(f"logger -t qwen27b_gateway {shlex.quote(forged)}")
    used = json.loads(gw["host"].run("PYTHONPATH=/opt/qwen27b-gateway/lib python3 -m qwen27b_onhost.gateway_pool "
                                     "usage --since 1h", timeout=60).stdout)["keys"]
    assert used["team-a"]["requests"] >= 8 and used["team-b"]["prompt_tokens"] < 999999, used


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


def _returned(gw, victim, within_s: float) -> bool:
    """Wait until the victim is back in the pool on its own merit: admitted after its good rounds,
    not listed because the pool failed open (on 2 loaded cores the other backend's 1-s probes can
    time out twice while the victim loads: then every backend is listed, the victim's return not yet
    proven). True once seen so, False at the deadline."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        record = pool(gw)
        if victim.name in record["pool"] and not record.get("failed_open"):
            return True
        time.sleep(2)
    return False


def test_a_killed_backend_leaves_the_pool_under_load_without_failed_requests_and_returns(gw):
    victim = gw["backends"][1]
    stop, seen = threading.Event(), []
    # fair share: each backend's /health says its slots (--max-num-seqs); each key may hold the sum less one
    deadline = time.monotonic() + 60
    while (record := pool(gw)).get("fair_share") is None and time.monotonic() < deadline:
        time.sleep(2)
    assert sorted(record.get("slots") or {}) == sorted(b.name for b in gw["backends"]), record
    assert record["fair_share"] == sum(record["slots"].values()) - 1, record
    watcher = threading.Thread(target=_pool_watch, args=(gw, stop, seen))
    watcher.start()
    try:
        # two keys, two clients each: with one backend left, each key's share (its slots less one) still holds two
        with Load(gw["base"], threads=4, limit_s=120, pause_s=KILL_PAUSE_S, keys=CLIENT_KEYS[:2]) as load:
            time.sleep(5)
            killed_at = time.monotonic()
            victim.run("kill -9 $(systemctl show -p MainPID --value qwen27b.service)")
            time.sleep(15)
        out_at = next((t for t, members in seen if t >= killed_at and victim.name not in members), None)
        returned = _returned(gw, victim, 300)  # systemd restarts it (RestartSec 10) and vLLM loads (~45 s)
        back_at = time.monotonic()
    finally:
        stop.set()
        watcher.join()
    assert load.failed == [], load.failed
    assert out_at is not None, seen
    assert returned, f"the restarted backend did not return to the pool: {pool(gw)}; pools seen: {seen}"
    gw["figures"]["kill"] = {"requests_ok": load.ok, "failed": len(load.failed),
                             "out_of_pool_s": round(out_at - killed_at, 1), "back_in_pool_s": round(back_at - killed_at)}
    print(f"\nkill -9 of {victim.name}'s vLLM under 4 clients: {load.ok} requests ok, {len(load.failed)} failed; "
          f"out of the pool after {out_at - killed_at:.1f} s; back in {back_at - killed_at:.0f} s")


def _engine_core(host) -> str:
    """The PID of the backend's engine-core process (vLLM names it VLLM::EngineCore; the kernel
    keeps 15 characters): the API server's child, found in the unit's own cgroup."""
    out = host.run("ps -o pid=,comm= --ppid $(systemctl show -p MainPID --value qwen27b.service)").stdout
    pids = [line.split()[0] for line in out.splitlines() if line.split()[1:] == ["VLLM::EngineCor"]]
    assert len(pids) == 1, out
    return pids[0]


def _generating(victim) -> threading.Thread:
    """A long streamed completion on the victim itself (curl there, the key read from its 0600 env
    file into a header on stdin, never argv), so a request is on the engine when it is frozen: the
    counters' path, which a loaded machine otherwise leaves to chance (the idle probe's path then)."""
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "Count to one thousand."}],
                       "max_tokens": 1500, "ignore_eos": True, "stream": True})
    command = (f"sed -n 's/^VLLM_API_KEY=/Authorization: Bearer /p' /etc/qwen27b/api-key.env | "
               f"curl -sN --max-time 900 -H @- -H 'Content-Type: application/json' "
               f"http://{victim.address}:8000/v1/chat/completions -d {shlex.quote(body)} > /tmp/e2e-long.sse")
    thread = threading.Thread(target=lambda: victim.run(command, check=False, timeout=960), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and int(victim.run("grep -c '\"content\"' /tmp/e2e-long.sse 2>/dev/null; true",
                                                         check=False).stdout.strip() or 0) < 3:
        time.sleep(1)
    return thread


def test_a_frozen_engine_is_named_stalled_dropped_from_the_pool_restarted_and_returns(gw):
    """Issue 26 part 1 on real hosts: the backend's engine core is frozen (SIGSTOP) under bounded
    load, while a long completion runs on it, and its API server keeps answering /health. Its health
    check (every 10 s here) names the stall from vLLM's counters, its health endpoint answers 503 so the gateway's pool drops it, the
    health check's rate-limited restart brings the service back, and the pool takes it again. Every
    200 a client got carries a real completion (Load.answered): the requests caught in the frozen
    engine either failed or were retried by nginx on the other backend, never reported done."""
    victim = gw["backends"][0]
    main_pid = victim.run("systemctl show -p MainPID --value qwen27b.service").stdout.strip()
    core = _engine_core(victim)
    since = victim.run("date +%s").stdout.strip()
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_pool_watch, args=(gw, stop, seen))
    watcher.start()
    try:
        with Load(gw["base"], threads=2, limit_s=600, pause_s=FREEZE_PAUSE_S) as load:
            time.sleep(5)
            _generating(victim)
            frozen_at = time.monotonic()
            victim.run(f"kill -STOP {core}")
            try:
                assert victim.run(f"curl -s -o /dev/null -w '%{{http_code}}' http://{victim.address}:8000/health").stdout == "200"
                deadline = time.monotonic() + RESTART_WITHIN_S
                while time.monotonic() < deadline and victim.run(
                        "systemctl show -p MainPID --value qwen27b.service").stdout.strip() == main_pid:
                    time.sleep(2)
                restarted_at = time.monotonic()
            finally:
                victim.run(f"kill -CONT {core} 2>/dev/null; true", check=False)  # a no-op once restarted
            returned = _returned(gw, victim, 300)  # vLLM loads (~45 s on 2 cores) and warms up
            back_at = time.monotonic()
            time.sleep(3)
    finally:
        stop.set()
        watcher.join()
    if restarted_at - frozen_at >= RESTART_WITHIN_S:  # the whole story for the failure: every unit, systemd's own lines
        everything = victim.run(f"journalctl --no-pager -o short-precise --since @{since} | grep -v sshd", timeout=60,
                                check=False).stdout
        status = victim.run("cat /var/lib/qwen27b/health.json", check=False).stdout
        pytest.fail(f"the health check never restarted the frozen backend within {RESTART_WITHIN_S} s:\n"
                    f"{everything[-12000:]}\nits last status file:\n{status[-3000:]}")
    journal = victim.run(f"journalctl --no-pager -u qwen27b-health.service --since @{since}", timeout=60).stdout
    # the counters name it when a request was on the engine at the freeze; else the idle 1-token probe
    # does (its deadline passed): both are the liveness finding the watchdog restarts for
    assert ("engine stalled" in journal and "vllm:generation_tokens_total has stayed at" in journal) or \
        "the engine generates nothing: a 1-token completion got no answer" in journal, journal[-3000:]
    assert "consecutive CRITICAL runs (restart after 3): restarting qwen27b.service" in journal, journal[-3000:]
    out_at = next((t for t, members in seen if t >= frozen_at and victim.name not in members), None)
    assert out_at is not None, seen
    assert returned, f"the restarted backend did not return to the pool: {pool(gw)}; pools seen: {seen}"
    restarts = re.findall(r"qwen27b-health: \d+ consecutive CRITICAL runs \(restart after \d+\): restarting", journal)
    assert len(restarts) == 1, journal[-3000:]  # once: not again while it loaded and rejoined
    assert not [why for _, why in load.failed if why.startswith("HTTP 200")], load.failed  # nothing false
    assert len(load.failed) <= 2, load.failed  # at most the two clients' requests caught in the freeze
    assert load.ok > 10
    gw["figures"]["freeze"] = {"requests_ok": load.ok, "failed": len(load.failed),
                               "out_of_pool_s": round(out_at - frozen_at, 1),
                               "restarted_s": round(restarted_at - frozen_at), "back_in_pool_s": round(back_at - frozen_at)}
    print(f"\nSIGSTOP of {victim.name}'s engine core under 2 clients: {load.ok} requests ok, {len(load.failed)} "
          f"failed; out of the pool after {out_at - frozen_at:.1f} s, restarted by its health check after "
          f"{restarted_at - frozen_at:.0f} s, back in the pool after {back_at - frozen_at:.0f} s")


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


def test_a_rollout_drains_each_backend_first_and_fails_no_request_under_steady_load(gw):
    """The day-two command itself: `qwen27b rollout INVENTORY --limit backends` upgrades the model
    revision backend by backend (canary first); its GatewayHooks drain each one at the gateway
    before its deploy restarts it and take it back once verified (controller/gateway_drain.py).
    A paced client keeps sending through the gateway meanwhile: not one request may fail."""
    before = {b.name: b.run("systemctl show -p MainPID --value qwen27b.service").stdout.strip() for b in gw["backends"]}
    with Load(gw["base"], threads=1, limit_s=1200, pause_s=1.0) as load:
        time.sleep(3)
        began = time.monotonic()
        rc, out = deploy(gw, {"qwen27b_stack_overrides": {**ROLLOUT_OVERRIDES, "model_revision": REV_B}},
                         argv=["rollout", str(gw["inventory"]), "--limit", "backends"], module="qwen27b.tools.cli")
        took = time.monotonic() - began
        time.sleep(3)
    assert rc == 0, out[-5000:]
    assert "--> rollout done: 2 host(s) upgraded and verified" in out, out[-3000:]
    for backend in gw["backends"]:
        drained = out.index(f"drained {backend.name}")
        assert drained < out.index(f"[{backend.name}] verified") < out.index(f"back in the pool: {backend.name}"), \
            out[-4000:]
        assert backend.run("systemctl show -p MainPID --value qwen27b.service").stdout.strip() != before[backend.name]
        assert backend.run("readlink /var/lib/qwen27b/models/current").stdout.strip().endswith(REV_B)
    # compared like with like: the serving release measured right before the switch (WIDE_GATE's limits)
    assert out.count("compared: the serving release before the switch") >= 2, out[-3000:]
    assert load.failed == [], load.failed
    assert load.ok > 10
    assert sorted(pool(gw)["pool"]) == sorted(b.name for b in gw["backends"])
    gw["figures"]["rollout"] = {"requests_ok": load.ok, "failed": 0, "rollout_s": round(took)}
    print(f"\nqwen27b rollout of 2 backends through the gateway's drain, under a paced client (1 request a "
          f"second): {load.ok} requests ok, 0 failed, {took:.0f} s")


def test_tls_from_a_lab_ca_and_a_keys_limits_through_the_openai_client_then_plain_http_again(gw):
    """Issue 28 on real hosts. Re-deployed with qwen27b_gateway_tls_lab_ca and team-b limited (3
    requests a minute, 1 at once), the gateway gets a certificate for its address signed by a lab CA
    made on the controller, and reloads (requests in flight finish: no restart). The deploy's own
    verify goes over https against that CA; the official openai client trusting it gets a completion
    and a streamed one; while team-b's stream runs, its next request gets 429 (at once, Retry-After 1)
    and the one after 429 for the rate (Retry-After 20; the openai client's RateLimitError), each
    named in the request log; team-c spends its one token of the day and gets 429 until midnight;
    the gateway's token counts equal the usage vLLM returned. A client with the system's CAs only
    refuses the gateway, plain HTTP to the port gets nginx's 400; a second run changes nothing. Then
    the first inventory puts plain HTTP back (the tests after use it) and the TLS files go."""
    import openai

    host, lab_ca = gw["host"], gw["work"] / "lab-ca"
    gw["lab_ca"] = lab_ca
    limit = [str(gw["inventory"]), "deploy.py", "-y", "--limit", host.name]
    team_a, team_b, team_c = (str(gw["work"] / f"{name}.key") for name in ("team-a", "team-b", "team-c"))
    key_c = "q27-team-c-" + os.urandom(8).hex()
    gw.setdefault("more_keys", []).append(key_c)
    Path(team_c).write_text(key_c + "\n")
    Path(team_c).chmod(0o600)
    tls = {"qwen27b_gateway_tls_lab_ca": str(lab_ca),
           "qwen27b_gateway_key_files": [team_a, {"file": team_b, "requests_per_minute": 3, "concurrent": 1},
                                         {"file": team_c, "tokens_per_day": 1}]}
    pid = host.run("systemctl show -p MainPID --value qwen27b-gateway").stdout.strip()
    try:
        rc, out = deploy(gw, tls, argv=limit)
        assert rc == 0, out[-4000:]
        base = f"https://{host.address}:8000"
        assert f"[{host.name}] gateway verified: {NAME} through {base}" in out, out[-3000:]
        assert f"TLS: a certificate for its address signed by the lab CA in {lab_ca}" in out, out[-3000:]
        assert host.run("systemctl show -p MainPID --value qwen27b-gateway").stdout.strip() == pid  # reloaded
        assert oct((lab_ca / "ca.key").stat().st_mode & 0o777) == oct(0o600)
        key = host.testinfra().file("/etc/qwen27b-gateway/tls.key")
        assert (key.user, key.mode) == ("root", 0o600)
        assert "client keys: team-a (no limit), team-b (3 requests/min, 1 at once), team-c (1 tokens/day)" in out, out[-3000:]
        before = usage_counters(gw)
        with httpx.Client(verify=ssl.create_default_context(cafile=str(lab_ca / "ca.crt")), timeout=120) as http:
            chat = openai.OpenAI(base_url=f"{base}/v1", api_key=CLIENT_KEYS[1], http_client=http, max_retries=0).chat
            done = chat.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8)
            assert done.usage.completion_tokens > 0 and done.choices[0].finish_reason in ("stop", "length")
            stream = chat.completions.create(model=NAME, messages=BODY["messages"], max_tokens=64, stream=True,
                                             stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            chunks = [next(iter(stream))]  # team-b's second request is on a backend, streaming
            with pytest.raises(openai.RateLimitError) as at_once:
                chat.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8)
            # its 4th in the minute at once (the 429 counted too: nginx checks the rate first), while the
            # 3-a-minute bucket has hardly leaked: refused for the rate, whatever the stream's speed
            with pytest.raises(openai.RateLimitError) as per_minute:
                chat.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8)
            chunks += list(stream)
            assert any(c.choices and c.choices[0].delta.content for c in chunks) and chunks[-1].usage.completion_tokens > 0
            assert "key team-b is over its 1 request at once" in str(at_once.value) and at_once.value.response.headers["Retry-After"] == "1"
            assert "key team-b is over its 3 requests per minute" in str(per_minute.value)
            assert per_minute.value.response.headers["Retry-After"] == "20"  # 3 a minute: one every 20 s
            other = openai.OpenAI(base_url=f"{base}/v1", api_key=CLIENT_KEYS[0], http_client=http, max_retries=0).chat
            plain_a = other.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8)
            streamed_a = list(other.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8, stream=True,
                                                       stream_options={"include_usage": True}))[-1].usage
            budgeted = openai.OpenAI(base_url=f"{base}/v1", api_key=key_c, http_client=http, max_retries=0).chat
            assert budgeted.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8).usage.completion_tokens > 0
            with pytest.raises(openai.RateLimitError) as per_day:  # its one token of the day is spent
                budgeted.completions.create(model=NAME, messages=BODY["messages"], max_tokens=8)
            assert "key team-c is over its tokens per day" in str(per_day.value)
            assert 0 < int(per_day.value.response.headers["Retry-After"]) <= 86400  # until midnight UTC
        logged = [(r["key"], r["status"]) for r in request_log(gw, 50) if r["path"] == "/v1/chat/completions"][-8:]
        assert logged == [("team-b", 200), ("team-b", 429), ("team-b", 429), ("team-b", 200), ("team-a", 200),
                          ("team-a", 200), ("team-c", 200), ("team-c", 429)], logged  # a stream is logged at its end
        # usage per key, counted by the gateway from the responses, equals what vLLM reported to the client
        after, streamed = usage_counters(gw), chunks[-1].usage
        grew = {k: after.get(k, 0) - before.get(k, 0) for k in after if k.endswith('{key="team-b"}')}
        assert grew['qwen27b_gateway_requests_total{key="team-b"}'] == 4
        assert grew['qwen27b_gateway_limited_total{key="team-b"}'] == 2
        assert grew['qwen27b_gateway_prompt_tokens_total{key="team-b"}'] == done.usage.prompt_tokens + streamed.prompt_tokens
        assert grew['qwen27b_gateway_completion_tokens_total{key="team-b"}'] == \
            done.usage.completion_tokens + streamed.completion_tokens
        for name, answers in (("team-a", (plain_a.usage, streamed_a)),):  # the other key, a completion and a stream
            for kind in ("prompt_tokens", "completion_tokens"):
                counted = after[f'qwen27b_gateway_{kind}_total{{key="{name}"}}'] - before[f'qwen27b_gateway_{kind}_total{{key="{name}"}}']
                assert counted == sum(getattr(u, kind) for u in answers), (
                    name, kind, counted, answers, [r for r in request_log(gw, 50) if r["key"] == name][-4:],
                    gw["host"].run("journalctl --no-pager -o cat -u qwen27b-gateway-pool -u qwen27b-gateway -n 40 | cat -v").stdout)
        (row,) = gateway_cli(gw, "usage", "--since", "1h")  # the operator's view, from the request log
        assert row["ok"] and row["keys"]["team-b"]["limited"] >= 2, row
        assert row["keys"]["team-b"]["completion_tokens"] >= done.usage.completion_tokens + streamed.completion_tokens, row
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{base}/health", timeout=30)  # the system's CAs only: the lab CA is not among them
        assert httpx.get(f"http://{host.address}:8000/health", timeout=30).status_code == 400  # plain HTTP to a TLS port
        rc, out = deploy(gw, tls, argv=limit)
        assert rc == 0 and re.search(rf"== {host.name}: \d+ operation\(s\) planned, 0 would change the host", out), out[-3000:]
    finally:  # the tests after use plain HTTP: back to the first inventory whatever failed above
        rc, out = deploy(gw, argv=limit)
    assert rc == 0 and f"through {gw['base']}" in out, out[-3000:]
    assert host.run("ls /etc/qwen27b-gateway/tls.crt /etc/qwen27b-gateway/tls.key", check=False).returncode != 0
    with client() as c:
        assert c.get(f"{gw['base']}/v1/models").status_code == 200


def test_a_rotated_key_works_and_a_revoked_one_is_refused_without_a_dropped_request(gw):
    """Issue 28's key changes, by the inventory and a re-run of the gateway alone, under steady load
    from team-a: team-b's key is rotated (its entry names a new file, the same name), then revoked
    (its entry removed). Each re-run reloads nginx gracefully: no request of the load fails, the old
    key is refused once rotated, the new one works until revoked, team-a is never refused."""
    host = gw["host"]
    limit = [str(gw["inventory"]), "deploy.py", "-y", "--limit", host.name]
    team_a, rotated = str(gw["work"] / "team-a.key"), gw["work"] / "team-b-rotated.key"
    new_key = "q27-team-b-rotated-" + os.urandom(8).hex()
    gw.setdefault("more_keys", []).append(new_key)
    rotated.write_text(new_key + "\n")
    rotated.chmod(0o600)
    with Load(gw["base"], threads=2, limit_s=300, pause_s=0.2) as load:
        rc, out = deploy(gw, {"qwen27b_gateway_key_files": [team_a, {"file": str(rotated), "name": "team-b"}]}, argv=limit)
        assert rc == 0, out[-4000:]
        with client(CLIENT_KEYS[1]) as old, client(new_key) as new:
            assert old.get(f"{gw['base']}/v1/models").status_code == 401
            assert new.post(f"{gw['base']}/v1/chat/completions", json=BODY).status_code == 200
        rc, out = deploy(gw, {"qwen27b_gateway_key_files": [team_a]}, argv=limit)
        assert rc == 0, out[-4000:]
        with client(new_key) as new:
            assert new.get(f"{gw['base']}/v1/models").status_code == 401
    assert load.failed == [] and load.ok > 5, (load.ok, load.failed)
    assert [r["key"] for r in request_log(gw, 400) if r["status"] == 200 and r["path"] == "/v1/chat/completions"
            and r["key"] not in ("team-a", VERIFY)][-1:] == ["team-b"]  # the rotated key's request, under its name
    # each re-run's verify counted under the gateway's own key, never a client's (issue 48 item 7)
    assert VERIFY in {r["key"] for r in request_log(gw, 400)}
    rc, out = deploy(gw, argv=limit)  # the first inventory again: team-b's first key
    assert rc == 0, out[-4000:]


def test_fleet_status_shows_the_gateway_and_its_pool(gw):
    """`qwen27b status` over the gateway's inventory: the gateway host is its unit and its pool
    (both backends, none drained after the rollout), the backends their service and health."""
    rc, out = deploy(gw, argv=["status", str(gw["inventory"]), "--json"], module="qwen27b.tools.cli")
    assert rc == 0, out[-3000:]
    rows = {row["host"]: row for row in json.loads(out[out.index("{"):])["hosts"]}
    g = rows[gw["host"].name]["gateway"]
    assert (g["active"], g["sub"]) == ("active", "running"), g
    assert sorted(g["pool"]) == sorted(b.name for b in gw["backends"]) and g["drained"] == [], g
    for backend in gw["backends"]:
        row = rows[backend.name]
        assert row["gateway"] is None and (row["active"], row["sub"]) == ("active", "running"), row
        assert row["health"] in ("OK", "WARNING"), row


PAGE_ACCOUNT = {"name": "Alice", "email": "alice@lab.example", "password": "alice-" + os.urandom(6).hex()}
SCREENSHOT = ROOT / "reports" / "e2e" / "chat-page.png"


def test_the_chat_page_signs_in_streams_an_answer_and_counts_it_under_the_accounts_key(gw):
    """Issue 29: qwen27b_chat_page on the gateway, a re-run of the gateway alone, as README's non-root
    sudo user (issue 56 item 5: the runs before were root's), with qwen27b_firewall_allow naming the
    controller (issue 56 item 3: the next test probes it). Open WebUI installs
    from the controller's wheelhouse and verifies (the admin signs in, the page lists the model); the
    admin adds Alice through the page's API; Alice signs in in a real headless Chromium (Debian's), sends
    a message and sees a streamed answer from the tiny model; `qwen27b usage` counts it under the key
    her account maps to. The page's key works only from the gateway host itself; a second run changes
    nothing; `qwen27b status` shows the page. A screenshot goes to reports/e2e/chat-page.png."""
    from qwen27b.controller.chat_page_render import wheelhouse_dir
    from qwen27b.onhost.secretfile import load_secret
    from qwen27b.tools.chat_page import build
    from tests.support.browser import add_user, chat_in_browser

    build(wheelhouse_dir(), ["/opt/wheels"])  # ./run builds it first; a module run alone may not have
    host = gw["host"]
    alice_key = "q27-alice-" + os.urandom(8).hex()
    alice_file = gw["work"] / "alice.key"
    alice_file.write_text(alice_key + "\n")
    alice_file.chmod(0o600)
    extra = {"qwen27b_gateway_key_files": [str(gw["work"] / "team-a.key"), str(gw["work"] / "team-b.key"),
                                           {"file": str(alice_file), "name": "alice"}],
             "qwen27b_chat_page": True, "qwen27b_chat_page_accounts": {PAGE_ACCOUNT["email"]: "alice"}, **SUDO}
    why_not = nft_usable(host)  # installs nftables first, as the firewall step would
    if why_not is None:
        extra["qwen27b_firewall_allow"] = [f"{controller_address(host)}/32"]
    gw["firewall"] = why_not or extra.get("qwen27b_firewall_allow")
    limit = [str(gw["inventory"]), "deploy.py", "-y", "--limit", host.name]
    started = time.monotonic()
    rc, out = deploy(gw, extra, argv=limit)
    gw["figures"]["chat_page_deploy_s"] = round(time.monotonic() - started)
    assert rc == 0, out[-5000:]
    assert f"[{host.name}] chat page verified: http://{host.address}:8080/" in out, out[-3000:]
    for port in ((8000, 8080) if why_not is None else ()):
        assert f"firewall: port {port}/tcp only from {controller_address(host)}/32 and the host itself" in out, out[-3000:]
    secrets_dir = gw["work"] / ".qwen27b" / "chat-page" / host.name
    page_key, admin_password = (load_secret(str(secrets_dir / name)) for name in ("page.key", "admin.password"))
    gw.setdefault("more_keys", []).extend([alice_key, page_key, admin_password, PAGE_ACCOUNT["password"],
                                           load_secret(str(secrets_dir / "session.secret"))])
    assert (secrets_dir / "admin.password").stat().st_mode & 0o077 == 0
    page = f"http://{host.address}:8080"
    # Alice's own setting, as a person sets it in the page: the tiny model once rambled to its whole
    # context (88 s of Chromium on 2 cores); the gateway counts her requests either way
    add_user(page, "admin@qwen27b.lab", admin_password, **PAGE_ACCOUNT, params={"max_tokens": 64})
    started = time.monotonic()
    chat = chat_in_browser(page, PAGE_ACCOUNT["email"], PAGE_ACCOUNT["password"], "Say hello in five words.", SCREENSHOT)
    gw["figures"]["chat_page_browser_s"] = round(time.monotonic() - started)
    assert chat["answer"].strip() and chat["chunks_seen"] >= 2, chat
    usage = {a["gateway"]: a for a in gateway_cli(gw, "usage")}[host.name]
    alice = usage["keys"].get("alice", {})
    assert alice.get("requests", 0) >= 1, usage
    # the page's key is the page's, on its host: from anywhere else it names nobody
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {page_key}",
                                           "X-OpenWebUI-User-Email": PAGE_ACCOUNT["email"]}) as c:
        assert c.post(f"{gw['base']}/v1/chat/completions", json=BODY).status_code in (401, 403)
    unit = host.testinfra().service("qwen27b-chat-page")
    assert unit.is_enabled and unit.is_running
    env = host.testinfra().file("/etc/qwen27b-chat/page.env")
    assert (env.user, env.mode) == ("root", 0o600)
    pid = host.run("systemctl show -p MainPID --value qwen27b-chat-page").stdout.strip()
    rc, out = deploy(gw, extra, argv=limit)
    assert rc == 0, out[-4000:]
    assert re.search(rf"== {host.name}: \d+ operation\(s\) planned, 0 would change the host", out), out[-3000:]
    assert host.run("systemctl show -p MainPID --value qwen27b-chat-page").stdout.strip() == pid
    rc, out = deploy(gw, argv=["status", str(gw["inventory"]), "--json"], module="qwen27b.tools.cli")
    g = {row["host"]: row for row in json.loads(out[out.index("{"):])["hosts"]}[host.name]["gateway"]
    assert g["page"] == {"active": "active", "sub": "running", "url": f"{page}/"}, g


def test_the_gateway_hosts_firewall_answers_its_list_and_refuses_another_address(gw):
    """Issue 56 item 3 on a test host: the chat page's deploy gave the gateway host
    qwen27b_firewall_allow (the controller's address). Its nftables table is loaded (`nft list
    ruleset`), the gateway's unit requires the firewall's (fail closed at boot), and the API's and the
    page's ports answer the controller while a second controller address, outside the list, gets a
    TCP reset (tests/support/firewall_probe.py, as the serving hosts' test in test_faults.py)."""
    host = gw["host"]
    if not isinstance(gw.get("firewall"), list):
        pytest.skip(gw.get("firewall") or "the chat page's deploy did not run")
    controller = controller_address(host)
    ruleset = host.run("nft list ruleset").stdout
    for port in (8000, 8080):
        assert f"ip saddr {controller} tcp dport {port} accept" in ruleset, ruleset
        assert f"tcp dport {port} reject with tcp reset" in ruleset, ruleset
    assert "qwen27b-firewall.service" in host.run("systemctl show -p Requires --value qwen27b-gateway").stdout.split()
    with stranger(host) as outsider:
        for url in (f"{gw['base']}/health", f"http://{host.address}:8080/health"):
            assert curl_code(url) == "200", url
            assert curl_code(url, outsider) == "000", url  # reset: curl gives no HTTP code


def test_no_key_anywhere_it_must_not_be(gw):
    host = gw["host"]
    places = {
        "nginx.conf": host.run("cat /etc/qwen27b-gateway/nginx.conf").stdout,
        "pool config": host.run("cat /etc/qwen27b-gateway/backends.json").stdout,
        "units": host.run("systemctl cat qwen27b-gateway qwen27b-gateway-pool qwen27b-chat-page", check=False).stdout,
        "chat page journal": host.run("journalctl --no-pager -u qwen27b-chat-page", timeout=60).stdout,
        "process list": host.run("ps -eo args").stdout,
        "journal": host.run("journalctl --no-pager -t qwen27b_gateway -u qwen27b-gateway -u qwen27b-gateway-pool",
                            timeout=60).stdout,
        "deploy output": "".join(log.read_text() for log in gw["logs"]),
        "reports": "".join(p.read_text() for p in (gw["work"] / "reports").glob("*.json")),
    }
    secrets = [BACKEND_KEY, *CLIENT_KEYS, *gw.get("more_keys", [])]
    tls_key = gw.get("lab_ca", gw["work"] / "none") / f"{host.name}.key"
    if tls_key.exists():  # the gateway's TLS key: its PEM body lines (less its public point, also in the certificate)
        public = tls_key.with_suffix(".crt").read_text()
        secrets += [line for line in tls_key.read_text().splitlines()
                    if line and not line.startswith("-----") and line not in public]
    leaked = [(where, i) for where, text in places.items() for i, key in enumerate(secrets) if key in text]
    assert leaked == []
    print(f"\ngateway figures: {json.dumps(gw['figures'])}")


GATEWAY_PATHS = ("/opt/qwen27b-gateway", "/etc/qwen27b-gateway", "/var/lib/qwen27b-gateway",
                 "/opt/qwen27b-chat", "/etc/qwen27b-chat", "/var/lib/qwen27b-chat", "/etc/qwen27b-gateway/firewall.nft")


def test_the_gateway_host_uninstalls_as_the_sudo_user(gw):
    """Issue 56 item 5, last (no module after uses the gateway host): `qwen27b uninstall --limit GATEWAY
    --chat-data` as README's non-root sudo user removes the chat page (its unit, venv, environment, its
    users and chats, its system user), the gateway's units, files and user, and the firewall's unit and
    table, each listed in the plan first; the backends keep serving."""
    host = gw["host"]
    rc, out = deploy(gw, SUDO, argv=["uninstall", str(gw["inventory"]), "--limit", host.name, "--chat-data"],
                     module="qwen27b.tools.cli")
    assert rc == 0, out[-5000:]
    for line in ("remove chat page user qwen27b-chat", "remove /var/lib/qwen27b-chat", "remove gateway user qwen27b-gateway"):
        assert line in out, out[-4000:]
    units = ["qwen27b-chat-page.service", "qwen27b-gateway.service", "qwen27b-gateway-pool.service", "qwen27b-firewall.service"]
    left = host.run(f"for u in {' '.join(units)}; do systemctl cat $u >/dev/null 2>&1 && echo $u; done; "
                    f"for p in {' '.join(GATEWAY_PATHS)}; do test -e $p && echo $p; done; "
                    "getent passwd qwen27b-chat qwen27b-gateway; nft list table inet qwen27b 2>/dev/null | head -1; true").stdout
    assert left.split() == [], left
    for backend in gw["backends"]:
        assert backend.run("systemctl is-active qwen27b.service", check=False).stdout.strip() == "active"
