"""The helpers we start (tinyproxy, socat, the nspawn supervisors): found and stopped by PID only,
with a command-line marker against PID reuse."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def _proc_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    """True if PID runs (not a zombie) and, when given, its command line contains marker
    (guards against PID reuse)."""
    if not pid:
        return False
    _reap(pid)
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    if marker is not None:
        cmd = _proc_cmdline(pid)
        return cmd is not None and marker in cmd
    return True


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
                kids += [int(x) for x in text.split()]
    except OSError:
        pass
    return kids


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in _children(p):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _wait_gone(pids, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not any(pid_alive(p) for p in pids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def stop_pid(pid: int | None, marker: str | None, grace: float = 5.0) -> None:
    """SIGTERM, wait, SIGKILL: one process we started, identified by PID (+ marker)."""
    if not pid_alive(pid, marker):
        _reap(pid or 0)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_gone([pid], grace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone([pid], 5)
    _reap(pid)


def _spawn(argv, logfile: Path, cwd=None) -> int:
    """Start a long-running helper detached from our session; returns its PID."""
    with open(logfile, "ab") as out:
        p = subprocess.Popen(
            [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=cwd,
        )
    return p.pid
