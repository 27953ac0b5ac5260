"""The unit's start-up warm-up (qwen27b_onhost.warmup, issue 23): its pure parts, the ExecStartPost the
renderer writes for the service and its copies, and the module run as a host runs it against a real
vllm serve (the key from the environment only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.support.paths import TESTS

sys.path.insert(0, str(TESTS))

from qwen27b.controller.render import render_all  # noqa: E402
from qwen27b.controller.render_copies import render_instances  # noqa: E402
from qwen27b.onhost import warmup  # noqa: E402
from qwen27b.plan.stack import load_stack  # noqa: E402
from tests.support.rendering import decision  # noqa: E402

STACK = load_stack()


def test_main_pid_and_key_come_from_the_environment():
    assert warmup.main_pid({"MAINPID": "4242"}) == 4242
    assert warmup.main_pid({}) is None and warmup.main_pid({"MAINPID": "x"}) is None
    assert warmup.headers({"VLLM_API_KEY": "k1"}) == {"Authorization": "Bearer k1"}
    assert warmup.headers({}) == {}


def test_alive_reads_the_process_table():
    assert warmup.alive(os.getpid()) and warmup.alive(None)
    child = subprocess.Popen(["true"])
    child.wait()
    assert not warmup.alive(child.pid)


def test_request_is_short_and_greedy():
    assert warmup.request_body("m", 16) == {"model": "m", "prompt": warmup.PROMPT, "max_tokens": 16, "temperature": 0}


@pytest.mark.parametrize("profile", ["sm70", "sm75plus", "cpu-smoke"])
def test_every_profile_warms_up_within_its_start_timeout(profile):
    serve = STACK["profiles"][profile]["serve"]
    warm = serve["warmup"]
    assert 0 < warm["max_tokens"] <= 64 and 0 < warm["timeout_s"] < serve["start_timeout_s"]
    assert all(source in STACK["sources"] for source in ([warm["source"]] if isinstance(warm["source"], str)
                                                         else warm["source"]))


def test_the_unit_warms_up_at_its_bound_address_and_no_key_in_argv():
    files = render_all(decision(data={"qwen27b_bind_address": "fd00::7"}))
    post = [line for line in files["qwen27b.service.j2"].splitlines() if line.startswith("ExecStartPost=")]
    warm = STACK["profiles"]["sm70"]["serve"]["warmup"]
    assert post == ["ExecStartPost=/usr/bin/env PYTHONPATH=/opt/qwen27b/current/venv/lib "
                    "/opt/qwen27b/current/venv/bin/python -m qwen27b_onhost.warmup --url 'http://[fd00::7]:8000' "
                    f"--served-name qwen3.8-27b --timeout-s {warm['timeout_s']} --max-tokens {warm['max_tokens']}"]
    assert "VLLM_API_KEY" not in post[0] and "EnvironmentFile=-/etc/qwen27b/api-key.env" in files["qwen27b.service.j2"]


def test_copies_warm_up_at_their_own_url():
    from tests.support.copies import copies
    unit = render_instances(copies())["qwen27b@.service"]
    post = [line for line in unit.splitlines() if line.startswith("ExecStartPost=")]
    assert len(post) == 1 and "qwen27b_onhost.warmup --url ${QWEN27B_URL} --timeout-s" in post[0]
    assert "--served-name" not in post[0]  # one template for every copy: the model from /v1/models


# ------------------------------------------------------------------ as a host runs it


@pytest.fixture
def run_warmup(vllm_server, tmp_path):
    from tests.support import onhost_lib
    onhost_lib.install(tmp_path / "lib")

    def run(url, env=None, *extra):
        argv = [f"{vllm_server['venv']}/bin/python", "-m", "qwen27b_onhost.warmup", "--url", url,
                "--timeout-s", "120", "--max-tokens", "4", *extra]
        e = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "lib"), **(env or {})}
        return subprocess.run(argv, capture_output=True, text=True, env=e, timeout=300)
    return run


def test_warm_up_against_a_real_server(run_warmup, vllm_server):
    key = vllm_server["api_key"]
    done = run_warmup(vllm_server["url"], {"VLLM_API_KEY": key, "MAINPID": str(vllm_server["pid"])})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warm-up completion done" in done.stdout and key not in done.stdout + done.stderr
    named = run_warmup(vllm_server["url"], {"VLLM_API_KEY": key, "MAINPID": str(vllm_server["pid"])},
                       "--served-name", vllm_server["name"])
    assert named.returncode == 0, named.stdout + named.stderr
    wrong = run_warmup(vllm_server["url"], {"VLLM_API_KEY": "not-the-key", "MAINPID": str(vllm_server["pid"])})
    assert wrong.returncode == 1 and "failed" in wrong.stderr and "not-the-key" not in wrong.stdout + wrong.stderr


def test_a_dead_main_process_fails_the_start_at_once(run_warmup):
    from qwen27b.tools.cpu_smoke import free_port
    child = subprocess.Popen(["true"])
    child.wait()
    done = run_warmup(f"http://127.0.0.1:{free_port()}", {"MAINPID": str(child.pid)})
    assert done.returncode == 1 and "exited before /health answered" in done.stderr


def test_a_planted_listener_gets_no_key_from_the_warm_up(tmp_path):
    """Issue 51 item 2: a plain Python HTTP server (tests/support/planted.py, its own process) holds the
    port and answers 200 to /health, /v1/models and the completion; $MAINPID is another real process.
    The warm-up names the squatter and fails the unit without sending the key; with the squatter as
    $MAINPID (the control) the key goes. The module runs as ExecStartPost runs it (lib on PYTHONPATH)."""
    from qwen27b.tools.cpu_smoke import free_port
    from tests.support import onhost_lib
    from tests.support.planted import other_process, planted_listener
    onhost_lib.install(tmp_path / "lib")
    port, log = free_port(), tmp_path / "squatter.log"

    def run(main_pid):
        argv = [sys.executable, "-m", "qwen27b_onhost.warmup", "--url", f"http://127.0.0.1:{port}",
                "--timeout-s", "30", "--max-tokens", "4"]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "lib"), "VLLM_API_KEY": "sk-planted-warm-key",
               "MAINPID": str(main_pid)}
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)

    with planted_listener(port, log) as squatter, other_process() as unit_process:
        done = run(unit_process.pid)
        assert done.returncode == 1 and "sk-planted-warm-key" not in log.read_text(), log.read_text()
        assert "the API key is not sent" in done.stderr and f"pid {squatter.pid} (python" in done.stderr
        assert "sk-planted-warm-key" not in done.stdout + done.stderr
        done = run(squatter.pid)  # the control
        assert done.returncode == 0, done.stdout + done.stderr
        assert "auth=Bearer sk-planted-warm-key" in log.read_text()
