"""The local hubs of tests/support/hubs.py (issue 30) against the REAL clients of the check venv:
`hf download` and `modelscope download` fetch a small model byte for byte from loopback, a second
run into the same directory is a no-op, an unknown revision or repo fails naming it, and
ModelScope's client refuses a file whose sha256 differs from the listing's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qwen27b.tools.cpu_smoke import cache_root
from setupcheck import skip_or_fail_setup
from tests.support.hubs import serve_hf, serve_modelscope

VENV_BIN = cache_root() / "check" / "venv" / "bin"
REPO = "qwen27b-lab/tiny"


@pytest.fixture
def model(tmp_path):
    """A flat model directory: two small JSON files and a ~1 MiB binary (LFS on the Hub)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}\n')
    (src / "tokenizer_config.json").write_text('{"bos_token": "<s>"}\n')
    (src / "model.safetensors").write_bytes(os.urandom((1 << 20) + 4321))
    return src


def cli(tool: str, tmp_path, variable: str, server, *args) -> subprocess.CompletedProcess:
    """The tool from the check venv, with a clean env: no proxy, no token, HOME in tmp_path."""
    binary = VENV_BIN / tool
    if not binary.exists():
        skip_or_fail_setup(f"no {binary}: build the check venv with `python -m qwen27b.tools.cpu_smoke check`")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           variable: f"http://127.0.0.1:{server.server_address[1]}"}
    return subprocess.run([str(binary), "download", *args], env=env, capture_output=True, text=True, timeout=120)


def same_files(src, dest) -> None:
    for f in src.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.fixture
def hf(model):
    server = serve_hf({(REPO, "main"): model, (REPO, "v2"): model})
    yield server
    server.shutdown()


@pytest.fixture
def ms(model):
    server = serve_modelscope({(REPO, "v1.0"): model})
    yield server
    server.shutdown()


def test_hf_download_fetches_the_revision_and_a_second_run_is_a_no_op(hf, model, tmp_path):
    dest = tmp_path / "out"
    run = cli("hf", tmp_path, "HF_ENDPOINT", hf, REPO, "--revision", "main", "--local-dir", str(dest))
    assert run.returncode == 0, run.stderr[-3000:]
    same_files(model, dest)
    sha = hf.handler.repos[(REPO, "main")].sha
    gets = {path for path, method in hf.handler.requests if method == "GET"}
    assert f"/api/models/{REPO}/revision/main" in gets
    assert f"/{REPO}/resolve/{sha}/config.json" in gets
    assert f"/cdn-lfs/{REPO}/resolve/{sha}/model.safetensors" in gets  # LFS: through the redirect
    hf.handler.requests.clear()
    again = cli("hf", tmp_path, "HF_ENDPOINT", hf, REPO, "--revision", "main", "--local-dir", str(dest))
    assert again.returncode == 0, again.stderr[-3000:]
    same_files(model, dest)
    assert not [p for p, _ in hf.handler.requests if "resolve" in p], hf.handler.requests


@pytest.mark.parametrize("repo, revision, says", [
    (REPO, "v9", f"Revision not found in model '{REPO}'"),
    ("qwen27b-lab/nope", "main", "'qwen27b-lab/nope' not found")])
def test_hf_download_of_an_unknown_revision_or_repo_fails_naming_it(hf, tmp_path, repo, revision, says):
    run = cli("hf", tmp_path, "HF_ENDPOINT", hf, repo, "--revision", revision, "--local-dir", str(tmp_path / "out"))
    assert run.returncode != 0
    assert says in run.stdout + run.stderr, run.stderr[-3000:]


def test_modelscope_download_fetches_the_revision_and_a_second_run_is_a_no_op(ms, model, tmp_path):
    dest = tmp_path / "out"
    run = cli("modelscope", tmp_path, "MODELSCOPE_ENDPOINT", ms, REPO, "--revision", "v1.0", "--local-dir", str(dest))
    assert run.returncode == 0, run.stderr[-3000:]
    same_files(model, dest)
    gets = [path for path, method in ms.handler.requests if method == "GET"]
    assert f"/api/v1/models/{REPO}/repo/files?Revision=v1.0&Recursive=True" in gets
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        assert f"/api/v1/models/{REPO}/repo?Revision=v1.0&FilePath={name}" in gets
    ms.handler.requests.clear()
    again = cli("modelscope", tmp_path, "MODELSCOPE_ENDPOINT", ms, REPO, "--revision", "v1.0", "--local-dir", str(dest))
    assert again.returncode == 0, again.stderr[-3000:]
    same_files(model, dest)
    assert not [p for p, _ in ms.handler.requests if "FilePath=" in p], ms.handler.requests


@pytest.mark.parametrize("repo, revision, says", [
    (REPO, "v9", f"Revision v9 of {REPO} not found"), ("qwen27b-lab/nope", "v1.0", "Model qwen27b-lab/nope not found")])
def test_modelscope_download_of_an_unknown_revision_or_repo_fails_naming_it(ms, tmp_path, repo, revision, says):
    run = cli("modelscope", tmp_path, "MODELSCOPE_ENDPOINT", ms, repo, "--revision", revision,
              "--local-dir", str(tmp_path / "out"))
    assert run.returncode != 0
    assert says in run.stdout + run.stderr, run.stderr[-3000:]


def test_modelscope_download_refuses_a_file_whose_sha256_differs_from_the_listing(model, tmp_path):
    server = serve_modelscope({(REPO, "v1.0"): model}, bad_sha256={"model.safetensors"})
    try:
        dest = tmp_path / "out"
        run = cli("modelscope", tmp_path, "MODELSCOPE_ENDPOINT", server, REPO, "--revision", "v1.0",
                  "--local-dir", str(dest))
    finally:
        server.shutdown()
    assert run.returncode != 0
    assert "Hash mismatch for model.safetensors" in run.stdout + run.stderr, run.stderr[-3000:]
    assert not (dest / "model.safetensors").exists()
    assert (dest / "config.json").read_bytes() == (model / "config.json").read_bytes()


@pytest.mark.parametrize("serve, path", [
    (serve_hf, f"/cdn-lfs/{REPO}/resolve/{{sha}}/model.safetensors"),
    (serve_modelscope, f"/api/v1/models/{REPO}/repo?Revision=v1.0&FilePath=model.safetensors")])
def test_both_hubs_resume_a_file_from_a_range(model, serve, path):
    """What a client resuming an interrupted download asks: the rest of the file, 206."""
    import http.client
    server = serve({(REPO, "v1.0"): model})
    try:
        conn = http.client.HTTPConnection(*server.server_address, timeout=10)
        conn.request("GET", path.format(sha=server.handler.repos[(REPO, "v1.0")].sha), headers={"Range": "bytes=1000-"})
        answer = conn.getresponse()
        assert (answer.status, answer.read()) == (206, (model / "model.safetensors").read_bytes()[1000:])
        conn.close()
    finally:
        server.shutdown()


def test_a_simple_index_made_from_the_wheelhouse_serves_uv(tmp_path):
    """The lab PyPI mirror the e2e points qwen27b_pypi_index at: the real uv (the version the hosts
    get, from the controller cache) resolves and installs a pinned project from it, checking each
    wheel against the index's #sha256=, and nothing else is asked of the network (--offline is not
    set, so a missing wheel would fail against this index only)."""
    from qwen27b.controller.artifacts import uv_binary
    from qwen27b.plan.stack import load_stack
    from qwen27b.tools import cpu_smoke
    from tests.support.pypi_index import serve_index

    wheelhouse = cpu_smoke.default_wheelhouse(cpu_smoke.cache_root())
    if not (wheelhouse / "manifest.json").is_file():
        skip_or_fail_setup(f"no wheelhouse at {wheelhouse}: `python3 -m qwen27b.tools.cpu_smoke wheelhouse`")
    uv = uv_binary(load_stack()["tools"]["uv"]["version"])
    server = serve_index(wheelhouse, tmp_path / "index")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
        subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(tmp_path / "v")], env=env, check=True)
        out = subprocess.run([str(uv), "pip", "install", "--no-config", "--python", str(tmp_path / "v/bin/python"),
                              "--index-url", url, "modelscope-hub==0.5.1"], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        assert (tmp_path / "v/bin/modelscope").exists()
        fetched = [p for p, m in server.handler.requests if p.startswith("/files/")]
        assert any("modelscope_hub-0.5.1" in p for p in fetched), server.handler.requests
        bad = subprocess.run([str(uv), "pip", "install", "--no-config", "--python", str(tmp_path / "v/bin/python"),
                              "--index-url", url, "not-in-the-wheelhouse"], env=env, capture_output=True, text=True)
        assert bad.returncode != 0 and "not-in-the-wheelhouse" in bad.stderr
    finally:
        server.shutdown()
