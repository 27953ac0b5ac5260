"""Issue 51: verify and doctor talk to the host itself, never through a proxy the operator's
environment names (http_proxy / https_proxy / all_proxy): the API key and the prompts would reach it.
A real listener stands for the proxy; a real HTTP server for the host."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from qwen27b.controller import postdeploy


class _Recorder(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.got.append((self.path, self.headers.get("Authorization")))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def servers():
    made = []
    for address in ("127.0.0.2", "127.0.0.1"):  # the host, the proxy
        server = ThreadingHTTPServer((address, 0), _Recorder)
        server.got = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append(server)
    yield made
    for server in made:
        server.shutdown()


def test_verify_requests_ignore_the_environments_proxy(servers, monkeypatch):
    host, proxy = servers
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy_url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    # 127.0.0.2: an address urllib's proxy bypass does not take for local
    url = f"http://127.0.0.2:{host.server_address[1]}/v1/models"
    with postdeploy._request(url, "sk-secret-key") as response:  # noqa: SLF001
        assert response.status == 200
    assert host.got == [("/v1/models", "Bearer sk-secret-key")] and proxy.got == []


def test_doctors_curls_on_the_host_ignore_its_proxy_variables():
    from qwen27b.plan.stack import load_stack
    from qwen27b.tools.doctor import collection, gateway

    commands = [*collection.http_commands("10.0.0.5", "8000", "/etc/qwen27b/secrets.env").values(),
                *gateway.commands(load_stack(), {"qwen27b_gateway_bind_address": "10.0.0.9"}).values()]
    curls = [part for command in commands for part in command.split("curl ")[1:]]
    assert len(curls) >= 5 and all(part.startswith("--noproxy '*' ") for part in curls), curls
