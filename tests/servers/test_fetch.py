"""qwen27b-fetch against a real HTTP mirror on loopback: resume, checksum, skip, disk space."""

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from http.server import SimpleHTTPRequestHandler

import pytest

from qwen27b.onhost import fetch
from qwen27b.onhost.mirror import serve


@pytest.fixture
def mirror(tmp_path):
    """(base URL, tmp dir, the files, the handler: its request log and throttle)."""
    src = tmp_path / "mirror"
    src.mkdir()
    blobs = {"model.safetensors": os.urandom(3 * 2**20 + 123), "config.json": b'{"a": 1}'}
    for name, data in blobs.items():
        (src / name).write_bytes(data)
    manifest = {"files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in blobs.items()}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    server, _ = serve(str(src))
    yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path, blobs, server.handler
    server.shutdown()


def test_download_verify_and_skip(mirror):
    base, tmp, blobs, handler = mirror
    dest = tmp / "dest"
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == blobs["model.safetensors"]
    mtime = (dest / "model.safetensors").stat().st_mtime_ns
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").stat().st_mtime_ns == mtime  # verified, not re-sent


def test_an_empty_file_in_the_manifest_is_fetched(mirror):
    """A checkpoint may list an empty file (an empty added_tokens.json): it has no part to hash."""
    base, tmp, blobs, handler = mirror
    (tmp / "mirror" / "empty.txt").write_bytes(b"")
    manifest = json.loads((tmp / "manifest.json").read_text())
    manifest["files"]["empty.txt"] = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    dest = tmp / "dest"
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "empty.txt").read_bytes() == b"" and not (dest / "empty.txt.part").exists()


def test_interrupted_transfer_resumes_from_the_part_file(mirror):
    base, tmp, blobs, handler = mirror
    dest = tmp / "dest"
    dest.mkdir()
    data = blobs["model.safetensors"]
    (dest / "model.safetensors.part").write_bytes(data[: 2**20])  # what a Ctrl-C left behind
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == data and not (dest / "model.safetensors.part").exists()


def test_corrupt_part_is_refused_and_removed(mirror, capsys):
    base, tmp, blobs, handler = mirror
    dest = tmp / "dest"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(b"x" * 2**20)  # garbage: resuming it cannot verify
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 1
    assert "does not match the manifest" in capsys.readouterr().err
    assert not (dest / "model.safetensors.part").exists() and not (dest / "model.safetensors").exists()
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0


def test_too_little_disk_downloads_nothing(mirror, capsys):
    base, tmp, _, _ = mirror
    manifest = json.loads((tmp / "manifest.json").read_text())
    manifest["files"]["model.safetensors"]["size"] = 1 << 60
    (tmp / "huge.json").write_text(json.dumps(manifest))
    assert fetch.main(["--base", base, "--dest", str(tmp / "d"), "--manifest", str(tmp / "huge.json")]) == 1
    err = capsys.readouterr().err
    assert "free space there, then re-run (nothing more was downloaded" in err and "GiB free" in err
    assert [p.name for p in (tmp / "d").iterdir()] == [".qwen27b-fetch.lock"]


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB tmpfs: the disk that fills up."""
    if os.geteuid() != 0:
        from setupcheck import skip_or_fail_setup
        skip_or_fail_setup("mounting a tmpfs needs root")
    path = tmp_path / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)], check=True)
    yield path
    subprocess.run(["umount", str(path)], check=True)


def run_fetch(base: str, dest, manifest) -> subprocess.Popen:
    """qwen27b-fetch as the hosts run it: its own process (no threads: pyinfra's gevent patching may
    be active in this pytest process, and a blocking flock would stop every greenlet)."""
    return subprocess.Popen([sys.executable, fetch.__file__, "--base", base, "--dest", str(dest), "--manifest",
                             str(manifest)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_disk_full_mid_transfer_keeps_the_part_and_the_rerun_resumes(mirror, small_disk):
    """The space check passes (3 MiB needed, 4 MiB free), then another writer fills the disk while
    the (throttled) transfer runs: a clear error, the part kept; after freeing space, a Range resume."""
    base, tmp, blobs, handler = mirror
    handler.rate = 1.5e6
    dest = small_disk / "model"
    part = dest / "model.safetensors.part"
    proc = run_fetch(base, dest, tmp / "manifest.json")
    deadline = time.monotonic() + 20
    while not (part.exists() and part.stat().st_size > 2**20):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk}/filler", "bs=64k"], capture_output=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "disk full in" in err and "kept in model.safetensors.part" in err, err
    assert "re-run" in err
    kept = part.stat().st_size
    assert kept > 2**20 and not (dest / "model.safetensors").exists()
    (small_disk / "filler").unlink()
    handler.rate = None
    handler.requests.clear()
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == blobs["model.safetensors"]
    assert ("/model.safetensors", f"bytes={kept}-") in handler.requests


def test_a_fetch_whose_caller_is_gone_stops_at_once_and_keeps_the_part(mirror):
    """Ctrl-C of the controller or a dropped SSH session closes the reader of the fetch's stderr.
    The fetch must stop then, not at its next progress line: here the mirror speeds up the moment
    the caller goes (as the e2e mirror's throttle lifts), and a fetch that wrote on until its next
    progress line (2 s) would have finished the file, unobserved (seen in CI)."""
    base, tmp, blobs, handler = mirror
    handler.rate = 0.5e6
    dest = tmp / "dest"
    part = dest / "model.safetensors.part"
    proc = run_fetch(base, dest, tmp / "manifest.json")
    deadline = time.monotonic() + 20
    while not (part.exists() and part.stat().st_size > 2**18):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.stderr.close()  # the caller is gone
    handler.rate = None
    assert proc.wait(timeout=5) == 1
    assert not (dest / "model.safetensors").exists()
    assert 0 < part.stat().st_size < len(blobs["model.safetensors"])  # kept for the re-run
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == blobs["model.safetensors"]


def test_a_fetch_with_its_stderr_on_a_file_is_not_watched(tmp_path):
    """A terminal, a file or /dev/null has no reader to lose: no watcher thread."""
    with open(tmp_path / "log", "w") as log:
        assert fetch.stop_when_the_caller_goes(log.fileno()) is None


def test_a_second_fetch_waits_for_the_first(mirror):
    """Two fetches into one dir (e.g. one orphaned by a dropped SSH session): the second waits."""
    base, tmp, blobs, _ = mirror
    dest = tmp / "dest"
    dest.mkdir()
    with open(dest / ".qwen27b-fetch.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 4242\n")
        held.flush()
        second = run_fetch(base, dest, tmp / "manifest.json")
        time.sleep(1.5)
        assert second.poll() is None and not (dest / "config.json").exists()  # waiting, writing nothing
        fcntl.flock(held, fcntl.LOCK_UN)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0 and (dest / "config.json").read_bytes() == blobs["config.json"]
    assert "another fetch (pid 4242) is writing" in err


def _count_reads(monkeypatch, names):
    """Count the opens of dest files for reading (any mode but write-only) made by fetch.py."""
    reads = []

    def counting_open(file, mode="r", *args, **kwargs):
        if os.path.basename(str(file)).split(".part")[0] in names and ("r" in mode or "+" in mode):
            reads.append((os.path.basename(str(file)), mode))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(fetch, "open", counting_open, raising=False)  # fetch's global `open` shadows the builtin
    return reads


def test_a_fresh_download_is_hashed_as_it_arrives(mirror, monkeypatch):
    """No file is read back after its transfer: the sha256 is fed from the received chunks."""
    base, tmp, blobs, _ = mirror
    reads = _count_reads(monkeypatch, set(blobs))
    dest = tmp / "dest"
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert reads == [] and (dest / "model.safetensors").read_bytes() == blobs["model.safetensors"]


def test_a_resume_reads_the_kept_prefix_once_and_verifies(mirror, monkeypatch):
    base, tmp, blobs, handler = mirror
    dest = tmp / "dest"
    dest.mkdir()
    data = blobs["model.safetensors"]
    (dest / "model.safetensors.part").write_bytes(data[: 2**20 + 7])  # not on a chunk boundary
    reads = _count_reads(monkeypatch, set(blobs))
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert reads == [("model.safetensors.part", "r+b")]
    assert ("/model.safetensors", f"bytes={2**20 + 7}-") in handler.requests
    assert (dest / "model.safetensors").read_bytes() == data and not (dest / "model.safetensors.part").exists()


def test_a_corrupt_prefix_of_a_resumed_part_is_detected(mirror, capsys):
    """Right length, one flipped byte early on: the resumed tail is fine, the whole-file hash is not."""
    base, tmp, blobs, handler = mirror
    dest = tmp / "dest"
    dest.mkdir()
    prefix = bytearray(blobs["model.safetensors"][: 2**20])
    prefix[1000] ^= 0xFF
    (dest / "model.safetensors.part").write_bytes(bytes(prefix))
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 1
    assert "model.safetensors: sha256" in capsys.readouterr().err
    assert ("/model.safetensors", f"bytes={2**20}-") in handler.requests  # it did resume, then refused
    assert not (dest / "model.safetensors.part").exists() and not (dest / "model.safetensors").exists()


def test_a_complete_unverified_part_is_hashed_once_and_renamed(mirror, monkeypatch):
    """Stopped between the last byte and the rename: nothing is asked of the mirror."""
    base, tmp, blobs, handler = mirror
    dest = tmp / "dest"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(blobs["model.safetensors"])
    reads = _count_reads(monkeypatch, set(blobs))
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert reads == [("model.safetensors.part", "rb")]
    assert [path for path, _ in handler.requests] == ["/config.json"]


def test_a_server_ignoring_range_restarts_the_hash(mirror, monkeypatch):
    """A 200 to a Range request: the part is rewritten from byte 0 and hashed from byte 0."""
    base, tmp, blobs, handler = mirror
    monkeypatch.setattr(handler, "send_head", SimpleHTTPRequestHandler.send_head)  # http.server's: no Range
    dest = tmp / "dest"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(b"x" * 2**20)  # garbage, which the 200 replaces
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == blobs["model.safetensors"]
