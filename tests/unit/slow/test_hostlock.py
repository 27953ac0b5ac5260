"""The host deploy lock: who holds it, when it is stale, the one-command take-over, and what a
deploy does with a held or stale lock on a recorded (@fake) host. The real race (two deploys
against one real host) is tests/e2e/test_faults.py."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from qwen27b.controller import hostlock
from tests.support.dryrun import run_pyinfra

ALICE = hostlock.Holder("lab-admin", 4242, "981234", "alice", "2026-12-02T17:40:01+0000")


def test_holder_line_round_trips_and_garbage_still_names_itself():
    assert hostlock.parse(ALICE.line()) == ALICE
    assert hostlock.parse("") is None and hostlock.parse("  \n") is None
    odd = hostlock.parse("someone wrote this by hand")
    assert odd.controller == "unknown" and "by hand" in odd.describe()


def test_stale_only_when_our_controller_has_no_such_process():
    ours = hostlock.me()
    assert not hostlock.is_stale(ours, ours.controller)  # this very process runs
    gone = hostlock.Holder(ours.controller, ours.pid, "1", ours.user, ours.since)  # pid reused
    assert hostlock.is_stale(gone, ours.controller)
    assert hostlock.is_stale(ALICE, "lab-admin", start_of=lambda pid: None)  # no such pid
    assert not hostlock.is_stale(ALICE, "another-controller", start_of=lambda pid: None)  # never break others'


@pytest.fixture
def lockdir(tmp_path, monkeypatch):
    """The lock commands run for real by sh, in a temp dir instead of /run/qwen27b."""
    monkeypatch.setattr(hostlock, "LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(hostlock, "LOCK_FILE", str(tmp_path / "deploy.lock"))
    return tmp_path / "deploy.lock"


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_take_is_exclusive_take_over_needs_the_exact_stale_content_and_release_only_removes_ours(lockdir):
    me, other = hostlock.me(), ALICE
    assert sh(hostlock.take_command(me, None)).returncode == 0
    assert lockdir.read_text() == me.line() + "\n"
    second = sh(hostlock.take_command(other, None))
    assert second.returncode == 1 and f"another deploy holds {lockdir}: {me.line()}" in second.stderr
    assert sh(hostlock.take_command(other, ALICE)).returncode == 1  # ALICE is not who holds it
    assert sh(hostlock.release_command(other)).returncode == 0 and lockdir.exists()  # not theirs to remove
    assert sh(hostlock.take_command(other, me)).returncode == 0 and lockdir.read_text() == other.line() + "\n"
    assert sh(hostlock.release_command(other)).returncode == 0 and not lockdir.exists()


def _locked_inventory(tmp_path, line: str):
    inventory = tmp_path / "locked.py"
    inventory.write_text(
        "from inventory.recorded import _fake\n"
        "name, data = _fake('v100x4-converged')\n"
        f"data['fake_responses']['cat /run/qwen27b/deploy.lock'] = [{line!r}]\n"
        "hosts = [(name, data), _fake('v100x1-2004')]\n")
    return inventory


def test_a_held_lock_refuses_that_host_only(tmp_path):
    """@fake hosts fed recorded output, plus a lock line held by another controller's deploy."""
    result = run_pyinfra(str(_locked_inventory(tmp_path, ALICE.line())), "deploy.py", "--dry", "-y")
    out = result.stderr
    assert result.returncode == 1
    assert ("cause: another deploy is running on this host (pid 4242 of alice on controller lab-admin, "
            "since 2026-12-02T17:40:01+0000; /run/qwen27b/deploy.lock)") in out
    assert "fix:   wait for it to finish; if it is not running any more, remove the lock: " \
           "ssh @fake/v100x4-converged rm /run/qwen27b/deploy.lock" in out
    assert re.search(r"^@fake/v100x1-2004\s+planned", out, re.M)  # the other host goes on
    assert "--limit @fake/v100x4-converged" in out


def test_a_stale_lock_of_this_controller_is_taken_over(tmp_path):
    dead = hostlock.Holder(socket.gethostname(), 2**22 + 7, "1", "root", "2026-12-02T09:00:00+0000")
    assert hostlock.process_start(dead.pid) is None
    result = run_pyinfra(str(_locked_inventory(tmp_path, dead.line())), "deploy.py", "--dry", "-y")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"lock: the deploy that held this host (pid {dead.pid} of root" in result.stderr
    assert "is gone (interrupted?): taking its lock over" in result.stderr
