"""Issue 32: every command the project sends outside pyinfra's operations and facts goes through one
function, `qwen27b.controller.remote.on_host`, which applies the host's connector arguments (`_sudo`,
`_sudo_user`, `_su_user`...). Before, verify's rollback restore ran without sudo for the `admin`
account README recommends and failed silently.

The behaviour tests use pyinfra's real `@local` connector and the real `sudo` binary (`./run` installs
it): `_sudo_user: nobody` makes the effect visible as root. The e2e tier proves the same over SSH as
a non-root user (tests/e2e/test_deploy.py deploys its lab with `_sudo = True`).
"""

from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest

from qwen27b.controller import remote
from tests.support.paths import ROOT

# every folder of project code that runs on the controller (tests/ drive pyinfra themselves)
PROJECT = [ROOT / "qwen27b", ROOT / "roles", ROOT / "benchmarks", *ROOT.glob("*.py")]


def _calls_of(path: Path, name: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of every call `<anything>.name(...)` in the file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def walk(node, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == name):
                found.append((child.lineno, function))
            walk(child, inner)

    walk(tree, "<module>")
    return found


def _project_files() -> list[Path]:
    files = []
    for place in PROJECT:
        files += [place] if place.is_file() else sorted(place.rglob("*.py"))
    return files


def test_run_shell_command_is_called_only_by_on_host():
    calls = {f"{path.relative_to(ROOT)}:{line} in {function}()"
             for path in _project_files() for line, function in _calls_of(path, "run_shell_command")}
    allowed = {c for c in calls if c.startswith("qwen27b/controller/remote.py:") and c.endswith(" in on_host()")}
    assert len(allowed) == 1, f"on_host must be the one caller of run_shell_command: {sorted(calls)}"
    assert calls == allowed, ("send commands through qwen27b.controller.remote.on_host, which applies the "
                              f"host's sudo settings: {sorted(calls - allowed)}")


def test_the_scan_finds_a_call_where_there_is_one(tmp_path):
    """The rule above is not vacuous: a direct call in a role is found, with its function."""
    role = tmp_path / "role.py"
    role.write_text(textwrap.dedent("""
        from pyinfra import host

        def restore():
            ok, output = host.run_shell_command("systemctl daemon-reload")
    """))
    assert _calls_of(role, "run_shell_command") == [(5, "restore")]


needs_sudo = pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo is not installed (./run installs it)")


def _local(tmp_path, data: dict):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = [('@local', {data!r})]\n")
    return remote.load_inventory(str(inventory), cwd=str(tmp_path))


@needs_sudo
@pytest.mark.parametrize("data, user", [({}, "root"), ({"_sudo": True, "_sudo_user": "nobody"}, "nobody")])
def test_on_host_applies_the_hosts_sudo_settings(tmp_path, data, user):
    state, (host,) = _local(tmp_path, data)
    host.connect(raise_exceptions=True)
    ok, output = remote.on_host(host, "id -un", state=state)
    assert ok and output.stdout_lines == [user]
    # the tools' path (status, doctor, rollout) goes through it too
    assert remote.run_command(state, host, "id -un").stdout.strip() == user


@needs_sudo
def test_resolved_connector_arguments_win_and_options_pass_through(tmp_path):
    """The fact cache and the progress probe hand their own resolved arguments; options reach the connector."""
    state, (host,) = _local(tmp_path, {"_sudo": True, "_sudo_user": "nobody"})
    host.connect(raise_exceptions=True)
    ok, output = remote.on_host(host, "id -un", connector={}, _stdin="ignored")
    assert ok and output.stdout_lines == ["root"]
    ok, output = remote.on_host(host, "cat", state=state, _stdin="from stdin")
    assert ok and output.stdout_lines == ["from stdin"]
