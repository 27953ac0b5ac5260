"""The fresh-machine guard (tests/siteguard, issue 10) really hides the system interpreter's
site-packages, and leaves virtual environments alone. Run against the real base interpreter of
this venv: if the guard stopped working, the first test fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from tests.support.paths import ROOT, TESTS

GUARD = TESTS / "siteguard"
PROBE = ("import json, site, sys; "
         "print(json.dumps({'venv': sys.prefix != sys.base_prefix, 'path': sys.path, "
         "'sites': site.getsitepackages()}))")


def _base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def _probe(python: str, guard: bool) -> dict:
    import json
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONNOUSERSITE": "1"}
    if guard:
        env.update(PYTHONPATH=str(GUARD), QWEN27B_SITE_GUARD="1")
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)


def _site_entries(info: dict) -> list[str]:
    sites = [os.path.realpath(s) for s in info["sites"]]
    return [p for p in info["path"] if p and any(os.path.realpath(p).startswith(s) for s in sites)]


def test_guard_hides_the_system_site_packages():
    base = _probe(_base_python(), guard=False)
    assert not base["venv"]
    assert _site_entries(base), "the base interpreter shows no site-packages: nothing to hide, the test proves nothing"
    guarded = _probe(_base_python(), guard=True)
    assert _site_entries(guarded) == [], f"site-packages still on the guarded path: {_site_entries(guarded)}"
    # the standard library is still there
    assert any(Path(p, "json").is_dir() for p in guarded["path"] if p)


def test_guard_leaves_venvs_alone():
    guarded = _probe(sys.executable, guard=True)
    assert guarded["venv"]
    assert _site_entries(guarded), "a venv must keep its own site-packages"


def test_run_tests_arms_the_guard():
    """./run tests runs every tier under the guard (the same variables this test uses)."""
    text = (ROOT / "run").read_text()
    for needle in ("QWEN27B_SITE_GUARD=1", "PYTHONNOUSERSITE=1", "tests/siteguard"):
        assert needle in text
