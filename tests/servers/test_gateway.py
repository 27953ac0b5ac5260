"""The gateway before any host: its inventory checks (plan/gateway.py, refusals naming host, key and
fix), its rendered files (golden: tests/golden/gateway/, regenerate with QWEN27B_UPDATE_GOLDEN=1),
`nginx -t` and `systemd-analyze verify` of them, the pool rules (onhost/gateway_pool.py), and the
pool watcher driving a real nginx on loopback in front of two tiny HTTP backends (the backends are
stand-ins: what is tested is nginx's reloads, drains and retries; tests/e2e/test_scaleout_gateway.py has real
vLLM backends on test hosts)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from qwen27b.controller import gateway_render as G
from qwen27b.controller.gateway_drain import pool_command
from qwen27b.onhost import gateway_pool as P
from qwen27b.onhost.secretfile import load_secret
from qwen27b.plan.gateway import Backend, GatewayPlan, plan_gateways
from qwen27b.plan.hostdata import BadHostData
from qwen27b.plan.inventory import validate_inventory
from tests.support.gateway_lab import DevLog, config_test, render_scratch, running_nginx
from tests.support.gateway_lab import free_port as P_free_port
from tests.support.paths import TESTS
from tests.support.gateway_stubs import B1, B2, GW, key_file, keys, lab, nginx_binary, plan_of, stub  # noqa: F401 (keys: fixture)

GOLDEN = TESTS / "golden" / "gateway"


def test_plan_reads_every_backend_from_its_own_host_data(keys):
    plan = plan_of(*lab(keys))
    assert (plan.address, plan.port, plan.request_timeout_s) == (GW, 8000, 600)
    assert plan.backends == (Backend("gpu-1", B1, 8000, 9120), Backend("gpu-2", B2, 8001, 9120))
    assert plan.backend_key_file == keys["backend"] and plan.key_files == (keys["a"], keys["b"])
    assert any("backends' key is added by the gateway" in line for line in plan.describe())


def test_gateway_keys_are_typed_and_near_misses_named(keys):
    hosts, groups = lab(keys, gateway={"qwen27b_gateway_prot": 80})
    with pytest.raises(BadHostData, match="did you mean 'qwen27b_gateway_port'"):
        validate_inventory(hosts, groups)
    hosts, groups = lab(keys, gateway={"qwen27b_gateway_port": "80"})
    with pytest.raises(BadHostData, match="qwen27b_gateway_port: expected int"):
        validate_inventory(hosts, groups)


def _other_key(tmp_path):
    return {"qwen27b_api_key_file": key_file(tmp_path, "other.key", "another-backend-key")}


REFUSALS = [  # (gateway data, backend 1 data, refused host, key, text)
    ({"qwen27b_gateway_key_files": []}, {}, "gw", "qwen27b_gateway_key_files", "at least one client key"),
    ({"qwen27b_gateway_key_files": "K"}, {}, "gw", "qwen27b_gateway_key_files", "mode 644"),
    ({"qwen27b_gateway_key_files": "SAME"}, {}, "gw", "qwen27b_gateway_key_files", "holds the same key"),
    ({"qwen27b_gateway_key_files": "BACKEND"}, {}, "gw", "qwen27b_gateway_key_files", "is the backends' API key"),
    ({}, {"qwen27b_served_model_name": "other"}, "gw", "qwen27b_served_model_name", "serve different names"),
    ({}, "OTHER_KEY", "gw", "qwen27b_api_key_file", "do not share one API key"),
    ({"qwen27b_gateway_backends": ["gpu-1", "gpu-9"]}, {}, "gw", "qwen27b_gateway_backends", "'gpu-9' is not a host"),
    ({"qwen27b_gateway_backends": ["gw"]}, {}, "gw", "qwen27b_gateway_backends", "is a gateway"),
    ({"ssh_hostname": "gw.lab"}, {}, "gw", "qwen27b_gateway_bind_address", "lab address is unknown"),
    ({}, {"ssh_hostname": "gpu-1.lab"}, "gpu-1", "qwen27b_bind_address", "cannot tell where this backend listens"),
    ({}, {"qwen27b_bind_address": "127.0.0.1"}, "gpu-1", "qwen27b_bind_address", "loopback"),
    ({}, {"qwen27b_bind_address": "::ffff:127.0.0.1"}, "gpu-1", "qwen27b_bind_address", "IPv4-mapped"),
    ({}, {"qwen27b_bind_address": "::ffff:7f00:2"}, "gpu-1", "qwen27b_bind_address", "127.0.0.2, loopback"),
    ({"qwen27b_gateway_port": 70000}, {}, "gw", "qwen27b_gateway_port", "out of range"),
    # qwen27b_gateway_metrics_allow: the same network parser as every other allow-list (issue 51)
    ({"qwen27b_gateway_metrics_allow": ["10.0.0.7/8"]}, {}, "gw", "qwen27b_gateway_metrics_allow", "host bits set"),
    ({"qwen27b_gateway_metrics_allow": ["fe80::1%eth0/128"]}, {}, "gw", "qwen27b_gateway_metrics_allow", "zone id"),
    ({"qwen27b_gateway_metrics_allow": ["10.0.0.5/32; allow all"]}, {}, "gw", "qwen27b_gateway_metrics_allow", "not a network"),
    ({"qwen27b_gateway_metrics_allow": [167772165]}, {}, "gw", "qwen27b_gateway_metrics_allow", "not a network"),
    ({"qwen27b_gateway_metrics_allow": [True]}, {}, "gw", "qwen27b_gateway_metrics_allow", "not a network"),
]


@pytest.mark.parametrize("gateway, b1, refused, key, text", REFUSALS,
                         ids=[f"{r[3]}-{r[4][:24]}" for r in REFUSALS])
def test_bad_gateway_inventories_are_refused_naming_host_key_and_fix(tmp_path, keys, gateway, b1, refused, key, text):
    files = gateway.get("qwen27b_gateway_key_files")
    if files == "K":
        gateway = {**gateway, "qwen27b_gateway_key_files": [key_file(tmp_path, "open.key", "open-0", 0o644)]}
    elif files == "SAME":
        gateway = {**gateway, "qwen27b_gateway_key_files": [keys["a"], key_file(tmp_path, "a2.key", "client-a-4567")]}
    elif files == "BACKEND":
        gateway = {**gateway, "qwen27b_gateway_key_files": [keys["a"], keys["backend"]]}
    if b1 == "OTHER_KEY":
        b1 = _other_key(tmp_path)
    with pytest.raises(BadHostData) as error:
        validate_inventory(*lab(keys, gateway, b1))
    assert (error.value.host, error.value.key) == (refused, key) and text in str(error.value), str(error.value)
    assert "Fix:" in str(error.value)


@pytest.mark.parametrize("b1, expected, added", [
    ({"qwen27b_metrics_allow": ["10.9.0.0/16"]}, {"metrics_allow": ["10.9.0.0/16", f"{GW}/32"], "firewall_allow": None},
     ["metrics_allow"]),
    ({"qwen27b_metrics_allow": None}, {"metrics_allow": [f"{GW}/32"], "firewall_allow": None}, ["metrics_allow"]),
    ({"qwen27b_firewall_allow": [f"{B1}/32"]}, {"metrics_allow": [f"{GW}/32"], "firewall_allow": [f"{B1}/32", f"{GW}/32"]},
     ["firewall_allow"]),
])
def test_the_gateways_address_is_added_to_a_backends_allow_lists_and_the_plan_says_so(keys, b1, expected, added):
    """Issue 48 item 5: a backend whose allow-list lacks its gateway (both in the inventory) gets the
    gateway's address added (its deploy's settings), and the gateway's plan line of that backend says
    so; the other backend, which has it, is left as it is and its line says nothing."""
    hosts, groups = lab(keys, b1=b1)
    settings = validate_inventory(hosts, groups)
    assert {k: getattr(settings["gpu-1"], k) for k in expected} == expected
    assert settings["gpu-2"].metrics_allow == [f"{GW}/32"] and settings["gpu-2"].firewall_allow is None
    lines = plan_gateways(hosts, groups, settings)["gw"].describe()
    mine = next(line for line in lines if line.startswith("  backend gpu-1:"))
    for key in expected:
        assert (f"qwen27b_{key} += {GW}/32 (the gateway's address, added" in mine) == (key in added), mine
    other = next(line for line in lines if line.startswith("  backend gpu-2:"))
    assert "the gateway's address" not in other
    # issue 51: both backends serve every stream with its usage, for the gateway's counts and budgets
    assert all("qwen27b_serve_flags += --enable-force-include-usage (added: every stream reports its usage" in line
               for line in (mine, other))
    assert settings["gpu-1"].serve_flags == settings["gpu-2"].serve_flags == {"--enable-force-include-usage": True}


def test_a_serving_groups_worker_is_no_backend_and_cannot_be_listed(keys):
    """A Ray worker of a serving group (multi-node) runs no API: its head serves for the group."""
    pair = {"qwen27b_node_group": "pair-a", "qwen27b_node_interface": "eth1", "qwen27b_interconnect_gbps": 10}
    hosts, groups = lab(keys, b1={**pair, "qwen27b_node_role": "head"},
                        b2={**pair, "qwen27b_node_role": "worker", "qwen27b_port": 8000})
    assert [b.name for b in plan_of(hosts, groups).backends] == ["gpu-1"]
    hosts, groups = lab(keys, gateway={"qwen27b_gateway_backends": ["gpu-1", "gpu-2"]},
                        b1={**pair, "qwen27b_node_role": "head"},
                        b2={**pair, "qwen27b_node_role": "worker", "qwen27b_port": 8000})
    with pytest.raises(BadHostData, match="gpu-2 is a Ray worker") as error:
        plan_of(hosts, groups)
    assert error.value.key == "qwen27b_gateway_backends"


def test_gateway_keys_outside_the_gateway_group_are_refused(keys):
    hosts, groups = lab(keys, b1={"qwen27b_gateway_port": 8080})
    with pytest.raises(BadHostData, match="gpu-1: qwen27b_gateway_port: only hosts of the qwen27b_gateway group"):
        validate_inventory(hosts, groups)


def test_an_inventory_without_a_gateway_plans_none(keys):
    hosts, _ = lab(keys, gateway={"qwen27b_gateway_key_files": None})
    assert plan_gateways(hosts[1:], {}, validate_inventory(hosts[1:])) == {}


# ---------------------------------------------------------------- rendered files

def reference_plan() -> GatewayPlan:
    """Two keys: team-a limited (60 requests a minute, 2 at once, a million tokens a day), team-b
    not; fair share on; a Prometheus at 10.0.0.5 may read the usage counters."""
    from qwen27b.plan.gateway import Client

    keys = GOLDEN / "keys"
    files = (str(keys / "team-a.key"), str(keys / "team-b.key"))
    return GatewayPlan("gw", GW, 8000, files, (Backend("gpu-1", B1, 8000, 9120), Backend("gpu-2", B2, 8001, 9120)),
                       str(keys / "backend.key"), "qwen3.8-27b", 600,
                       clients=(Client("team-a", files[0], 60, 2, 1000000), Client("team-b", files[1])),
                       metrics_allow=("10.0.0.5/32",), fair_share=True)


@pytest.fixture(scope="module")
def rendered():
    for path in (GOLDEN / "keys").iterdir():
        path.chmod(0o600)  # git keeps 0644
    files = {Path(path).name: text for path, text in G.render_gateway(reference_plan()).items()}
    files["keys.conf"] = G.keys_text(reference_plan())
    from qwen27b.plan.gateway import Tls  # the admin's files: rendering reads neither (the role pushes them)
    tls = dataclasses.replace(reference_plan(), tls=Tls(cert_file="/srv/lab/gw.crt", key_file="/srv/lab/gw.key"),
                              log_bodies=True)  # and the bodies kept in the request log
    files["nginx-tls.conf"] = G.render_gateway(tls)[G.layout()["config"]]
    return files


@pytest.mark.parametrize("name", ["nginx.conf", "nginx-tls.conf", "keys.conf", "backends.json", G.GATEWAY_UNIT,
                                  G.POOL_UNIT])
def test_rendered_files_match_golden(rendered, name):
    golden = GOLDEN / name
    if os.environ.get("QWEN27B_UPDATE_GOLDEN"):
        golden.write_text(rendered[name])
    assert rendered[name] == golden.read_text()


def test_keys_stay_out_of_every_file_but_the_secret_include(rendered):
    secrets = ["team-a-golden-key", "team-b-golden-key", "backend-golden-key"]
    assert all(s in rendered["keys.conf"] for s in secrets)
    assert not [(n, s) for n, text in rendered.items() if n != "keys.conf" for s in secrets if s in text]


def test_rendered_config_passes_nginx_t(tmp_path):
    plan = dataclasses.replace(reference_plan(), address="127.0.0.1", port=P_free_port())  # -t binds it
    result = config_test(plan, tmp_path, nginx_binary(), ["gpu-1"])
    assert result.returncode == 0 and "test is successful" in result.stderr, result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_config_passes_nginx_t_before_the_watcher_has_written_the_fair_share(tmp_path):
    """An upgraded gateway reloads (ExecReload: nginx -t) maybe before the restarted watcher's first
    round: the fair-share include must not be required to exist yet."""
    plan = dataclasses.replace(reference_plan(), address="127.0.0.1", port=P_free_port())
    assert plan.fair_share
    where = render_scratch(plan, tmp_path)
    Path(where["upstream_file"]).parent.mkdir(parents=True, exist_ok=True)
    Path(where["upstream_file"]).write_text(P.upstream_text(json.loads(G.pool_config(plan, where)), ["gpu-1"]))
    assert not Path(where["fair_file"]).exists()
    result = subprocess.run([nginx_binary(), "-t", "-c", where["config"]], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_units_pass_systemd_analyze_verify(tmp_path, rendered):
    for name in (G.GATEWAY_UNIT, G.POOL_UNIT):
        (tmp_path / name).write_text(rendered[name])
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *(str(tmp_path / n) for n in (G.GATEWAY_UNIT, G.POOL_UNIT))],
                            capture_output=True, text=True, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    # the binaries and the package live on the gateway host, not here
    problems = [line for line in result.stderr.splitlines() if "is not executable" not in line
                and "No such file" not in line and "Command " not in line]
    assert problems == [], result.stderr


def test_drain_command_quotes_its_arguments():
    assert pool_command("drain", "gpu-1; rm -rf /", "--wait", "60") == (
        "PYTHONPATH=/opt/qwen27b-gateway/lib /usr/bin/python3 -m qwen27b_onhost.gateway_pool --config "
        "/etc/qwen27b-gateway/backends.json drain 'gpu-1; rm -rf /' --wait 60")


# ---------------------------------------------------------------- the pool's rules

BACKENDS = [{"name": "a", "address": "10.0.0.1", "port": 8000}, {"name": "b", "address": "10.0.0.2", "port": 8001}]


def test_counts_follow_each_round():
    counts = P.next_counts({}, {"a": True, "b": False})
    assert counts == {"a": 1, "b": -1}
    counts = P.next_counts(counts, {"a": False, "b": False})
    assert counts == {"a": -1, "b": -2}
    assert P.next_counts(counts, {"a": True, "b": True}) == {"a": 1, "b": 1}


@pytest.mark.parametrize("counts, was_in, drained, pool, failed_open", [
    ({}, set(), set(), ["a", "b"], False),  # no round yet: nginx's passive checks decide
    ({"a": 5, "b": -1}, {"a", "b"}, set(), ["a", "b"], False),  # one failed round: still in (fall 2)
    ({"a": 5, "b": -2}, {"a", "b"}, set(), ["a"], False),  # two: out
    ({"a": 5, "b": 1}, {"a"}, set(), ["a"], False),  # back after one good round? not yet (rise 2)
    ({"a": 5, "b": 2}, {"a"}, set(), ["a", "b"], False),
    ({"a": 5, "b": 9}, {"a", "b"}, {"b"}, ["a"], False),  # drained: out whatever its health
    ({"a": -3, "b": -3}, {"a", "b"}, set(), ["a", "b"], True),  # none healthy: fail open
    ({"a": -3, "b": -3}, {"a", "b"}, {"b"}, ["a"], True),  # ... but a drain holds
    ({"a": 3, "b": 3}, set(), {"a", "b"}, [], True),
])
def test_pool_members(counts, was_in, drained, pool, failed_open):
    assert P.members(BACKENDS, counts, was_in, drained, fall=2, rise=2) == (pool, failed_open)


def test_upstream_text_keeps_every_server_and_marks_the_ones_out():
    text = P.upstream_text({"backends": BACKENDS, "max_fails": 1, "fail_timeout_s": 5}, ["b"])
    assert text.splitlines()[1:] == ["server 10.0.0.1:8000 max_fails=1 fail_timeout=5s down;",
                                     "server 10.0.0.2:8001 max_fails=1 fail_timeout=5s;"]


# ---------------------------------------------------------------- the watcher and a real nginx

@pytest.fixture
def loopback(tmp_path, keys):
    """nginx (the rendered config, as root would run it) and the watcher's config, on loopback."""
    stubs = {name: stub(name) for name in ("a", "b")}
    port = P_free_port()
    plan = GatewayPlan("gw", "127.0.0.1", port, (keys["a"],),
                       tuple(Backend(n, "127.0.0.1", s.server_address[1], s.server_address[1]) for n, s in stubs.items()),
                       keys["backend"], None, 600)
    try:
        with running_nginx(plan, tmp_path / "root", nginx_binary()) as where:
            pool, env = where["pool"], where["env"]
            yield {"base": where["base"], "stubs": stubs, "config": P.load_config(where["pool_config"]),
                   "pool": lambda *args: subprocess.run(pool + list(args), env=env, capture_output=True, text=True),
                   "key": "client-a-4567"}
    finally:
        for s in stubs.values():
            s.shutdown()


def ask(lb, n: int = 6, key: str | None = "client-a-4567") -> list:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=10, headers=headers) as c:
        return [c.post(f"{lb['base']}/v1/chat/completions", json={}) for _ in range(n)]


def served_by(answers) -> list[str]:
    return [a.json()["backend"] for a in answers]


def test_nginx_swaps_the_client_key_for_the_backends_and_refuses_others(loopback):
    assert set(served_by(ask(loopback))) == {"a", "b"}
    assert {s for stub_ in loopback["stubs"].values() for s in stub_.seen} == {"Bearer backend-key-0123"}
    assert [a.status_code for a in ask(loopback, 2, key=None) + ask(loopback, 2, key="backend-key-0123")] == [401] * 4


def raw_get(lb, target: str, key: str | None = None, method: str = "GET", source: str | None = None) -> int:
    """The status of `GET target` sent as written (httpx would normalise the path), from `source`
    (a loopback address) where given."""
    import http.client

    conn = http.client.HTTPConnection(lb["base"].removeprefix("http://"), timeout=10,
                                      source_address=(source, 0) if source else None)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        if key:
            conn.putheader("Authorization", f"Bearer {key}")
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def backend_paths(lb) -> list[tuple[str, str | None]]:
    """What the backends got since the last forget() (the fixture's start probed them)."""
    return [got for s in lb["stubs"].values() for got in s.got]


def forget(lb) -> None:
    for s in lb["stubs"].values():
        s.got.clear()


@pytest.mark.parametrize("target", ["/metrics/../health", "/metrics/%2e%2e/health", "/metrics%2f..%2fhealth",
                                    "/metrics/./../health", "/v1/../health", "//metrics/../health", "/metrics%5c..%5chealth"])
def test_the_keyless_health_route_forwards_nothing_but_health(loopback, target):
    """nginx routes on the normalised path: whatever path the client sent, without a key the backends
    get /health or nothing (issue 25: /metrics/../health returned every backend's metrics)."""
    forget(loopback)
    status = raw_get(loopback, target)
    assert status in (400, 401, 200)
    assert all(path == "/health" and auth is None for path, auth in backend_paths(loopback)), backend_paths(loopback)


def test_metrics_through_the_gateway_needs_a_client_key(loopback):
    forget(loopback)
    assert raw_get(loopback, "/metrics") == 401 and backend_paths(loopback) == []
    assert raw_get(loopback, "/health") == 200 and backend_paths(loopback) == [("/health", None)]
    forget(loopback)
    assert raw_get(loopback, "/metrics", key=loopback["key"]) == 200
    assert backend_paths(loopback) == [("/metrics", "Bearer backend-key-0123")]


@pytest.mark.parametrize("target", ["/tokenize", "/detokenize", "/scale_elastic_ep", "/inference/v1/abort_requests",
                                    "/v1/responses", "/v1/responses/resp_1", "/v1/messages", "/v1/load_lora_adapter",
                                    "/version", "/v1/models/", "/v1/chat/completions/x", "/invocations", "/"])
def test_a_client_key_reaches_only_the_client_routes(loopback, target):
    """Issue 51: every client key reached every backend route with the backends' key (tokenizer,
    elastic scaling, aborting others' requests, stored responses, LoRA loading). Only the OpenAI
    routes a client needs are forwarded; the rest is 404 and never reaches a backend."""
    forget(loopback)
    assert raw_get(loopback, target, key=loopback["key"], method="POST") == 404
    assert backend_paths(loopback) == []


def test_the_client_routes_are_forwarded(loopback):
    from qwen27b.plan.gateway import CLIENT_ROUTES

    forget(loopback)
    assert [raw_get(loopback, route, key=loopback["key"], method="POST") for route in CLIENT_ROUTES] == [200] * len(CLIENT_ROUTES)
    assert sorted(path for path, _ in backend_paths(loopback)) == sorted(CLIENT_ROUTES)
    forget(loopback)
    assert raw_get(loopback, "/v1/models?limit=1", key=loopback["key"]) == 200 and len(backend_paths(loopback)) == 1


def test_the_backends_metrics_go_only_to_a_named_scraper(loopback):
    """/metrics through the gateway: loopback and qwen27b_gateway_metrics_allow (none here) only,
    with a client key; a client key from another address gets 404 (127.0.0.2 stands for one)."""
    forget(loopback)
    assert raw_get(loopback, "/metrics", key=loopback["key"], source="127.0.0.2") == 404
    assert backend_paths(loopback) == []
    assert raw_get(loopback, "/metrics", key=loopback["key"], source="127.0.0.1") == 200


def test_client_keys_match_exactly(loopback):
    """nginx's map compares plain strings case-insensitively: the keys are exact regexes."""
    key = loopback["key"]
    assert [a.status_code for a in ask(loopback, 1, key=key)] == [200]
    for other in (key.upper(), key.swapcase(), key.replace("-", "."), key + "x", "x" + key):
        assert [a.status_code for a in ask(loopback, 1, key=other)] == [401], other


def test_drain_takes_a_backend_out_by_a_graceful_reload_and_undrain_brings_it_back(loopback):
    for s in loopback["stubs"].values():
        s.delay = 1.5
    answers = []
    slow = threading.Thread(target=lambda: answers.extend(ask(loopback, 1)))
    slow.start()  # a request in flight, held by one of nginx's workers
    time.sleep(0.3)
    drained = loopback["pool"]("drain", "a", "--wait", "20")
    slow.join()
    record = json.loads(drained.stdout)
    assert drained.returncode == 0 and record["drained"] and record["pool"] == ["b"], drained.stderr
    assert record["waited_s"] >= 0.5 and [a.status_code for a in answers] == [200]  # waited for it, and it ended well
    for s in loopback["stubs"].values():
        s.delay = 0
    assert set(served_by(ask(loopback))) == {"b"}
    back = json.loads(loopback["pool"]("undrain", "a").stdout)
    assert back["pool"] == ["a", "b"]  # no round yet: in at once, nginx's passive check decides
    time.sleep(0.5)
    assert set(served_by(ask(loopback))) == {"a", "b"}


def test_the_watcher_takes_an_unhealthy_backend_out_and_back(loopback):
    config = loopback["config"]
    loopback["stubs"]["b"].sick = True
    counts = {}
    for _ in range(2):  # fall 2: two rounds
        counts = P.next_counts(counts, {b["name"]: P.healthy(b, 1) for b in config["backends"]})
        P.apply(config, counts)
    assert json.loads(loopback["pool"]("status").stdout)["pool"] == ["a"]
    time.sleep(0.5)
    assert set(served_by(ask(loopback))) == {"a"}
    loopback["stubs"]["b"].sick = False
    for _ in range(2):
        counts = P.next_counts(counts, {b["name"]: P.healthy(b, 1) for b in config["backends"]})
        P.apply(config, counts)
    time.sleep(0.5)
    assert set(served_by(ask(loopback))) == {"a", "b"}


def test_a_backend_that_refuses_connections_is_retried_on_the_other_without_an_error(loopback):
    loopback["stubs"]["b"].shutdown()
    loopback["stubs"]["b"].server_close()
    answers = ask(loopback, 8)
    assert [a.status_code for a in answers] == [200] * 8 and set(served_by(answers)) == {"a"}


# ---------------------------------------------------------------- copies as backends (issue 26)

def copies_lab(keys, copies: dict):
    """lab() with gpu-2 serving copies (no qwen27b_port of its own: each copy has one)."""
    hosts, groups = lab(keys, b2=copies)
    hosts[2][1].pop("qwen27b_port")
    return hosts, groups


def test_each_copy_of_a_host_is_a_backend_on_its_port_and_health_path(keys):
    """A backend host serving qwen27b_instances gives one backend per copy: HOST.NAME, the copy's
    port, its verdict on /health/NAME of the host's one endpoint; a copy's own key must be the pool's."""
    copies = {"qwen27b_instances": [{"name": "a", "gpus": [0, 1], "port": 8000}, {"name": "b", "gpus": [2, 3], "port": 8002}]}
    plan = plan_of(*copies_lab(keys, copies))
    assert plan.backends == (Backend("gpu-1", B1, 8000, 9120), Backend("gpu-2.a", B2, 8000, 9120, "/health/a"),
                             Backend("gpu-2.b", B2, 8002, 9120, "/health/b"))
    assert any("backend gpu-2.b: " in line and f"{B2}:9120/health/b" in line for line in plan.describe())
    config = json.loads(G.pool_config(plan, G.layout()))
    assert [b.get("health_path") for b in config["backends"]] == [None, "/health/a", "/health/b"]
    assert "server" in P.upstream_text({**config, "max_fails": 3, "fail_timeout_s": 5}, ["gpu-2.a"])
    own = {"qwen27b_instances": [{**copies["qwen27b_instances"][0], "api_key_file": keys["a"]},
                                 copies["qwen27b_instances"][1]]}
    with pytest.raises(BadHostData, match="do not share one API key"):
        plan_of(*copies_lab(keys, own))


def test_the_pool_probes_a_copys_own_health_path(monkeypatch):
    asked = []
    monkeypatch.setattr(P, "probe", lambda url, timeout: asked.append(url) or (True, {"slots": 2}))
    assert P.verdict({"address": "10.0.0.2", "port": 8002, "health_port": 9120, "health_path": "/health/b"}, 1.0) == (True, 2)
    assert P.healthy({"address": "10.0.0.1", "port": 8000, "health_port": 9120}, 1.0)
    assert asked == ["http://10.0.0.2:9120/health/b", "http://10.0.0.2:8002/health",
                     "http://10.0.0.1:9120/health", "http://10.0.0.1:8000/health"]


@pytest.mark.parametrize("body, slots", [({"slots": 4}, 4), ({}, None), ({"slots": None}, None), ({"slots": "4"}, None),
                                         ({"slots": True}, None), ({"slots": 0}, None), ({"slots": 10**9}, None)])
def test_a_backends_slots_are_taken_from_its_health_answer_only_as_a_sane_whole_number(monkeypatch, body, slots):
    monkeypatch.setattr(P, "probe", lambda url, timeout: (True, body))
    assert P.verdict({"address": "10.0.0.1", "port": 8000, "health_port": 9120}, 1.0) == (True, slots)


def test_the_watcher_keeps_a_backends_slots_when_a_probe_of_it_fails(tmp_path, monkeypatch):
    """A health probe that timed out says no slots: the fair share (and nginx's config) stays."""
    config = P.load_config(str(write_pool_config(tmp_path)))
    rounds = iter([({"a": True, "b": True}, {"a": 4, "b": 4}), ({"a": True, "b": False}, {"a": 4})])
    monkeypatch.setattr(P, "probe_all", lambda config, pool: next(rounds))
    monkeypatch.setattr(P.time, "sleep", lambda s: None)
    P.watch(config, rounds=2)
    record = P.read_json(config["pool_file"], {})
    assert record["slots"] == {"a": 4, "b": 4} and record["fair_share"] == 7


def write_pool_config(tmp_path: Path) -> Path:
    path = tmp_path / "backends.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "fair_share": True,
                                "backends": [{"name": n, "address": "10.0.0.1", "port": p, "health_port": 9120}
                                             for n, p in (("a", 8000), ("b", 8001))]}))
    return path


@pytest.mark.parametrize("on, pool, slots, share", [
    (True, ["a", "b"], {"a": 4, "b": 4}, 7),  # 8 slots: one key at most 7, one always left for another
    (True, ["a"], {"a": 4, "b": 4}, 3),  # b out of the pool: its slots do not count
    (True, ["a"], {"a": 1}, 1),  # one slot: shared in turn
    (True, ["a", "b"], {"a": 4}, None),  # b has not said (an older qwen27b-health): no limit
    (False, ["a", "b"], {"a": 4, "b": 4}, None),  # off
    (True, [], {}, None),
])
def test_each_keys_fair_share_is_the_pools_slots_less_one(on, pool, slots, share):
    config = {"fair_share": on}
    assert P.fair_share(config, pool, slots) == share
    text = P.fair_text(config, pool, slots)
    if share is None:
        assert "limit_conn qwen27b_fair" not in text and "# no limit: " in text
    else:
        assert text.splitlines()[1:] == [f"set $qwen27b_fair_share {share};", f"limit_conn qwen27b_fair {share};"]


# ---------------------------------------------------------------- TLS (issue 28): the plan, the lab CA, nginx

def issued(tmp_path, address: str = GW, mode: int = 0o600) -> dict:
    """An admin's certificate and key files for `address` (issued here by a throwaway lab CA)."""
    from qwen27b.controller import labca

    cert, key = labca.gateway_cert(tmp_path / f"pki-{address}", "gw", [address])
    (tmp_path / "gw.crt").write_bytes(cert)
    key_path = tmp_path / "gw.key"
    key_path.write_bytes(key)
    key_path.chmod(mode)
    return {"qwen27b_gateway_tls_cert": str(tmp_path / "gw.crt"), "qwen27b_gateway_tls_key": str(key_path)}


def test_tls_from_the_admins_files_or_a_lab_ca_and_the_plan_says_which(tmp_path, keys):
    plain = plan_of(*lab(keys))
    assert plain.tls is None and plain.scheme == "http"
    assert any(line.strip().startswith("plain HTTP: client keys, prompts and answers cross the network unencrypted")
               for line in plain.describe())
    files = plan_of(*lab(keys, gateway=issued(tmp_path)))
    assert files.scheme == "https" and files.tls.cert_file == str(tmp_path / "gw.crt")
    assert any(f"TLS: the certificate {tmp_path / 'gw.crt'}" in line for line in files.describe())
    ca = plan_of(*lab(keys, gateway={"qwen27b_gateway_tls_lab_ca": str(tmp_path / "lab-ca")}))
    assert ca.tls.lab_ca_dir == str(tmp_path / "lab-ca") and not (tmp_path / "lab-ca").exists()  # planning makes nothing
    assert any(f"clients trust {tmp_path / 'lab-ca'}/ca.crt" in line for line in ca.describe())


TLS_REFUSALS = [  # (gateway data, key, text)
    ({"qwen27b_gateway_tls_cert": "CERT"}, "qwen27b_gateway_tls_key", "TLS needs the certificate and its key"),
    ({"qwen27b_gateway_tls_key": "KEY"}, "qwen27b_gateway_tls_cert", "TLS needs the certificate and its key"),
    ({"qwen27b_gateway_tls_cert": "CERT", "qwen27b_gateway_tls_key": "KEY", "qwen27b_gateway_tls_lab_ca": "DIR"},
     "qwen27b_gateway_tls_lab_ca", "would come from two places"),
    ("OPEN_KEY", "qwen27b_gateway_tls_key", "mode 644, readable by others"),
    ("OTHER_ADDRESS", "qwen27b_gateway_tls_cert", f"not the gateway's address {GW}"),
    ({"qwen27b_gateway_tls_cert": "KEY", "qwen27b_gateway_tls_key": "KEY"}, "qwen27b_gateway_tls_cert", "holds no PEM certificate"),
    ({"qwen27b_gateway_tls_cert": "CERT", "qwen27b_gateway_tls_key": "CERT_0600"}, "qwen27b_gateway_tls_key", "holds no PEM private key"),
    ({"qwen27b_gateway_tls_cert": "/nonexistent.crt", "qwen27b_gateway_tls_key": "KEY"}, "qwen27b_gateway_tls_cert", "cannot read"),
    ({"qwen27b_gateway_tls_lab_ca": "CERT"}, "qwen27b_gateway_tls_lab_ca", "is not a directory"),
    ({"qwen27b_gateway_tls_lab_ca": 7}, "qwen27b_gateway_tls_lab_ca", "expected str"),
]


@pytest.mark.parametrize("gateway, key, text", TLS_REFUSALS, ids=[f"{r[1]}-{r[2][:20]}" for r in TLS_REFUSALS])
def test_bad_tls_settings_are_refused_naming_host_key_and_fix(tmp_path, keys, gateway, key, text):
    files = issued(tmp_path)
    private_cert = tmp_path / "cert-0600.pem"
    private_cert.write_bytes(Path(files["qwen27b_gateway_tls_cert"]).read_bytes())
    private_cert.chmod(0o600)
    names = {"CERT": files["qwen27b_gateway_tls_cert"], "KEY": files["qwen27b_gateway_tls_key"], "DIR": str(tmp_path),
             "CERT_0600": str(private_cert)}
    if gateway == "OPEN_KEY":
        gateway = issued(tmp_path, mode=0o644)
    elif gateway == "OTHER_ADDRESS":
        gateway = issued(tmp_path, address="10.0.0.99")
    else:
        gateway = {k: names.get(v, v) for k, v in gateway.items()}
    with pytest.raises(BadHostData) as error:
        validate_inventory(*lab(keys, gateway))
    assert (error.value.host, error.value.key) == ("gw", key) and text in str(error.value), str(error.value)
    assert "Fix:" in str(error.value) or "did you mean" in str(error.value) or "expected" in str(error.value)


def test_the_lab_ca_is_made_once_and_the_gateways_cert_kept_until_its_address_changes(tmp_path):
    from cryptography import x509

    from qwen27b.controller import labca
    from qwen27b.plan.gateway import cert_names

    root = tmp_path / "lab-ca"
    cert, key = labca.gateway_cert(root, "gw", [GW])
    assert oct(root.stat().st_mode & 0o777) == oct(0o700)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in root.iterdir()} == {
        "ca.crt": oct(0o644 & ~_umask()), "ca.key": oct(0o600), "gw.crt": oct(0o644 & ~_umask()), "gw.key": oct(0o600)}
    assert cert_names(cert) == {GW} and b"PRIVATE KEY-----" in key
    assert labca.gateway_cert(root, "gw", [GW]) == (cert, key)  # a second run: the same pair, nothing changes
    ca = (root / "ca.crt").read_bytes()
    moved, _ = labca.gateway_cert(root, "gw", ["10.0.0.10"])
    assert cert_names(moved) == {"10.0.0.10"} and (root / "ca.crt").read_bytes() == ca  # the same CA signs it
    issuer = x509.load_pem_x509_certificate(ca).subject
    assert x509.load_pem_x509_certificate(moved).issuer == issuer
    (root / "ca.key").chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        labca.gateway_cert(root, "gw", [GW])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.fixture
def tls_loopback(tmp_path, keys):
    """The rendered config with a lab CA's certificate for 127.0.0.1, nginx on loopback, one stub."""
    from qwen27b.plan.gateway import Tls

    backend = stub("a")
    port = P_free_port()
    plan = GatewayPlan("gw", "127.0.0.1", port, (keys["a"],), (Backend("a", "127.0.0.1", backend.server_address[1],
                       backend.server_address[1]),), keys["backend"], None, 600, Tls(lab_ca_dir=str(tmp_path / "lab-ca")))
    try:
        with running_nginx(plan, tmp_path / "root", nginx_binary()) as where:
            assert "ssl;" in Path(where["config"]).read_text() and "ssl_certificate_key" in Path(where["config"]).read_text()
            yield {"base": where["base"], "ca": str(tmp_path / "lab-ca" / "ca.crt"), "port": port, "stub": backend}
    finally:
        backend.shutdown()


def test_nginx_serves_tls_that_a_client_verifies_with_the_lab_ca_only(tls_loopback):
    """A real nginx with the rendered TLS lines and the lab CA's certificate: a client trusting the
    lab CA gets through (the key still swapped for the backends'), one with the system's CAs only
    refuses the handshake, plain HTTP to the port gets 400, and the verifier's own request (postdeploy,
    what the deploy's verify uses) trusts it once told the CA."""
    from qwen27b.controller import postdeploy as V

    base = tls_loopback["base"]
    with httpx.Client(verify=ssl.create_default_context(cafile=tls_loopback["ca"]), headers={"Authorization": "Bearer client-a-4567"}) as c:
        answer = c.post(f"{base}/v1/chat/completions", json={})
        assert answer.status_code == 200 and answer.json()["backend"] == "a"
    assert tls_loopback["stub"].seen[-1] == "Bearer backend-key-0123"
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{base}/health", timeout=5)
    assert httpx.get(f"http://127.0.0.1:{tls_loopback['port']}/health", timeout=5).status_code == 400
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        V._request(f"{base}/health", timeout=5)  # noqa: SLF001
    V.trust(base, tls_loopback["ca"])
    try:
        with V._request(f"{base}/health", timeout=5) as response:  # noqa: SLF001
            assert response.status == 200
    finally:
        V.TRUSTED.pop(base)


# ---------------------------------------------------------------- named keys, limits, request log (issue 28)

def test_keys_are_named_by_their_file_or_given_a_name_and_limits(tmp_path, keys):
    plan = plan_of(*lab(keys))
    assert [(c.name, c.requests_per_minute, c.concurrent) for c in plan.named_clients()] == [("a", None, None),
                                                                                              ("b", None, None)]
    given = [{"file": keys["a"], "name": "team-a", "requests_per_minute": 60, "concurrent": 2}, keys["b"]]
    plan = plan_of(*lab(keys, gateway={"qwen27b_gateway_key_files": given}))
    assert [(c.name, c.key_file, c.requests_per_minute, c.concurrent) for c in plan.clients] == [
        ("team-a", keys["a"], 60, 2), ("b", keys["b"], None, None)]
    assert plan.key_files == (keys["a"], keys["b"])
    assert any("client keys: team-a (60 requests/min, 2 at once), b (no limit)" in line for line in plan.describe())


def test_fair_share_is_on_for_two_keys_unless_turned_off_and_bodies_are_logged_only_when_asked(keys):
    plan = plan_of(*lab(keys))
    assert plan.fair_share and not plan.log_bodies
    assert any("fair share: a key may hold at most the pool's slots less one" in line for line in plan.describe())
    assert any("no prompt or answer text: qwen27b_gateway_log_bodies keeps them" in line for line in plan.describe())
    one_key = plan_of(*lab(keys, gateway={"qwen27b_gateway_key_files": [keys["a"]]}))
    assert not one_key.fair_share and any("fair share: off (one client key)" in line for line in one_key.describe())
    off = plan_of(*lab(keys, gateway={"qwen27b_gateway_fair_share": False, "qwen27b_gateway_log_bodies": True}))
    assert not off.fair_share and off.log_bodies
    assert any("fair share: off (qwen27b_gateway_fair_share: false)" in line for line in off.describe())
    # who reads the bodies and how long (issue 51): one line, only when they are logged
    assert [line for line in off.describe() if "_log_bodies: each request's body" in line] == [
        "  WARNING: qwen27b_gateway_log_bodies: each request's body and the start of its answer, on a line of their "
        "own (tag qwen27b_gateway_bodies), are readable by root and the groups systemd-journal and adm (the journal's "
        "readers; adm by the journal's ACL on Debian and Ubuntu) for as long as journald keeps the journal (no time "
        "limit by default: until it fills SystemMaxUse, 10% of its filesystem up to 4 GiB; journald.conf "
        "MaxRetentionSec= bounds it), and where rsyslog runs, by group adm in /var/log/syslog until logrotate drops "
        "it (a week to a month by the OS's default)"]
    assert not [line for line in plan.describe() if "systemd-journal" in line]
    with pytest.raises(BadHostData, match="qwen27b_gateway_log_bodies"):
        plan_of(*lab(keys, gateway={"qwen27b_gateway_log_bodies": "yes"}))


CLIENT_REFUSALS = [  # (an entry of qwen27b_gateway_key_files, text)
    ({"file": "A", "name": "a b"}, "is not 1-64 letters"),
    ({"file": "A", "requests_per_minute": 0}, "requests_per_minute 0 is out of range"),
    ({"file": "A", "concurrent": "2"}, "concurrent is '2', not a int"),
    ({"file": "A", "concurent": 2}, "did you mean 'concurrent'?"),
    ({"name": "x"}, "is neither a file path nor"),
    ({"file": "A", "name": "b"}, "are both named 'b'"),
]


@pytest.mark.parametrize("entry, text", CLIENT_REFUSALS, ids=[r[1][:24] for r in CLIENT_REFUSALS])
def test_bad_key_entries_are_refused_naming_the_fix(keys, entry, text):
    entry = {k: keys["a"] if v == "A" else v for k, v in entry.items()}
    hosts, groups = lab(keys, gateway={"qwen27b_gateway_key_files": [entry, keys["b"]]})
    with pytest.raises(BadHostData) as error:
        validate_inventory(hosts, groups)
    assert error.value.key == "qwen27b_gateway_key_files" and text in str(error.value), str(error.value)
    assert "Fix:" in str(error.value)


@pytest.fixture
def limited(tmp_path, keys):
    """nginx on loopback in front of one stub backend: key a named `team-a`, 2 requests a minute; key
    b named `team-b`, 1 at once; the request log in a file."""
    from qwen27b.plan.gateway import Client

    backend = stub("a")
    port = P_free_port()
    clients = (Client("team-a", keys["a"], requests_per_minute=2), Client("team-b", keys["b"], concurrent=1))
    plan = GatewayPlan("gw", "127.0.0.1", port, (keys["a"], keys["b"]),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=clients)
    log = tmp_path / "requests.log"
    try:
        with running_nginx(plan, tmp_path / "root", nginx_binary(), access_log=f"{log} qwen27b") as where:
            yield {"base": where["base"], "stub": backend, "log": log, "usage": where["usage"]}
    finally:
        backend.shutdown()


def post(lb, key: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(f"{lb['base']}/v1/chat/completions", json=body or {}, timeout=30,
                      headers={"Authorization": f"Bearer {key}"})


def test_a_key_over_its_requests_per_minute_gets_429_with_retry_after_and_the_other_key_does_not(limited):
    assert [post(limited, "client-a-4567").status_code for _ in range(2)] == [200, 200]
    over = post(limited, "client-a-4567")
    assert over.status_code == 429 and over.headers["Retry-After"] == "30"  # 2 a minute: one every 30 s
    error = over.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    assert error["message"] == "key team-a is over its 2 requests per minute; retry after 30 s"  # no raw nginx variables
    assert [post(limited, "client-b-89").status_code for _ in range(3)] == [200, 200, 200]  # team-b: no rate limit


def test_a_key_over_its_concurrent_requests_gets_429_while_its_first_runs(limited):
    limited["stub"].delay = 2.0
    first = threading.Thread(target=lambda: limited.setdefault("first", post(limited, "client-b-89")))
    first.start()
    deadline = time.monotonic() + 5
    while not limited["stub"].seen and time.monotonic() < deadline:  # the first is on the backend
        time.sleep(0.05)
    second = post(limited, "client-b-89")
    first.join()
    assert limited["first"].status_code == 200
    assert second.status_code == 429 and second.headers["Retry-After"] == "1"
    assert second.json()["error"]["message"] == "key team-b is over its 1 request at once; retry after 1 s"


def test_the_request_log_has_one_json_line_per_request_with_the_keys_name_and_no_key_or_body(limited):
    marker = "PROMPT-TEXT-THAT-MUST-NOT-BE-LOGGED"
    answers = [post(limited, "client-a-4567", {"messages": [{"content": marker}]}) for _ in range(3)]
    answers.append(post(limited, "unknown-key-0"))
    assert [a.status_code for a in answers] == [200, 200, 429, 401]
    deadline = time.monotonic() + 5
    while limited["log"].read_text().count("/v1/chat/completions") < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    text = limited["log"].read_text()
    lines = [r for r in map(json.loads, text.splitlines()) if r["path"] != "/health"]  # the fixture's readiness probes
    assert [(r["key"], r["status"], r["limit_requests"]) for r in lines] == [
        ("team-a", 200, "PASSED"), ("team-a", 200, "PASSED"), ("team-a", 429, "REJECTED"), ("", 401, "")]
    assert lines[0]["path"] == "/v1/chat/completions" and lines[0]["backend"].startswith("127.0.0.1:")
    assert lines[0]["request_time"] >= 0 and lines[0]["method"] == "POST"
    assert not [secret for secret in ("client-a-4567", "unknown-key-0", "backend-key-0123", marker) if secret in text]


def test_a_request_refused_for_concurrency_still_counts_toward_the_minute(tmp_path, keys):
    """nginx checks limit_req before limit_conn: a request over the concurrency limit has taken one of
    its key's requests of the minute (the e2e test's count of team-b's requests rests on this)."""
    from qwen27b.plan.gateway import Client

    backend = stub("a")
    port = P_free_port()
    plan = GatewayPlan("gw", "127.0.0.1", port, (keys["a"],),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=(Client("team-a", keys["a"], 3, 1),))
    with running_nginx(plan, tmp_path / "root", nginx_binary()) as lb:
        backend.delay = 1.5
        first = threading.Thread(target=lambda: lb.setdefault("first", post(lb, "client-a-4567")))
        first.start()
        while not backend.seen:
            time.sleep(0.05)
        second = post(lb, "client-a-4567")
        first.join()
        backend.delay = 0.0
        third, fourth = post(lb, "client-a-4567"), post(lb, "client-a-4567")
        assert [lb["first"].status_code, second.status_code, third.status_code, fourth.status_code] == [200, 429, 200, 429]
        assert second.json()["error"]["message"] == "key team-a is over its 1 request at once; retry after 1 s"
        assert fourth.json()["error"]["message"] == "key team-a is over its 3 requests per minute; retry after 20 s"
        # Retry-After says which: 1 s over the concurrency, the rate's spacing (60/3) over the rate
        assert (second.headers["Retry-After"], fourth.headers["Retry-After"]) == ("1", "20")
    backend.shutdown()


def test_usage_per_key_is_counted_from_each_response_and_exported_by_name(tmp_path, keys):
    """nginx's Lua module on a real nginx: each key's requests and tokens, read from the responses
    themselves (a completion's usage, a stream's final usage chunk, a usage behind 40 kB of text); a
    stream without include_usage counts as a request without tokens; an unknown key is not counted.
    The request log carries each request's tokens; the counters, by key name (never the key), are
    Prometheus text on the loopback listener."""
    from qwen27b.plan.gateway import Client

    backend = stub("a")
    clients = (Client("team-a", keys["a"]), Client("team-b", keys["b"]))
    plan = GatewayPlan("gw", "127.0.0.1", P_free_port(), (keys["a"], keys["b"]),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=clients)
    log = tmp_path / "requests.log"
    with running_nginx(plan, tmp_path / "root", nginx_binary(), access_log=f"{log} qwen27b") as lb:
        sent = [post(lb, "client-a-4567"), post(lb, "client-a-4567", {"big": True}),
                post(lb, "client-a-4567", {"stream": True, "stream_options": {"include_usage": True}}),
                post(lb, "client-b-89", {"stream": True}), post(lb, "unknown-key-0")]
        assert [r.status_code for r in sent] == [200, 200, 200, 200, 401]
        assert sent[2].text.count("data: ") == 5 and '"completion_tokens": 3' in sent[2].text  # the stream passed whole
        metrics = httpx.get(lb["usage"], timeout=5).text
    counted = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines() if line.startswith("qwen27b_")}
    assert counted.pop('qwen27b_gateway_tokens_today{key="team-a"}') == 7 + 5 + 7 + 5 + 9 + 3
    assert {k: v for k, v in counted.items() if "seconds" not in k} == {
        'qwen27b_gateway_requests_total{key="team-a"}': 3, 'qwen27b_gateway_requests_total{key="team-b"}': 1,
        'qwen27b_gateway_prompt_tokens_total{key="team-a"}': 7 + 7 + 9,
        'qwen27b_gateway_completion_tokens_total{key="team-a"}': 5 + 5 + 3}
    assert counted['qwen27b_gateway_request_seconds_total{key="team-a"}'] >= 0
    assert "# TYPE qwen27b_gateway_requests_total counter" in metrics
    assert not [k for k in ("client-a-4567", "client-b-89", "backend-key-0123") if k in metrics]
    lines = [r for r in map(json.loads, log.read_text().splitlines()) if r["path"] != "/health"]
    assert [(r["key"], r["prompt_tokens"], r["completion_tokens"]) for r in lines] == [
        ("team-a", "7", "5"), ("team-a", "7", "5"), ("team-a", "9", "3"), ("team-b", "", ""), ("", "", "")]
    backend.shutdown()


def test_a_streams_tokens_count_when_its_client_closes_right_after_done(tmp_path, keys):
    """The openai client may close its connection as soon as it has read a stream's [DONE], before
    nginx has the response's last buffer: the request then ends without the body filter's end of
    stream. The usage chunk had passed, so its tokens count (a real nginx; the stub sends its last
    byte a second after [DONE])."""
    backend = stub("a")
    plan = two_keys_on_one_stub(keys, backend)
    with running_nginx(plan, tmp_path / "root", nginx_binary()) as lb:
        body = {"stream": True, "stream_options": {"include_usage": True}, "linger": True}
        with httpx.stream("POST", f"{lb['base']}/v1/chat/completions", json=body, timeout=30,
                          headers={"Authorization": "Bearer client-a-4567"}) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if line == "data: [DONE]":
                    break  # and close, as a client done with the stream does
        assert '"completion_tokens": 3' in "".join(lines)
        deadline, metrics = time.monotonic() + 10, ""
        while 'qwen27b_gateway_completion_tokens_total{key="team-a"}' not in metrics and time.monotonic() < deadline:
            time.sleep(0.2)
            metrics = httpx.get(lb["usage"], timeout=5).text
    backend.shutdown()
    assert 'qwen27b_gateway_prompt_tokens_total{key="team-a"} 9' in metrics, metrics
    assert 'qwen27b_gateway_completion_tokens_total{key="team-a"} 3' in metrics, metrics


def test_a_429_is_counted_as_limited_for_its_key(limited):
    for _ in range(3):
        post(limited, "client-a-4567")
    metrics = httpx.get(limited["usage"], timeout=5).text
    assert 'qwen27b_gateway_limited_total{key="team-a"} 1' in metrics
    assert 'qwen27b_gateway_errors_total{key="team-a"} 1' in metrics
    assert 'qwen27b_gateway_requests_total{key="team-a"} 3' in metrics


def test_usage_over_a_window_is_summed_per_key_from_the_request_log_lines():
    """`qwen27b-gateway-pool usage` (what `qwen27b gateway usage` runs on each gateway) over lines of
    the request log: refused and keyless lines left out, tokens summed, 429s counted; the window is
    allow-listed before it reaches journalctl's argv."""
    from qwen27b.tools.gateway import usage_table

    lines = ['{"key":"team-a","status":200,"request_time":0.5,"prompt_tokens":"7","completion_tokens":"5"}',
             '{"key":"team-a","status":429,"request_time":0.0,"prompt_tokens":"","completion_tokens":""}',
             '{"key":"team-b","status":200,"request_time":1.25,"prompt_tokens":"","completion_tokens":""}',
             '{"key":"","status":401,"request_time":0.0}', "not json", '["a", "list"]']
    usage = P.usage_of(lines)
    assert usage == {"team-a": {"requests": 2, "errors": 1, "limited": 1, "prompt_tokens": 7, "completion_tokens": 5,
                                "seconds": 0.5},
                     "team-b": {"requests": 1, "errors": 0, "limited": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                "seconds": 1.25}}
    text = usage_table("gw", {"since": "1h", "keys": usage})
    assert text.splitlines()[0] == "gw: usage per key, last 1h (the request log)"
    assert text.splitlines()[3].split() == ["team-a", "2", "1", "1", "7", "5", "0.25"]
    for bad in ("1 hour", "-1h", "1h;id", "0h", "$(id)"):
        with pytest.raises(SystemExit, match="give N followed by"):
            P.usage(bad)


def test_the_usage_counting_runs_where_memory_cannot_be_made_executable(tmp_path, keys):
    """The gateway's unit has MemoryDenyWriteExecute=yes; LuaJIT's compiler needs W+X memory and its
    worker dies when refused ("runtime code generation failed"), after enough requests to make code
    hot. The rendered config turns the JIT off: under the kernel's own MDWE (prctl, what systemd's
    setting amounts to) a few hundred requests are all answered and counted."""
    from tests.support import mdwe_exec

    if not mdwe_exec.supported():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+)")
    backend = stub("a")
    plan = GatewayPlan("gw", "127.0.0.1", P_free_port(), (keys["a"],),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600)
    wrapper = [sys.executable, mdwe_exec.__file__, nginx_binary()]
    with running_nginx(plan, tmp_path / "root", wrapper) as lb:
        with httpx.Client(timeout=10, headers={"Authorization": "Bearer client-a-4567"}) as c:
            codes = [c.post(f"{lb['base']}/v1/chat/completions", json={}).status_code for _ in range(300)]
        metrics = httpx.get(lb["usage"], timeout=5).text
    backend.shutdown()
    assert codes == [200] * 300, (codes.count(200), (tmp_path / "root" / "nginx.log").read_text()[-2000:])
    assert 'qwen27b_gateway_requests_total{key="a"} 300' in metrics
    assert "runtime code generation failed" not in (tmp_path / "root" / "nginx.log").read_text()


def test_where_the_os_has_no_nginx_lua_module_the_config_has_no_lua_and_still_passes_nginx_t(tmp_path):
    """Ubuntu 22.04's archive has no libnginx-mod-http-lua (stack tools.nginx_lua, with its source;
    tests/unit/test_gateway_os.py reads the archive's own package lists):
    the gateway there serves, limits and logs without token counts; its config names no Lua at all."""
    from qwen27b.plan.stack import load_stack

    lua = load_stack()["tools"]["nginx_lua"]
    assert [G.usage_available(lua, *os) for os in (("debian", "12"), ("ubuntu", "20.04"), ("ubuntu", "22.04"),
                                                    ("ubuntu", "24.04"), (None, None))] == [True, True, False, True, False]
    plan = dataclasses.replace(reference_plan(), address="127.0.0.1", port=P_free_port())
    text = G.render_gateway(plan, usage=False)[G.layout()["config"]]
    assert "lua" not in text.lower() and "load_module" not in text and '"prompt_tokens":"$qwen27b_prompt_tokens"' in text
    result = config_test(plan, tmp_path, nginx_binary(), ["gpu-1"], usage=False)
    assert result.returncode == 0, result.stderr


def test_a_key_over_its_tokens_of_the_day_gets_429_until_midnight_and_the_other_key_does_not(tmp_path, keys):
    """tokens_per_day, on a real nginx with the Lua module: each completion's usage (7 + 5 tokens)
    adds to the key's day; once over its 20, the key gets OpenAI's 429 with Retry-After (the seconds
    to midnight UTC), nothing reaches a backend, and the other key goes on. The day's tokens are a
    gauge by key name."""
    from qwen27b.plan.gateway import Client

    backend = stub("a")
    plan = GatewayPlan("gw", "127.0.0.1", P_free_port(), (keys["a"], keys["b"]),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=(Client("team-a", keys["a"], tokens_per_day=20),
                                                            Client("team-b", keys["b"])))
    log = tmp_path / "requests.log"
    with running_nginx(plan, tmp_path / "root", nginx_binary(), access_log=f"{log} qwen27b") as lb:
        first, second = post(lb, "client-a-4567"), post(lb, "client-a-4567")  # 12 tokens, then 24: over 20
        reached = len(backend.seen)
        over = post(lb, "client-a-4567")
        assert (first.status_code, second.status_code, over.status_code) == (200, 200, 429)
        assert len(backend.seen) == reached  # refused at the gateway
        error = over.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "key team-a is over its tokens per day (24 of 20 used)" in error["message"]
        wait = int(over.headers["Retry-After"])
        assert 0 < wait <= 86400 and abs(wait - (86400 - int(time.time()) % 86400)) <= 2
        assert post(lb, "client-b-89").status_code == 200
        metrics = httpx.get(lb["usage"], timeout=5).text
    backend.shutdown()
    assert 'qwen27b_gateway_tokens_today{key="team-a"} 24' in metrics and 'qwen27b_gateway_tokens_today{key="team-b"} 12' in metrics
    assert 'qwen27b_gateway_tokens_per_day{key="team-a"} 20' in metrics and 'tokens_per_day{key="team-b"}' not in metrics
    from prometheus_client.parser import text_string_to_metric_families  # the alert rules' recorded names: current
    recorded = (TESTS / "fixtures" / "gateway" / "usage-metrics.txt").read_text()
    assert {f.name for f in text_string_to_metric_families(metrics)} == \
        {f.name for f in text_string_to_metric_families(recorded)}
    assert 'qwen27b_gateway_limited_total{key="team-a"} 1' in metrics
    lines = [r for r in map(json.loads, log.read_text().splitlines()) if r["path"] != "/health"]  # the log says which limit
    assert [(r["key"], r["status"], r["limit_tokens"]) for r in lines] == [
        ("team-a", 200, "PASSED"), ("team-a", 200, "PASSED"), ("team-a", 429, "REJECTED"), ("team-b", 200, "")]


def _budgeted(keys, backend, tokens_per_day: int) -> GatewayPlan:
    from qwen27b.plan.gateway import Client

    return GatewayPlan("gw", "127.0.0.1", P_free_port(), (keys["a"], keys["b"]),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=(Client("team-a", keys["a"], tokens_per_day=tokens_per_day),
                                                            Client("team-b", keys["b"])))


def _today(lb, name: str = "team-a") -> float | None:
    for line in httpx.get(lb["usage"], timeout=5).text.splitlines():
        if line.startswith(f'qwen27b_gateway_tokens_today{{key="{name}"}}'):
            return float(line.split(" ")[1])
    return None


def test_requests_in_flight_at_once_cannot_all_pass_on_one_budget(tmp_path, keys):
    """Issue 51: the day's check read only what finished; requests sent at once all passed it. A
    request let through reserves its most (prompt bytes / 4 + max_tokens) at once, settled to its
    usage at the end: a second request while the first holds the budget gets 429, and once the first
    settles (12 tokens) the budget has room again."""
    backend = stub("a")
    with running_nginx(_budgeted(keys, backend, 40), tmp_path / "root", nginx_binary()) as lb:
        backend.delay = 1.5
        body = {"max_tokens": 32, "messages": []}  # httpx sends 31 bytes: 8 + 32 = 40 reserved, the whole budget
        first = threading.Thread(target=lambda: lb.setdefault("first", post(lb, "client-a-4567", body)))
        first.start()
        while not backend.seen:
            time.sleep(0.05)
        second = post(lb, "client-a-4567", body)
        first.join()
        backend.delay = 0.0
        assert (lb["first"].status_code, second.status_code) == (200, 429)
        assert "over its tokens per day (40 of 40 used)" in second.json()["error"]["message"]
        assert _today(lb) == 12  # settled: the first's usage, the reservation gone
        assert post(lb, "client-a-4567", body).status_code == 200 and _today(lb) == 24
    backend.shutdown()


def test_an_answer_without_usage_keeps_its_reservation_and_both_usage_shapes_count(tmp_path, keys):
    """A stream whose answer reports no usage (no include_usage, and a backend not forcing it) used to
    count nothing against the budget: its reservation stays (prompt bytes / 4 + the default 1024).
    /v1/responses' and /v1/messages' usage (input_tokens/output_tokens) counts like chat's."""
    backend = stub("a")
    with running_nginx(_budgeted(keys, backend, 100000), tmp_path / "root", nginx_binary()) as lb:
        assert post(lb, "client-a-4567", {"shape": "responses"}).status_code == 200
        assert _today(lb) == 11 + 4
        streamed = post(lb, "client-a-4567", {"stream": True})
        assert streamed.status_code == 200 and '"usage"' not in streamed.text
        assert _today(lb) == 15 + 4 + 1024  # {"stream":true}: 15 bytes, 4 tokens, and the default 1024
    backend.shutdown()


def test_the_counters_and_the_days_budget_survive_a_restart_of_nginx(tmp_path, keys):
    """Issue 56: the counters lived in nginx's shared memory only, so a restart handed every key a
    fresh budget. They are written to the state dir every few seconds and when nginx stops, and
    loaded at start: after a stop and a start the key over its budget is still refused."""
    backend = stub("a")
    plan = _budgeted(keys, backend, 20)
    with running_nginx(plan, tmp_path / "root", nginx_binary()) as lb:
        assert [post(lb, "client-a-4567").status_code for _ in range(3)] == [200, 200, 429]
        assert post(lb, "client-b-89").status_code == 200
    saved = (tmp_path / "root" / G.layout()["usage_state"].lstrip("/")).read_text()
    assert "day\t" in saved and "requests\tteam-a" in saved
    with running_nginx(plan, tmp_path / "root", nginx_binary()) as lb:
        over = post(lb, "client-a-4567")
        assert over.status_code == 429 and "(24 of 20 used)" in over.json()["error"]["message"]
        metrics = httpx.get(lb["usage"], timeout=5).text
    backend.shutdown()
    assert 'qwen27b_gateway_requests_total{key="team-a"} 4' in metrics
    assert 'qwen27b_gateway_tokens_today{key="team-b"} 12' in metrics


def two_keys_on_one_stub(keys, backend, **plan) -> GatewayPlan:
    from qwen27b.plan.gateway import Client

    return GatewayPlan("gw", "127.0.0.1", P_free_port(), (keys["a"], keys["b"]),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=(Client("team-a", keys["a"]), Client("team-b", keys["b"])),
                       **plan)


def test_with_fair_share_no_key_holds_every_slot_of_the_pool_and_another_key_gets_one(tmp_path, keys):
    """Fair share on a real nginx: the backend's health answer says 2 slots, so the watcher's first
    round gives each key 1 at once. While team-a's first request runs, its second is refused (429,
    Retry-After 1; the answer and the request log name the fair share) and team-b's goes through."""
    backend = stub("a")
    backend.slots = 2
    log = tmp_path / "requests.log"
    plan = two_keys_on_one_stub(keys, backend, fair_share=True)
    with running_nginx(plan, tmp_path / "root", nginx_binary(), access_log=f"{log} qwen27b") as lb:
        assert Path(lb["fair_file"]).read_text().splitlines()[1:] == ["set $qwen27b_fair_share 1;",
                                                                       "limit_conn qwen27b_fair 1;"]
        backend.delay = 1.5
        first = threading.Thread(target=lambda: lb.setdefault("first", post(lb, "client-a-4567")))
        first.start()
        deadline = time.monotonic() + 5
        while not backend.seen and time.monotonic() < deadline:  # the first is on the backend
            time.sleep(0.05)
        second, other = post(lb, "client-a-4567"), post(lb, "client-b-89")
        first.join()
    backend.shutdown()
    assert (lb["first"].status_code, second.status_code, other.status_code) == (200, 429, 200)
    assert second.headers["Retry-After"] == "1" and second.json()["error"]["message"] == (
        "key team-a is over its fair share of the pool's slots (1 at once); retry after 1 s")
    lines = [r for r in map(json.loads, log.read_text().splitlines()) if r["path"] != "/health"]
    assert sorted((r["key"], r["status"], r["limit_concurrent"], r["fair_share"]) for r in lines) == [
        ("team-a", 200, "PASSED", "1"), ("team-a", 429, "REJECTED", "1"), ("team-b", 200, "PASSED", "1")]


def test_with_log_bodies_the_request_log_keeps_each_prompt_and_the_start_of_its_answer(tmp_path, keys):
    """qwen27b_gateway_log_bodies on a real nginx: the request's body and the answer's (nginx's Lua
    module keeps its first 64 KiB) are in the request log line, JSON-escaped; the keys never are."""
    backend = stub("a")
    log = tmp_path / "requests.log"
    marker = 'PROMPT "quoted" \\ and 中文'
    with running_nginx(two_keys_on_one_stub(keys, backend, log_bodies=True), tmp_path / "root", nginx_binary(),
                       access_log=f"{log} qwen27b") as lb:
        assert post(lb, "client-a-4567", {"messages": [{"content": marker}]}).status_code == 200
        answer = post(lb, "client-b-89", {"big": True})  # 40 kB: under the 64 KiB kept
        assert answer.status_code == 200
    backend.shutdown()
    text = log.read_text()
    records = list(map(json.loads, text.splitlines()))
    requests = {r["request_id"]: r for r in records if "path" in r and r["path"] != "/health"}
    # a line of their own, joined by request_id (/health's have one too, empty)
    first, big = [r for r in records if "request_body" in r and r["request_id"] in requests]
    assert [requests[r["request_id"]]["key"] for r in (first, big)] == ["team-a", "team-b"]
    assert not [r for r in requests.values() if "request_body" in r]
    assert json.loads(first["request_body"]) == {"messages": [{"content": marker}]}
    assert json.loads(first["response_body"])["usage"]["prompt_tokens"] == 7
    assert requests[first["request_id"]]["prompt_tokens"] == "7"
    assert big["response_body"] == answer.text and requests[big["request_id"]]["completion_tokens"] == "5"
    assert not [k for k in ("client-a-4567", "client-b-89", "backend-key-0123") if k in text]


def test_a_request_log_line_past_a_syslog_datagram_is_still_counted(tmp_path, keys):
    """Issue 51 item 6, on a real nginx logging to a real Unix datagram socket as it does to the
    journal: with qwen27b_gateway_log_bodies, a prompt of 60,000 quotes made one request-log line of
    over 240 kB (each quote JSON-escaped twice), past the largest datagram the kernel takes from
    nginx's socket (its 208 KiB buffer): the line was lost and `qwen27b usage` missed the request.
    The bodies now go on a line of their own (tag qwen27b_gateway_bodies, joined by request_id); the
    request's line carries no body, always fits, and is counted; the bodies line, each body cut by
    the Lua module to 96 KiB once escaped, fits and is kept too."""
    backend = stub("a")
    devlog = DevLog()
    plan = two_keys_on_one_stub(keys, backend, log_bodies=True)
    try:
        with running_nginx(plan, tmp_path / "root", nginx_binary(),
                           access_log=f"syslog:server=unix:{devlog.path},nohostname,tag=qwen27b_gateway qwen27b") as lb:
            long = json.dumps({"messages": [{"content": '"' * 60000}]}).encode()  # 120 kB, 240 kB escaped again
            assert httpx.post(f"{lb['base']}/v1/chat/completions", content=long, timeout=30, headers={
                "Authorization": "Bearer client-a-4567", "Content-Type": "application/json"}).status_code == 200
            assert post(lb, "client-b-89", {"messages": [{"content": "short"}]}).status_code == 200
            time.sleep(0.5)
            counted = [line for line in devlog.lines("qwen27b_gateway") if '"path":"/health"' not in line]
            bodies = devlog.lines("qwen27b_gateway_bodies")
    finally:
        backend.shutdown()
        devlog.close()
    usage = P.usage_of(counted)
    assert usage["team-a"]["requests"] == 1 and usage["team-a"]["prompt_tokens"] == 7, usage  # the long one
    assert usage["team-b"]["requests"] == 1 and usage["team-b"]["completion_tokens"] == 5, usage
    assert all(len(line) < 4096 for line in counted)  # no body on the counted line
    short = [json.loads(line) for line in bodies if "short" in line]
    assert len(short) == 1 and json.loads(short[0]["request_body"])["messages"][0]["content"] == "short"
    assert short[0]["request_id"] == json.loads(counted[-1])["request_id"]  # joined to its request
    assert "key" not in short[0]  # never counted as a request
    # the long prompt's bodies line is kept too, its body cut (whole characters) to 96 KiB once escaped
    cut = [json.loads(line)["request_body"] for line in bodies if '\\\\\\"' in line]
    assert len(cut) == 1 and long.decode().startswith(cut[0]) and 40000 < len(cut[0]) < 60000, [len(c) for c in cut]


def test_qwen27b_usage_prints_each_gateways_table_or_json(monkeypatch, capsys):
    """`qwen27b usage INVENTORY --since 2h [--json]`: what each gateway's `usage` answered (stood in
    here: the SSH path is drain's, tested in the e2e tier), as a table per gateway or JSON lines."""
    from qwen27b.controller import gateway_drain as D
    from qwen27b.tools import cli

    asked = []
    record = {"since": "2h", "keys": {"team-a": {"requests": 4, "errors": 1, "limited": 1, "prompt_tokens": 30,
                                                 "completion_tokens": 12, "seconds": 2.0}}}
    monkeypatch.setattr(D, "usage", lambda inventory, since: asked.append((inventory, since))
                        or [D.PoolAnswer("gw", True, record)])
    assert cli.main(["usage", "lab.py", "--since", "2h"]) == 0
    out = capsys.readouterr().out
    assert asked == [("lab.py", "2h")] and "gw: usage per key, last 2h (the request log)" in out
    assert out.splitlines()[3].split() == ["team-a", "4", "1", "1", "30", "12", "0.50"]
    assert cli.main(["usage", "lab.py", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["gateway"] == "gw" and line["keys"]["team-a"]["completion_tokens"] == 12 and asked[-1] == ("lab.py", "1d")


def test_the_gateways_verify_uses_its_own_key_never_a_clients(tmp_path, keys, monkeypatch):
    """Issue 48 item 7: the deploy's verify of the gateway (roles/gateway._check, run as it is against
    a real nginx on loopback) sends the gateway's own verify key: its requests count as qwen27b-verify
    in the request log, none as the first client's, and that client's 1 request a minute is still
    hers to use after it. The verify key is in the keys include under its own name, never a limit's."""
    from types import SimpleNamespace

    import roles.gateway as R
    from qwen27b.controller import apikey
    from qwen27b.plan.gateway import VERIFY, Client

    backend = stub("a")
    port = P_free_port()
    verify_file, made = apikey.ensure_gateway_verify(tmp_path / "state" / "gateway" / "gw")
    assert made and oct(verify_file.stat().st_mode & 0o777) == "0o600"
    assert apikey.ensure_gateway_verify(tmp_path / "state" / "gateway" / "gw") == (verify_file, False)  # kept
    clients = (Client("team-a", keys["a"], requests_per_minute=1), Client("team-b", keys["b"]))
    plan = GatewayPlan("gw", "127.0.0.1", port, (keys["a"], keys["b"]),
                       (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                       keys["backend"], None, 600, clients=clients, verify_key_file=str(verify_file))
    assert any(f"counted as {VERIFY}" in line for line in plan.describe())
    assert f'"{VERIFY}"' in G.keys_text(plan) and VERIFY not in "".join(sum(G.limit_lines(plan).values(), []))
    results = SimpleNamespace(results=[])
    monkeypatch.setattr(R, "host", SimpleNamespace(name="gw"))
    monkeypatch.setattr(R.runstate, "current", lambda: results)
    log = tmp_path / "requests.log"
    try:
        with running_nginx(plan, tmp_path / "root", nginx_binary(), access_log=f"{log} qwen27b") as where:
            R._check.__wrapped__(plan)
            assert results.results[0].status == "ok", results.results[0]
            assert httpx.post(f"{where['base']}/v1/chat/completions", json={}, timeout=30,
                              headers={"Authorization": "Bearer client-a-4567"}).status_code == 200
    finally:
        backend.shutdown()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    keyed = [(r["key"], r["path"]) for r in lines if r["path"] != "/health"]
    assert ("", "/v1/models") in keyed  # verify's keyless request, refused
    assert [k for k, path in keyed if k] == [VERIFY, VERIFY, "team-a"], keyed
    text = log.read_text()
    assert load_secret(str(verify_file)) not in text


def test_a_client_key_named_as_the_verify_key_is_refused(keys):
    hosts, groups = lab(keys, gateway={"qwen27b_gateway_key_files": [{"file": keys["a"], "name": "qwen27b-verify"}]})
    with pytest.raises(BadHostData, match="the deploy's own verify requests count under"):
        validate_inventory(hosts, groups)


@pytest.mark.parametrize("given, sent", [("10m", "10min"), ("30min", "30min"), ("2h", "2h"), ("45s", "45s"), ("7d", "7d")])
def test_qwen27b_usage_takes_m_for_minutes_and_sends_what_journalctl_and_older_gateways_read(monkeypatch, given, sent):
    """Issue 48 item 8: `--since 10m` was refused by the gateway after connecting; now accepted here,
    and sent spelt out (10min) so a gateway's older on-host code reads it too."""
    from qwen27b.controller import gateway_drain as D
    from qwen27b.tools import cli

    asked = []
    monkeypatch.setattr(D, "usage", lambda inventory, since: asked.append(since) or [D.PoolAnswer("gw", True, {"keys": {}})])
    assert cli.main(["usage", "lab.py", "--since", given]) == 0 and asked == [sent]
    from qwen27b.tools.gateway import parse_window

    assert parse_window(given) == sent


@pytest.mark.parametrize("given", ["10", "10x", "0m", "1mo", "-1h", "1h;id", ""])
def test_a_bad_usage_window_is_refused_before_any_gateway_is_reached(monkeypatch, capsys, given):
    from qwen27b.controller import gateway_drain as D
    from qwen27b.tools import cli

    monkeypatch.setattr(D, "usage", lambda *a: pytest.fail("a gateway was reached"))
    with pytest.raises(SystemExit) as done:
        cli.main(["usage", "lab.py", f"--since={given}"])
    assert done.value.code == 2 and "give N followed by s, m (or min), h or d" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="give N followed by"):
        P.usage(given)  # the on-host module refuses it too, before journalctl


def test_the_plan_names_the_client_routes_and_warns_for_an_open_scraper_list():
    lines = reference_plan().describe()
    assert any(line.startswith("  client routes: /v1/models, /v1/chat/completions") and "10.0.0.5/32" in line for line in lines)
    assert not any("WARNING: qwen27b_gateway_metrics_allow" in line for line in lines)
    wide = dataclasses.replace(reference_plan(), metrics_allow=("0.0.0.0/0",)).describe()
    assert any("WARNING: qwen27b_gateway_metrics_allow lists 0.0.0.0/0" in line for line in wide)
