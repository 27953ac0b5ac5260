"""The lab mirror and the seed server under hostile clients (issue 25): Range headers parsed
by one function (qwen27b/onhost/mirror.py parse_range), and a bound on what slow clients hold
(an idle timeout per connection, a cap on connections at once), run on loopback."""

import http.client
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from qwen27b.onhost import mirror
from qwen27b.onhost.mirror import BadRange, BoundedServer, parse_range, seed_handler, serve


@pytest.mark.parametrize("header, size, wanted", [
    ("", 100, None), ("items=0-5", 100, None), ("bytes=0-5,10-12", 100, None),
    ("bytes=0-", 100, (0, 99)), ("bytes=10-19", 100, (10, 19)), ("bytes=90-500", 100, (90, 99)),
    ("bytes=-10", 100, (90, 99)), ("bytes=-500", 100, (0, 99)), ("bytes=99-99", 100, (99, 99))])
def test_ranges_read_as_rfc_9110_says(header, size, wanted):
    assert parse_range(header, size) == wanted


@pytest.mark.parametrize("header, size", [
    ("bytes=5-2", 100), ("bytes=abc-", 100), ("bytes=-abc", 100), ("bytes=-0", 100), ("bytes=-", 100),
    ("bytes=100-", 100), ("bytes=5", 100), ("bytes=+5-9", 100), ("bytes= 5-9x", 100), ("bytes=٥-", 100),
    ("bytes=-5", 0), ("bytes=0-", 0)])
def test_unreadable_backwards_or_outside_ranges_are_refused(header, size):
    with pytest.raises(BadRange):
        parse_range(header, size)


@pytest.fixture
def files(tmp_path):
    payload = bytes(range(256)) * 40
    (tmp_path / "w.bin").write_bytes(payload)
    return tmp_path, payload


def _get(port: int, headers: dict) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/w.bin", headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body, response


def test_the_mirror_answers_suffix_and_bad_ranges(files):
    """Before: `bytes=5-2` sent Content-Length -2, `bytes=-100` the first 101 bytes, `bytes=abc-` a traceback."""
    directory, payload = files
    server, _ = serve(str(directory))
    port = server.server_address[1]
    try:
        status, body, response = _get(port, {"Range": "bytes=-100"})
        assert (status, body) == (206, payload[-100:])
        assert response.getheader("Content-Range") == f"bytes {len(payload) - 100}-{len(payload) - 1}/{len(payload)}"
        assert _get(port, {"Range": "bytes=10-19"})[:2] == (206, payload[10:20])
        for bad in ("bytes=5-2", "bytes=abc-", "bytes=-0"):
            status, _, response = _get(port, {"Range": bad})
            assert status == 416 and int(response.getheader("Content-Length")) >= 0, bad
        assert _get(port, {})[:2] == (200, payload)
    finally:
        server.shutdown()
        server.server_close()


def _idle(port: int) -> socket.socket:
    """A client that connects and sends nothing (slowloris)."""
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _bounded(server: ThreadingHTTPServer, timeout: float) -> None:
    """Two slow clients take both slots; a third is closed at once; after the idle timeout the slow
    ones are gone and a real request is answered."""
    port = server.server_address[1]
    slow = [_idle(port), _idle(port)]
    time.sleep(0.3)  # both accepted, each holding its thread
    started = time.monotonic()
    third = _idle(port)
    assert _closed(third) and time.monotonic() - started < timeout, "a connection over the cap is closed on accept"
    for sock in slow:
        assert _closed(sock)  # recv returns once the server drops the idle client
    assert time.monotonic() - started < timeout + 5
    for sock in slow + [third]:
        sock.close()


def test_the_mirror_drops_idle_clients_and_caps_connections(files):
    directory, payload = files
    server, _ = serve(str(directory), timeout=1.5, max_connections=2)
    try:
        _bounded(server, 1.5)
        assert _get(server.server_address[1], {})[:2] == (200, payload)
    finally:
        server.shutdown()
        server.server_close()


def test_the_seed_drops_idle_clients_and_caps_connections(files):
    directory, payload = files
    handler = type("SlowSeed", (seed_handler(str(directory), "t0ken", ["127.0.0.1"]),), {"timeout": 1.5})
    server = type("Seed", (BoundedServer,), {"max_connections": 2})(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _bounded(server, 1.5)
        status, body, _ = _get_seed(server.server_address[1], directory.name)
        assert (status, body) == (200, payload)
    finally:
        server.shutdown()
        server.server_close()


def _get_seed(port: int, prefix: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", f"/{prefix}/w.bin", headers={"Authorization": "Bearer t0ken"})
    response = conn.getresponse()
    return response.status, response.read(), response


def test_the_seed_process_is_bounded_by_default():
    """What `python -m qwen27b_onhost.mirror` runs with: both handlers time out idle clients, the server caps."""
    assert mirror.SeedHandler.timeout == mirror.RangeHandler.timeout == mirror.IDLE_TIMEOUT_S <= 120
    assert 1 <= BoundedServer.max_connections <= 64
