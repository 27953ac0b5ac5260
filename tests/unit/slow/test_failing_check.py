"""A failed check ends a host with its one red line and the summary, never a Python traceback
(issue 32: pyinfra prints a traceback for any exception a `python.call` callback raises; verify,
rollback and the gateway's check now go through roles._common.check). A real `pyinfra @local` run."""

from __future__ import annotations

import os
import subprocess
import sys
from tests.support.paths import ROOT



def test_a_failed_check_prints_its_reason_once_and_no_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), QWEN27B_REPORTS=str(tmp_path / "reports"))
    run = subprocess.run([sys.executable, "-m", "pyinfra", "@local", str(ROOT / "tests/data/failing_check_deploy.py"), "-y"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert out.count("verify failed: the served name is missing (journal and health status in the run report)") == 1, out
    assert "Traceback" not in out and "Unexpected error in Python callback" not in out, out
    assert "never" not in out, out  # the host stopped at the failed check
