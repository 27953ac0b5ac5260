"""`qwen27b mirror`: the layout an air-gapped lab serves, proven by what the hosts run against it.

Real parts: the tool lays out a small checkpoint (real files), wheels and a python-build-standalone
archive name; the real mirror server (qwen27b/onhost/mirror.py) serves the directory; the real
qwen27b-fetch (qwen27b/onhost/fetch.py), as the weights role runs it, reads the checkpoint's
manifest under the name the stack gives the revision, fetches and verifies every file. The wheels'
directory page lists each wheel (what uv's --find-links reads).
"""

from __future__ import annotations

import json
import urllib.request

from qwen27b.onhost import fetch
from qwen27b.onhost.mirror import serve
from qwen27b.plan.stack import load_stack, resolve_stack, revision_dir_name
from qwen27b.tools import cli


def test_the_layout_is_what_the_hosts_fetch(tmp_path, capsys):
    checkpoint, wheels, dest = tmp_path / "ckpt", tmp_path / "wheels-in", tmp_path / "mirror"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    (checkpoint / "model-00001-of-00001.safetensors").write_bytes(b"\x07" * 300_000)
    (checkpoint / ".cache").mkdir()  # hf download's own bookkeeping: not served
    wheels.mkdir()
    (wheels / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"PK wheel")
    archive = tmp_path / "cpython-3.12.12+20251014-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz"
    archive.write_bytes(b"tarball")

    rc = cli.main(["mirror", str(dest), "--model", str(checkpoint), "--model-revision", "abc123",
                   "--wheels", str(wheels), "--python", str(archive)])
    out = capsys.readouterr().out
    assert rc == 0, out
    entry = resolve_stack(load_stack(), "sm70", {"model_revision": "abc123"}).model
    name = revision_dir_name(entry)
    assert name == "QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@abc123" and (dest / name / "manifest.json").is_file()
    assert (dest / "python" / "20251014" / archive.name).read_bytes() == b"tarball"
    assert "qwen27b_model_mirror: http://MIRROR:PORT" in out and "qwen27b_wheel_mirror: http://MIRROR:PORT/wheels/" in out

    server, _ = serve(str(dest))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/{name}/manifest.json") as response:  # as the weights role reads it
            files = json.loads(response.read())["files"]
        assert set(files) == {"config.json", "model-00001-of-00001.safetensors"}
        listing = tmp_path / "listing.json"
        listing.write_text(json.dumps({"files": files}))
        host_dir = tmp_path / "host" / name
        assert fetch.main(["--base", f"{base}/{name}", "--dest", str(host_dir), "--manifest", str(listing)]) == 0
        assert (host_dir / "model-00001-of-00001.safetensors").read_bytes() == b"\x07" * 300_000
        with urllib.request.urlopen(f"{base}/wheels/") as response:
            assert "six-1.17.0-py2.py3-none-any.whl" in response.read().decode()
    finally:
        server.shutdown()

    assert cli.main(["mirror", str(dest), "--model", str(checkpoint), "--model-revision", "abc123"]) == 0  # again: same
    assert (dest / name / "config.json").stat().st_ino == (checkpoint / "config.json").stat().st_ino  # linked


def test_a_directory_that_is_no_checkpoint_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["mirror", str(tmp_path / "m"), "--model", str(tmp_path / "empty")]) == 1
    assert "holds no config.json" in capsys.readouterr().err


def test_an_engine_profile_entry_lays_out_its_own_target(tmp_path, capsys):
    """--engine-profile: the catalog entry's checkpoint names (the names a host with that
    qwen27b_engine_profile asks the mirror for); a name not in the catalog is refused with the list."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    dest = tmp_path / "mirror"
    assert cli.main(["mirror", str(dest), "--model", str(checkpoint), "--engine-profile", "unsloth-nvfp4"]) == 0
    assert (dest / "unsloth--Qwen3.8-27B-NVFP4@main" / "manifest.json").is_file()
    assert cli.main(["mirror", str(dest), "--model", str(checkpoint), "--engine-profile", "unsloth"]) == 2
    err = capsys.readouterr().err
    assert "'unsloth' is not an entry of the engine profile catalog" in err and "quasar-nvfp4-dflash2" in err
