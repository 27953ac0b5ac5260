"""The real dry run of the recorded hosts (`pyinfra inventory/recorded.py deploy.py --dry`) in a clean environment, and
the blocks of its output: shared by the golden plans (tests/plans/test_plans.py) and the tests that read a plan."""

import os
import re
import subprocess
import sys
import tempfile

from tests.support.paths import ROOT


EMPTY_CACHE = tempfile.mkdtemp(prefix="qwen27b-empty-cache-")
NO_REPORTS = tempfile.mkdtemp(prefix="qwen27b-no-reports-")


def run_pyinfra(*args, **extra_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    # an empty controller cache: a plan must not depend on what this machine has fetched before
    env["QWEN27B_CACHE"] = EMPTY_CACHE
    env["QWEN27B_REPORTS"] = NO_REPORTS  # nor on a `qwen27b reach` record (reports/reach.json)
    env.update(extra_env)
    return subprocess.run([sys.executable, "-m", "pyinfra", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)


def section(output: str, host: str, header: str) -> str:
    """The block that starts with '== @fake/<host>: <header>' and runs to the next blank line."""
    match = re.search(rf"^== @fake/{re.escape(host)}: {header}.*?(?=^\s*$|\Z)", output, re.M | re.S)
    assert match, f"no '{header}' section for {host} in:\n{output[-3000:]}"
    return match.group(0)


def host_plan(output: str, host: str) -> str:
    return section(output, host, rf"profile .*?^== @fake/{host}: \d+ operation")
