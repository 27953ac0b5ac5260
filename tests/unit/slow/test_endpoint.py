"""The health endpoint (qwen27b/onhost/endpoint.py): the status file -> (HTTP code, JSON body) as a
pure function, and the one-request stdin/stdout exchange run as the socket unit runs it, a
subprocess of the shipped package with the request piped in (and with one socket as both stdin
and stdout, as systemd's Accept=yes hands it over)."""

from __future__ import annotations

import ast
import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen27b.onhost import endpoint
from qwen27b.onhost.contract import module_argv
from qwen27b.onhost.statusfile import iso, write_status
from tests.support import onhost_lib

NOW = 1_780_000_000.0
INTERVAL = 30
FIELDS = {"verdict", "code", "time", "age_s", "findings", "unit_state", "consecutive_failures", "slots"}


def status(code: int = 0, age: float = 5, **extra) -> dict:
    """A status as qwen27b-health writes it (the fields the endpoint reads, and a few it does not)."""
    verdict = ["OK", "WARNING", "CRITICAL", "UNKNOWN"][code]
    findings = [] if code == 0 else [{"level": verdict, "text": f"a {verdict} finding"},
                                     {"level": "CRITICAL", "text": "restart loop", "kind": "restart_loop"}]
    return {"time": iso(NOW - age), "url": "http://127.0.0.1:8000", "verdict": verdict, "code": code,
            "findings": findings, "unit_state": "active" if code == 2 else None,
            "consecutive_failures": 2 if code == 2 else 0, "gpu": None, "history": [], **extra}


def answer(s, problem=None, now=NOW):
    return endpoint.answer(s, problem, now, endpoint.STALE_FACTOR * INTERVAL)


# ------------------------------------------------------------------------------- pure: status -> answer

@pytest.mark.parametrize("code, http", [(0, 200), (1, 200), (2, 503), (3, 503)])
def test_fresh_verdicts_answer_200_only_when_the_service_serves(code, http):
    got, body = answer(status(code))
    assert got == http
    assert set(body) == FIELDS
    assert body["verdict"] == ["OK", "WARNING", "CRITICAL", "UNKNOWN"][code] and body["code"] == code
    assert body["time"] == iso(NOW - 5) and body["age_s"] == 5.0


def test_body_carries_findings_as_level_and_text_and_the_watchdogs_view():
    _, body = answer(status(2))
    assert body["findings"] == [{"level": "CRITICAL", "text": "a CRITICAL finding"},
                                {"level": "CRITICAL", "text": "restart loop"}]  # no internal "kind"
    assert body["unit_state"] == "active" and body["consecutive_failures"] == 2
    assert "url" not in body and "gpu" not in body and "history" not in body
    assert body["slots"] is None  # a status of an older qwen27b-health: the gateway's fair share waits
    assert answer({**status(0), "slots": 4})[1]["slots"] == 4


@pytest.mark.parametrize("age", [endpoint.STALE_FACTOR * INTERVAL + 1, 3600, -(endpoint.STALE_FACTOR * INTERVAL + 1)])
def test_a_status_older_than_three_intervals_or_from_the_future_is_stale(age):
    http, body = answer(status(0, age=age))
    assert http == 503 and body["verdict"] == "STALE" and body["code"] == 3
    assert body["time"] == iso(NOW - age) and body["age_s"] == round(age, 1)
    (finding,) = body["findings"]
    assert finding["level"] == "UNKNOWN" and "last check (OK at" in finding["text"]
    assert "qwen27b-health.timer" in finding["text"]


def test_a_status_just_inside_three_intervals_still_counts():
    assert answer(status(0, age=endpoint.STALE_FACTOR * INTERVAL))[0] == 200


@pytest.mark.parametrize("broken, why", [
    ({"code": "0"}, "no verdict"), ({"code": True}, "no verdict"), ({"code": 7}, "no verdict"),
    ({"code": [0]}, "no verdict"), ({"verdict": "CRITICAL"}, "no verdict"),  # code and verdict disagree
    ({"time": None}, "no time"), ({"time": "yesterday"}, "no time"), ({"time": 12}, "no time"),
])
def test_a_status_without_a_usable_verdict_or_time_is_unknown(broken, why):
    http, body = answer({**status(0), **broken})
    assert http == 503 and body["verdict"] == "UNKNOWN" and body["code"] == 3 and body["time"] is None
    assert why in body["findings"][0]["text"]


def test_missing_torn_and_unreadable_status_files_answer_503_saying_why(tmp_path):
    missing = tmp_path / "health.json"
    http, body = answer(*endpoint.read_status(str(missing)))
    assert http == 503 and body["verdict"] == "UNKNOWN" and f"no status file {missing} yet" in body["findings"][0]["text"]
    missing.write_text('{"time": "2026-')
    http, body = answer(*endpoint.read_status(str(missing)))
    assert http == 503 and "cannot be read as JSON" in body["findings"][0]["text"]
    missing.write_text("[1, 2]")
    assert "JSON list" in answer(*endpoint.read_status(str(missing)))[1]["findings"][0]["text"]
    directory = tmp_path / "dir.json"
    directory.mkdir()
    http, body = answer(*endpoint.read_status(str(directory)))
    assert http == 503 and "IsADirectoryError" in body["findings"][0]["text"]


def test_the_status_file_written_by_the_check_reads_back(tmp_path):
    path = tmp_path / "health.json"
    write_status(str(path), status(1))
    http, body = answer(*endpoint.read_status(str(path)))
    assert http == 200 and body["verdict"] == "WARNING"


@pytest.mark.parametrize("method, target, code", [
    ("GET", "/health", 200), ("GET", "/", 200), ("HEAD", "/health", 200), ("GET", "/health?probe=lb", 200),
    ("GET", "http://10.0.0.1:9120/health", 200),
    ("GET", "/metrics", 404), ("GET", "/health/", 404), ("GET", "/v1/models", 404), ("POST", "/nope", 404),
    ("POST", "/health", 405), ("PUT", "/", 405), ("DELETE", "/health", 405), ("OPTIONS", "/health", 405),
])
def test_routes(method, target, code):
    assert endpoint.route(method, target) == code


def test_response_is_http_with_json_and_no_caching():
    raw = endpoint.response(503, {"verdict": "CRITICAL"})
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    assert {"Content-Type: application/json", "Cache-Control: no-store", "Connection: close",
            f"Content-Length: {len(body)}"} <= set(lines[1:])
    assert json.loads(body) == {"verdict": "CRITICAL"}
    assert endpoint.response(503, {"verdict": "CRITICAL"}, head=True) == head + b"\r\n\r\n"
    assert "Allow: GET, HEAD" in endpoint.response(405, {}).decode()


def test_the_endpoint_reads_only_the_status_file():
    """No secret can reach the body: the module imports nothing that reads key files."""
    tree = ast.parse(Path(endpoint.__file__).read_text())
    ours = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert ours == {"contract", "statusfile"}


# ------------------------------------------------------------------------------- one request, as a host runs it

@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[list[str], str]:
    """argv of the endpoint as the unit runs it, from the package laid out as the vllm role ships it."""
    venv = tmp_path_factory.mktemp("release") / "venv"
    onhost_lib.install(venv / "lib")
    argv = module_argv(str(venv), "endpoint")
    return [sys.executable, *argv[1:]], str(venv / "lib")


def run_one(shipped, request: bytes, status_file: Path) -> tuple[int, dict | None, bytes]:
    argv, lib = shipped
    result = subprocess.run([*argv, "--status-file", str(status_file), "--interval-s", str(INTERVAL)],
                            input=request, capture_output=True, env={"PYTHONPATH": lib}, timeout=30)
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    head, _, body = result.stdout.partition(b"\r\n\r\n")
    code = int(head.split()[1])
    return code, (json.loads(body) if body else None), head


def test_one_request_piped_in_gets_the_verdict(shipped, tmp_path):
    path = tmp_path / "health.json"
    code, body, _ = run_one(shipped, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", path)
    assert code == 503 and body["verdict"] == "UNKNOWN" and "no status file" in body["findings"][0]["text"]
    fresh = status(0)
    fresh["time"] = iso(time.time())
    write_status(str(path), fresh)
    code, body, _ = run_one(shipped, b"GET / HTTP/1.0\r\n\r\n", path)
    assert code == 200 and set(body) == FIELDS and body["verdict"] == "OK" and body["age_s"] < 30
    write_status(str(path), {**fresh, "verdict": "CRITICAL", "code": 2})
    assert run_one(shipped, b"GET /health HTTP/1.1\r\n\r\n", path)[0] == 503
    write_status(str(path), status(0, age=10_000))  # the timer stopped long ago
    code, body, _ = run_one(shipped, b"GET /health HTTP/1.1\r\n\r\n", path)
    assert code == 503 and body["verdict"] == "STALE"


@pytest.mark.parametrize("request_bytes, code", [
    (b"POST /health HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405), (b"GET /metrics HTTP/1.1\r\n\r\n", 404),
    (b"hello\r\n\r\n", 400), (b"", 400), (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
])
def test_other_requests_get_errors_not_the_verdict(shipped, tmp_path, request_bytes, code):
    got, body, _ = run_one(shipped, request_bytes, tmp_path / "health.json")
    assert got == code and set(body) == {"error", "detail"}


def test_head_gets_the_headers_only(shipped, tmp_path):
    code, body, head = run_one(shipped, b"HEAD /health HTTP/1.1\r\n\r\n", tmp_path / "health.json")
    assert code == 503 and body is None and b"Content-Length: " in head


def test_one_socket_as_stdin_and_stdout_as_systemd_hands_it(shipped, tmp_path):
    """Accept=yes with StandardInput=socket and StandardOutput=socket: one connected socket is fd 0
    and 1. The client sees a whole answer and the connection's end (no reset)."""
    argv, lib = shipped
    client, server = socket.socketpair()
    with client, server:
        proc = subprocess.Popen([*argv, "--status-file", str(tmp_path / "health.json")], stdin=server, stdout=server,
                                stderr=subprocess.PIPE, env={"PYTHONPATH": lib})
        server.close()
        client.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl\r\n\r\n")
        client.settimeout(30)
        data = b""
        while chunk := client.recv(65536):
            data += chunk
        assert proc.wait(timeout=30) == 0 and proc.stderr.read() == b""
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and json.loads(body)["verdict"] == "UNKNOWN"


@pytest.mark.parametrize("trickle", [b"", b"GET /health HTTP/1.1\r\n"])
def test_a_slow_client_is_answered_408_and_let_go_within_the_request_timeout(shipped, tmp_path, trickle):
    """Issue 25: a client that sends nothing, or a byte now and then, held its slot (one of the
    socket's MaxConnections=16) for the unit's RuntimeMaxSec= (10 s); now REQUEST_TIMEOUT_S."""
    argv, lib = shipped
    client, server = socket.socketpair()
    with client, server:
        started = time.monotonic()
        proc = subprocess.Popen([*argv, "--status-file", str(tmp_path / "health.json")], stdin=server, stdout=server,
                                stderr=subprocess.PIPE, env={"PYTHONPATH": lib})
        server.close()
        client.settimeout(0.3)
        data = b""
        for byte in trickle + b"X" * 40:  # one byte each 0.3 s: no single read waits long
            try:
                client.sendall(bytes([byte]))
                data += client.recv(65536)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                pass
            if proc.poll() is not None:
                break
        assert proc.wait(timeout=15) == 0 and proc.stderr.read() == b""
        elapsed = time.monotonic() - started
        client.settimeout(5)
        while chunk := client.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 ") and elapsed < endpoint.REQUEST_TIMEOUT_S + 3, (elapsed, data[:100])


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate not installed")
def test_over_a_real_socket_as_systemd_accepts_it(shipped, tmp_path):
    """systemd's own socket activator in the socket unit's mode (Accept=yes, the connection as stdin
    and stdout): an HTTP client on loopback gets 503 before the first check and 200 after it."""
    argv, lib = shipped
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "health.json"
    activator = subprocess.Popen(["systemd-socket-activate", "--accept", "--inetd", f"--listen=127.0.0.1:{port}",
                                  f"--setenv=PYTHONPATH={lib}", *argv, "--status-file", str(path)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def get(method="GET", target="/health"):
            for _ in range(100):  # until the activator listens
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    conn.request(method, target)
                    resp = conn.getresponse()
                    return resp.status, resp.read()
                except ConnectionRefusedError:
                    time.sleep(0.05)
            raise AssertionError(activator.stderr.read1().decode() if activator.poll() is not None else "no listener")

        code, body = get()
        assert code == 503 and json.loads(body)["verdict"] == "UNKNOWN"
        fresh = status(1)
        fresh["time"] = iso(time.time())
        write_status(str(path), fresh)
        code, body = get()
        assert code == 200 and json.loads(body)["verdict"] == "WARNING"
        assert get("POST")[0] == 405 and get(target="/metrics")[0] == 404
    finally:
        activator.terminate()
        activator.wait(timeout=10)


# ------------------------------------------------------------------------------- copies (issue 26)

def test_a_host_serving_copies_answers_each_copy_on_its_path(shipped, tmp_path):
    """/health/NAME answers from health@NAME.json beside --status-file (the copies from the unit's
    environment); / and /health name no copy; an unlisted or malformed name is 404, never a file."""
    argv, lib = shipped
    ok, bad = status(0), {**status(2)}
    ok["time"] = bad["time"] = iso(time.time())
    write_status(str(tmp_path / "health@a.json"), ok)
    write_status(str(tmp_path / "health@b.json"), bad)
    write_status(str(tmp_path / "health@x.json"), ok)  # not a listed copy: never read

    def one(request: bytes) -> tuple[int, dict]:
        result = subprocess.run([*argv, "--status-file", str(tmp_path / "health.json"), "--interval-s", str(INTERVAL)],
                                input=request, capture_output=True, timeout=30,
                                env={"PYTHONPATH": lib, "QWEN27B_HEALTH_COPIES": "a,b"})
        head, _, body = result.stdout.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)

    code, body = one(b"GET /health/a HTTP/1.1\r\n\r\n")
    assert code == 200 and body["copy"] == "a" and body["verdict"] == "OK"
    code, body = one(b"GET /health/b HTTP/1.1\r\n\r\n")
    assert code == 503 and body["copy"] == "b" and body["verdict"] == "CRITICAL"
    for target in (b"/health", b"/", b"/health/x", b"/health/../health@a", b"/health/a/"):
        code, body = one(b"GET " + target + b" HTTP/1.1\r\n\r\n")
        assert code == 404 and "/health/a, /health/b" in body["detail"], target
    assert one(b"POST /health/a HTTP/1.1\r\n\r\n")[0] == 405


def test_copy_names_are_allow_listed(monkeypatch):
    monkeypatch.setenv("QWEN27B_HEALTH_COPIES", "a,../b")
    with pytest.raises(SystemExit):
        endpoint.parse_args(["--status-file", "/x/health.json"])
    monkeypatch.delenv("QWEN27B_HEALTH_COPIES")
    assert endpoint.parse_args(["--status-file", "/x/health.json"]).copies == []
