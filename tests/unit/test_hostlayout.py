"""One host layout (issue 31): plan/hostlayout.HostLayout, made from the stack's `paths`, is where
every module asks a file's place on a host; no module looks a path up in the `paths` dict itself or
spells systemd's unit directory."""

from __future__ import annotations

import dataclasses
import re

import pytest

from qwen27b.plan.hostlayout import UNIT_DIR, HostLayout
from qwen27b.plan.lifecycle import release_record_file, rollback_dir
from qwen27b.plan.stack import api_key_env_file, health_status_file, load_stack, resolve_stack
from tests.support.paths import ROOT

REPO = ROOT
PATHS = load_stack()["paths"]
CODE = sorted([*(REPO / "qwen27b").rglob("*.py"), *(REPO / "roles").glob("*.py"),
               *(REPO / n for n in ("deploy.py", "rollback.py", "uninstall.py"))])
FIELDS = "|".join(f.name for f in dataclasses.fields(HostLayout))


def test_the_layout_holds_every_stack_path_and_nothing_else():
    assert {f.name for f in dataclasses.fields(HostLayout)} == set(PATHS)
    assert dataclasses.asdict(HostLayout.of(PATHS)) == PATHS


def test_the_derived_places():
    at = HostLayout.of(PATHS)
    assert (at.env_file, at.api_key_env_file, at.release_record, at.rollback_dir) == (
        "/etc/qwen27b/qwen27b.env", "/etc/qwen27b/api-key.env", "/etc/qwen27b/release.json", "/etc/qwen27b/rollback")
    assert (at.health_status, at.restart_request) == ("/var/lib/qwen27b/health.json", "/var/lib/qwen27b/health-restart.request")
    assert at.release_venv("abc") == "/opt/qwen27b/releases/abc/venv" and at.uv == "/opt/qwen27b/bin/uv"
    assert at.model_dir({"id": "org/name", "revision": "r1"}) == "/var/lib/qwen27b/models/org--name@r1"
    assert at.unit_file("qwen27b.service") == f"{UNIT_DIR}/qwen27b.service" == "/etc/systemd/system/qwen27b.service"
    assert at.instance_env_file("%i") == "/etc/qwen27b/qwen27b@%i.env"
    with pytest.raises(dataclasses.FrozenInstanceError):
        at.root = "/elsewhere"


def test_a_changed_root_moves_what_derives_from_it():
    """A stack override of `paths` moves every derived file with it (nothing derived is spelled alone)."""
    at = HostLayout.of({**PATHS, "config": "/srv/q/etc", "state": "/srv/q/state"})
    assert (at.release_record, at.api_key_env_file, at.health_status) == (
        "/srv/q/etc/release.json", "/srv/q/etc/api-key.env", "/srv/q/state/health.json")
    assert (release_record_file(dataclasses.asdict(at)), rollback_dir(dataclasses.asdict(at))) == (
        at.release_record, at.rollback_dir)
    assert (api_key_env_file(dataclasses.asdict(at)), health_status_file(dataclasses.asdict(at))) == (
        at.api_key_env_file, at.health_status)


def test_a_resolved_stack_carries_its_layout():
    stack = resolve_stack(load_stack(), "sm70")
    assert stack.layout == HostLayout.of(stack.paths)


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_looks_up_a_path_itself(path):
    if path.name == "hostlayout.py":
        return
    text = path.read_text()
    assert re.findall(rf"""paths\[['"]({FIELDS})['"]\]""", text) == []
    assert "/etc/systemd/system" not in text.replace("/etc/systemd/system/multi-user", "")
