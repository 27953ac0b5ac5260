"""qwen27b-fetch against a real HTTP mirror on loopback: resume, checksum, skip, disk space."""

import hashlib
import json
import os

import pytest

from qwen27b import fetch
from qwen27b.mirror import serve


@pytest.fixture
def mirror(tmp_path):
    src = tmp_path / "mirror"
    src.mkdir()
    blobs = {"model.safetensors": os.urandom(3 * 2**20 + 123), "config.json": b'{"a": 1}'}
    for name, data in blobs.items():
        (src / name).write_bytes(data)
    manifest = {"files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in blobs.items()}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    server, _ = serve(str(src))
    yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path, blobs
    server.shutdown()


def test_download_verify_and_skip(mirror):
    base, tmp, blobs = mirror
    dest = tmp / "dest"
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == blobs["model.safetensors"]
    mtime = (dest / "model.safetensors").stat().st_mtime_ns
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").stat().st_mtime_ns == mtime  # verified, not re-sent


def test_interrupted_transfer_resumes_from_the_part_file(mirror):
    base, tmp, blobs = mirror
    dest = tmp / "dest"
    dest.mkdir()
    data = blobs["model.safetensors"]
    (dest / "model.safetensors.part").write_bytes(data[: 2**20])  # what a Ctrl-C left behind
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0
    assert (dest / "model.safetensors").read_bytes() == data and not (dest / "model.safetensors.part").exists()


def test_corrupt_part_is_refused_and_removed(mirror, capsys):
    base, tmp, blobs = mirror
    dest = tmp / "dest"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(b"x" * 2**20)  # garbage: resuming it cannot verify
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 1
    assert "does not match the manifest" in capsys.readouterr().err
    assert not (dest / "model.safetensors.part").exists() and not (dest / "model.safetensors").exists()
    assert fetch.main(["--base", base, "--dest", str(dest), "--manifest", str(tmp / "manifest.json")]) == 0


def test_too_little_disk_downloads_nothing(mirror, capsys):
    base, tmp, _ = mirror
    manifest = json.loads((tmp / "manifest.json").read_text())
    manifest["files"]["model.safetensors"]["size"] = 1 << 60
    (tmp / "huge.json").write_text(json.dumps(manifest))
    assert fetch.main(["--base", base, "--dest", str(tmp / "d"), "--manifest", str(tmp / "huge.json")]) == 1
    assert "free space first (nothing was downloaded)" in capsys.readouterr().err
    assert list((tmp / "d").iterdir()) == []
