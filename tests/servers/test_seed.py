"""The fan-out seed server for real: qwen27b/onhost/mirror.py in seed mode, started as a process the way
its transient unit runs it, on loopback, serving a revision dir next to a symlink to /etc, a
hidden file and a subdirectory. Clients connect from 127.0.0.1 (the planned peer) and 127.0.0.2
(anyone else on the LAN). The unit's own sandbox (User=, TemporaryFileSystem=, IPAddressAllow=)
is planned by qwen27b/plan/fanout.py and checked in tests/unit/slow/test_fanout.py."""

import http.client
import json
import os
import secrets
import subprocess
import sys
import time

import pytest

from qwen27b.controller.artifacts import dir_manifest
from qwen27b.tools.cpu_smoke import free_port
from tests.support.paths import ROOT

NAME = "x--ckpt@1"
MIRROR = [sys.executable, "-m", "qwen27b.onhost.mirror"]  # as the unit runs it: python -m qwen27b_onhost.mirror


@pytest.fixture
def seed(tmp_path):
    rev = tmp_path / "models" / NAME
    rev.mkdir(parents=True)
    payload = os.urandom(1 << 20)
    (rev / "model.safetensors").write_bytes(payload)
    (rev / "config.json").write_text("{}")
    (tmp_path / "models" / "other@2").mkdir()
    (tmp_path / "models" / "other@2" / "secret.bin").write_text("another revision")
    (rev / "etc").symlink_to("/etc")
    (rev / "passwd").symlink_to("/etc/passwd")
    (rev / "sibling").symlink_to(tmp_path / "models" / "other@2" / "secret.bin")
    (rev / ".hidden").write_text("no")
    (rev / "sub").mkdir()
    (rev / "sub" / "f").write_text("no")
    token = secrets.token_urlsafe(32)
    token_file = tmp_path / "seed.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = free_port()
    proc = subprocess.Popen([*MIRROR, str(rev), "--host", "127.0.0.1",
                             "--port", str(port), "--token-file", str(token_file), "--allow", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.05)
        yield {"port": port, "token": token, "token_file": token_file, "payload": payload, "rev": rev, "proc": proc}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get(seed, path, token=None, source="127.0.0.1", headers=None, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", seed["port"], timeout=10, source_address=(source, 0))
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    conn.request(method, path, headers=sent)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body, response


def test_the_token_is_required(seed):
    assert get(seed, f"/{NAME}/config.json")[0] == 401
    assert get(seed, f"/{NAME}/config.json", token="wrong")[0] == 401
    assert get(seed, f"/{NAME}/config.json", headers={"Authorization": seed["token"]})[0] == 401  # no "Bearer"
    assert get(seed, f"/{NAME}/config.json", token=seed["token"])[:2] == (200, b"{}")


def test_only_the_planned_peers_address(seed):
    status, body, _ = get(seed, f"/{NAME}/config.json", token=seed["token"], source="127.0.0.2")
    assert status == 403 and body == b""


@pytest.mark.parametrize("path", [
    "/", f"/{NAME}", f"/{NAME}/", f"/{NAME}/sub", f"/{NAME}/sub/", f"/{NAME}/sub/f",  # no listing, no subdirectory
    f"/{NAME}/etc/passwd", f"/{NAME}/etc/", f"/{NAME}/passwd", f"/{NAME}/sibling",  # symlinks: never followed
    f"/{NAME}/.hidden", f"/{NAME}/..%2fother@2%2fsecret.bin", f"/{NAME}/%2e%2e/other@2/secret.bin",
    "/other@2/secret.bin", f"/{NAME}/model.safetensors%00", f"/{NAME}/missing",
])
def test_nothing_but_the_revisions_plain_files(seed, path):
    status, body, _ = get(seed, path, token=seed["token"])
    assert status == 404 and body == b"", (path, body[:200])


def test_range_works_with_the_token(seed):
    payload = seed["payload"]
    status, body, response = get(seed, f"/{NAME}/model.safetensors", token=seed["token"],
                                 headers={"Range": "bytes=1000-"})
    assert status == 206 and body == payload[1000:]
    assert response.getheader("Content-Range") == f"bytes 1000-{len(payload) - 1}/{len(payload)}"
    status, body, _ = get(seed, f"/{NAME}/model.safetensors", token=seed["token"], headers={"Range": "bytes=10-19"})
    assert (status, body) == (206, payload[10:20])
    assert get(seed, f"/{NAME}/model.safetensors", token=seed["token"], headers={"Range": f"bytes={len(payload)}-"})[0] == 416
    status, body, response = get(seed, f"/{NAME}/model.safetensors", token=seed["token"], method="HEAD")
    assert status == 200 and body == b"" and response.getheader("Content-Length") == str(len(payload))


def test_suffix_and_bad_ranges(seed):
    """Issue 25: `bytes=-N` is the last N bytes (it was answered with the first N+1); a Range that
    is unreadable or backwards is 416, never a traceback or a negative Content-Length."""
    payload, path, token = seed["payload"], f"/{NAME}/model.safetensors", seed["token"]
    status, body, response = get(seed, path, token=token, headers={"Range": "bytes=-100"})
    assert (status, body) == (206, payload[-100:])
    assert response.getheader("Content-Range") == f"bytes {len(payload) - 100}-{len(payload) - 1}/{len(payload)}"
    assert get(seed, path, token=token, headers={"Range": f"bytes=-{len(payload) * 2}"})[:2] == (206, payload)
    for bad in ("bytes=5-2", "bytes=abc-", "bytes=-0", "bytes=-", "bytes= +5-9"):
        status, body, response = get(seed, path, token=token, headers={"Range": bad})
        assert (status, body) == (416, b""), bad
    assert get(seed, path, token=token, headers={"Range": "bytes=0-1,5-9"})[:2] == (200, payload)  # the whole file
    assert seed["proc"].poll() is None


def test_qwen27b_fetch_takes_the_copy_with_its_token_file(seed, tmp_path):
    """The receiver's side as planned: qwen27b-fetch --token-file, resuming a part file."""
    src = tmp_path / "manifest-src"
    src.mkdir()
    for name in ("model.safetensors", "config.json"):
        (src / name).write_bytes((seed["rev"] / name).read_bytes())
    dir_manifest(src)
    listing = tmp_path / "listing.json"
    listing.write_text(json.dumps({"files": json.loads((src / "manifest.json").read_text())["files"]}))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(seed["payload"][:4096])
    base = f"http://127.0.0.1:{seed['port']}/{NAME}"
    fetch = [sys.executable, str(ROOT / "qwen27b" / "onhost" / "fetch.py"), "--base", base, "--dest", str(dest),
             "--manifest", str(listing)]
    refused = subprocess.run(fetch, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "401" in refused.stderr
    result = subprocess.run([*fetch, "--token-file", str(seed["token_file"])], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (dest / "model.safetensors").read_bytes() == seed["payload"]
    assert oct((dest / "model.safetensors").stat().st_mode & 0o777) == "0o644"  # the group can read it


def test_refusals_are_logged_without_the_token(seed):
    get(seed, f"/{NAME}/passwd", token=seed["token"])
    get(seed, f"/{NAME}/config.json", token=seed["token"] + "x")
    seed["proc"].terminate()
    out, err = seed["proc"].communicate(timeout=10)
    assert "404 for 127.0.0.1 GET '/x--ckpt@1/passwd'" in err and "401 for 127.0.0.1" in err
    assert seed["token"] not in out + err


def test_seed_mode_needs_a_token_and_peers(tmp_path):
    (tmp_path / "seed.token").write_text("t\n")
    for args in (["--allow", "127.0.0.1"], ["--token-file", str(tmp_path / "seed.token")]):
        result = subprocess.run([*MIRROR, str(tmp_path), *args], capture_output=True, text=True, timeout=30, cwd=ROOT)
        assert result.returncode == 2 and "needs both" in result.stderr


def test_the_start_up_line_brackets_an_ipv6_address(tmp_path):
    """The server's one line in the journal is a URL a person can paste: http://[::1]:PORT/, not
    http://::1:PORT/ (issue 24: the one URL builder, onhost/contract.http_base)."""
    port = free_port()
    proc = subprocess.Popen([*MIRROR, str(tmp_path), "--host", "::1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert line.rstrip().endswith(f" on http://[::1]:{port}/"), (line, proc.stderr.read())
