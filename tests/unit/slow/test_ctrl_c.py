"""Ctrl-C of a real `pyinfra` run (over @local, so no SSH): the first waits for the running
operation and exits 130 before the next one starts; a second stops at once, also 130.

The e2e twin (tests/e2e/test_faults.py) does the same mid-download over SSH, where the handler
used to raise inside paramiko's transport greenlet and the run ended 1 instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from tests.support.paths import ROOT



def _start(tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, CTRL_C_MARKS=str(tmp_path), PYTHONPATH=str(ROOT), QWEN27B_REPORTS=str(tmp_path / "reports"))
    return subprocess.Popen([sys.executable, "-m", "pyinfra", "@local", str(ROOT / "tests/data/ctrl_c_deploy.py"), "-y"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.1)


def test_first_ctrl_c_waits_for_the_running_operation_then_exits_130(tmp_path):
    run = _start(tmp_path)
    _wait_for(tmp_path / "started", run)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 130, out
    assert "interrupted (Ctrl-C): waiting for the running operation (slow) to end" in out, out
    assert (tmp_path / "first").exists(), out  # the running operation was let finish...
    assert not (tmp_path / "second").exists(), out  # ...and the next one never started


def test_second_ctrl_c_stops_at_once(tmp_path):
    run = _start(tmp_path)
    _wait_for(tmp_path / "started", run)
    run.send_signal(signal.SIGINT)
    time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 130, out
    assert "Ctrl-C again: stopping now (exit 130)" in out, out
    assert not (tmp_path / "first").exists() and not (tmp_path / "second").exists(), out
