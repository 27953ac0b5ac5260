"""The gateway's inventory and backends for its tests: a lab of a gateway and two backends with their key
files (`keys`, `lab`, `plan_of`), the nginx to run, and backend stand-ins on loopback (`stub`)."""

import json
import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from qwen27b.plan.gateway import GatewayPlan, plan_gateways
from qwen27b.plan.inventory import validate_inventory
from setupcheck import skip_or_fail_setup


GW, B1, B2 = "10.0.0.9", "10.0.0.21", "10.0.0.22"


def key_file(tmp_path: Path, name: str, text: str, mode: int = 0o600) -> str:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture
def keys(tmp_path):
    return {"backend": key_file(tmp_path, "backend.key", "backend-key-0123"),
            "a": key_file(tmp_path, "a.key", "client-a-4567"), "b": key_file(tmp_path, "b.key", "OPENAI_API_KEY=client-b-89")}


def lab(keys, gateway: dict | None = None, b1: dict | None = None, b2: dict | None = None):
    """(hosts, groups): gw in the gateway group, gpu-1 and gpu-2 its backends."""
    backend = {"qwen27b_api_key_file": keys["backend"], "qwen27b_metrics_allow": [f"{GW}/32"]}
    hosts = [("gw", {"ssh_hostname": GW, "qwen27b_gateway_key_files": [keys["a"], keys["b"]], **(gateway or {})}),
             ("gpu-1", {"ssh_hostname": B1, **backend, **(b1 or {})}),
             ("gpu-2", {"ssh_hostname": B2, **backend, "qwen27b_port": 8001, **(b2 or {})})]
    return hosts, {"gw": {"qwen27b_gateway", "all"}, "gpu-1": {"all"}, "gpu-2": {"all"}}


def plan_of(hosts, groups) -> GatewayPlan:
    return plan_gateways(hosts, groups, validate_inventory(hosts, groups))["gw"]


def nginx_binary() -> str:
    """This machine's nginx, or QWEN27B_TEST_NGINX's (another OS's nginx behind a wrapper: docs/gateway-os.md
    runs these tests against Ubuntu 24.04's nginx and Lua module that way)."""
    found = (os.environ.get("QWEN27B_TEST_NGINX") or shutil.which("nginx")
             or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None))
    if not found:
        skip_or_fail_setup("nginx is not installed (./run tests installs nginx-light)")
    return found


USAGE_JSON = {"usage": {"prompt_tokens": 7, "total_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": None}}
USAGE_STREAM = {"usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3}}
USAGE_RESPONSES = {"usage": {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}}  # /v1/responses, /v1/messages


class Stub(BaseHTTPRequestHandler):
    """A backend stand-in: /health 200 unless `sick`, POST answers which backend it was. Each answer
    closes its connection: with keep-alive, Python's http.server was seen (1 run in ~5) dropping a
    connection nginx reused, a 502 when it was the last backend in the pool; uvicorn (vLLM) keeps
    its connections 5 s and nginx reuses them 4 s at most (the rendered keepalive_timeout)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.got.append((self.path, self.headers.get("Authorization")))
        if self.path == "/v1/models":  # as vLLM lists its one served name
            return self._answer(200, {"object": "list", "data": [{"id": "qwen-stub", "object": "model"}]})
        # as qwen27b-health-http answers: the engine's slots (--max-num-seqs) when it knows them
        self._answer(503 if self.server.sick else 200, {"slots": self.server.slots} if self.server.slots else {})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(self.headers.get("Authorization"))
        self.server.got.append((self.path, self.headers.get("Authorization")))
        time.sleep(self.server.delay)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict) and body.get("stream"):
            return self._stream(bool((body.get("stream_options") or {}).get("include_usage")), bool(body.get("linger")))
        pad = "x" * 40000 if isinstance(body, dict) and body.get("big") else ""  # usage past the Lua filter's tail
        usage = USAGE_RESPONSES if isinstance(body, dict) and body.get("shape") == "responses" else USAGE_JSON
        self._answer(200, {"backend": self.server.name, "choices": [{"message": {"content": pad}}], **usage})

    def _stream(self, include_usage: bool, linger: bool = False) -> None:
        """An OpenAI stream in three sends (nginx passes each on): chunks with usage null, then
        the usage chunk when asked for (stream_options.include_usage), then [DONE]; `linger`: the
        response's last byte a second after [DONE] (a client may be gone by then)."""
        chunks = [{"choices": [{"delta": {"content": w}}], **({"usage": None} if include_usage else {})}
                  for w in ("one", "two", "three")]
        if include_usage:
            chunks.append({"choices": [], **USAGE_STREAM})
        parts = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"] + ([b"\n"] if linger else [])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(sum(map(len, parts))))
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        for part in parts:
            if linger and part == b"\n":
                time.sleep(1.0)
            self.wfile.write(part)
            self.wfile.flush()
            time.sleep(0.02)


def stub(name: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.name, server.sick, server.seen, server.delay, server.got, server.slots = name, False, [], 0.0, [], None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
