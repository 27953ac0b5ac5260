"""The units rendered for a recorded host's decision (the templates' tests and those that read a rendered
unit): the template -> unit names, the decision, the rendering into a scratch root, and the exposure score
of `systemd-analyze security --offline` where the machine's systemd has it."""

import os
import re
import shutil
import subprocess

import pytest

from qwen27b.controller.render import render_all
from qwen27b.plan.gate import decide
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts


STACK = load_stack()
# template -> unit file name; the socket is verified with its request service beside it
UNIT_NAMES = {"qwen27b.service.j2": "qwen27b.service", "qwen27b-health.service.j2": "qwen27b-health.service",
              "qwen27b-health.timer.j2": "qwen27b-health.timer", "qwen27b-health-http.socket.j2": "qwen27b-health-http.socket",
              "qwen27b-health-http@.service.j2": "qwen27b-health-http@.service"}


def decision(host="v100x4-2204-fresh", data=None):
    return decide(host, recorded_facts(host), STACK, settings_for(host, data or {}))


def rendered(tmp_path, d):
    files = render_all(d, prefix=str(tmp_path))
    for exe in ("opt/qwen27b/current/venv/bin/python", "opt/qwen27b/current/venv/bin/qwen27b-health"):
        path = tmp_path / exe
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return files


def exposure(path) -> float:
    """`systemd-analyze security --offline=yes` of one unit file: its "Overall exposure level"."""
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(path)],
                            capture_output=True, text=True, env={**os.environ, "SYSTEMD_LOG_LEVEL": "err"})
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    return float(match.group(1))


needs_offline_security = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None
    or "--offline" not in subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True).stdout,
    reason="systemd-analyze security --offline needs systemd >= 250")
