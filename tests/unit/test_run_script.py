"""`./run`'s own paths (issue 48 item 2): the demo sets up only what the demo runs; the tests get the
rest. The real script is sourced by bash (sourced, it defines its functions and runs nothing) with
apt-get, systemctl, python3 and the venv's python and pip replaced by stubs that log their argv, and
a PATH holding only the basic tools, so every `command -v TOOL` check sees a bare machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.paths import ROOT

BASIC = ("dirname", "date", "mktemp", "touch", "rm", "cat", "tail", "sed", "env")
TEST_ONLY = ("prometheus", "prometheus-node-exporter", "nginx-light", "libnginx-mod-http-lua", "chromium")


def run_functions(tmp_path: Path, calls: str) -> list[str]:
    """Source ./run on a bare PATH, call `calls` (bash), return the stubs' log lines."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir()
    for tool in BASIC:
        os.symlink(shutil.which(tool), bindir / tool)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for exe in ("python", "pip", "pyinfra", "ruff"):  # the venv's: log; `python -c "import ..."` fails (nothing installed)
        stub = venv / "bin" / exe
        stub.write_text(f'#!/bin/sh\necho "{exe} $*" >> "{log}"\n[ "$1" = -c ] && exit 1\nexit 0\n')
        stub.chmod(0o755)
    script = (f'apt-get() {{ echo "apt-get $*" >> "{log}"; }}\n'
              f'systemctl() {{ echo "systemctl $*" >> "{log}"; }}\n'
              f'python3() {{ echo "python3 $*" >> "{log}"; }}\n'
              f'source ./run\nVENV="{venv}" PY="{venv}/bin/python"\n{calls}\n')
    env = {"PATH": str(bindir), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    done = subprocess.run([shutil.which("bash"), "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_sourcing_run_runs_nothing(tmp_path):
    assert run_functions(tmp_path, "true") == []


def test_the_demo_installs_only_what_the_demo_runs(tmp_path):
    calls = run_functions(tmp_path, "setup_demo; artifacts_demo")
    text = "\n".join(calls)
    assert not [line for line in calls if line.startswith("apt-get")], text
    assert not any(pkg in text for pkg in TEST_ONLY), text
    assert "pip install -q -e ." in calls, text  # qwen27b and pyinfra, without the test extra
    assert ".[test]" not in text, text
    assert "chat_page" not in text, text  # the chat page's 736 MiB wheelhouse: the e2e tier's alone
    assert "python -m qwen27b.tools.cpu_smoke wheelhouse" in calls and "python -m qwen27b.tools.cpu_smoke model" in calls


def test_the_tests_still_get_their_tools_extra_and_the_chat_page(tmp_path):
    calls = run_functions(tmp_path, "setup; artifacts")
    text = "\n".join(calls)
    for pkg in ("prometheus", "prometheus-node-exporter", "nginx-light", "chromium"):
        assert any(line.startswith("apt-get install") and f" {pkg}" in line for line in calls), (pkg, text)
    assert "pip install -q -e .[test]" in calls, text
    assert "python -m qwen27b.tools.chat_page wheelhouse" in calls, text


def test_the_fast_tier_lints_then_runs_the_plans_folder_beside_the_unit_folder(tmp_path):
    """`./run tests fast` (issue 50): ruff first, then the folders whose marker is `fast`
    (tests/conftest.py TIERS), the caller's arguments passed to both."""
    calls = run_functions(tmp_path, "fast_tier -k gate")
    assert calls[0] == "ruff check --quiet .", calls
    assert sorted(calls[1:]) == ["python -m pytest -q -p no:cacheprovider -m fast and not e2e tests/plans -k gate",
                                 "python -m pytest -q -p no:cacheprovider -m fast and not e2e tests/unit -k gate"], calls


@pytest.mark.parametrize("args", [["up"], ["up", "1"], ["up", "x"], ["down", "pytest-1"]])
def test_up_and_down_refuse_bad_arguments_before_touching_anything(args):
    done = subprocess.run([str(ROOT / "run"), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: ./run" in done.stderr, done.stdout + done.stderr


def test_down_without_a_name_stops_only_the_demo_and_the_lab(tmp_path):
    calls = run_functions(tmp_path, "main down")
    downs = [line for line in calls if "tests.support.testhosts" in line]
    assert downs == ["python -m tests.support.testhosts --profile demo down",
                     "python -m tests.support.testhosts --profile lab down"], calls


def test_the_demo_end_to_end_installs_nothing_of_the_tests(tmp_path):
    """`./run demo` as a whole: the test host booted (profile demo) beside the artifacts, the deploy,
    the summary; no apt-get, no test extra, no chat page."""
    calls = run_functions(tmp_path, "main demo")
    text = "\n".join(calls)
    assert not [line for line in calls if line.startswith("apt-get")] and ".[test]" not in text, text
    assert "chat_page" not in text, text
    for expected in ("python -m tests.support.testhosts --profile demo up", "python -m qwen27b.tools.cpu_smoke model",
                     "pyinfra inventory/testhost.py deploy.py -y", "python -m qwen27b.tools.demo_summary"):
        assert expected in calls, (expected, text)
    assert calls.index("pyinfra inventory/testhost.py deploy.py -y") > max(
        calls.index("python -m tests.support.testhosts --profile demo up"), calls.index("python -m qwen27b.tools.cpu_smoke model"))


def test_up_boots_linked_hosts_in_the_lab_profile_and_writes_the_inventory(tmp_path):
    calls = run_functions(tmp_path, "main up 3")
    assert "python -m tests.support.testhosts --profile lab up -n 3 --link-peers" in calls, calls
    assert calls[-1] == "python -m tests.support.testhosts --profile lab lab-inventory inventory/testlab", calls
    assert not [line for line in calls if line.startswith("apt-get")], calls
