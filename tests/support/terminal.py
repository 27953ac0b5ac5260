"""Run a command on a pseudo-terminal and keep what it drew: how the progress lines are tested
with the real CLI (tests/unit/slow/test_progress.py, tests/e2e/test_deploy.py). Stdlib only."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_a_terminal(argv: list[str], env: dict, cwd: Path, columns: int = 160, timeout: float = 1500,
                      log: Path | None = None) -> tuple[int, str]:
    """argv with stdin, stdout and stderr on a pseudo-terminal `columns` wide; (exit code, the
    transcript as the terminal received it, escape sequences included), also written to `log`."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:  # nothing for `timeout` seconds: stop it
            proc.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer of the slave side is gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    transcript = b"".join(chunks).decode("utf-8", "replace")
    if log is not None:
        log.write_text(transcript)
    return proc.wait(timeout=60), transcript


def plain(transcript: str) -> str:
    """The transcript as lines of text: escape sequences gone, CRLF (the terminal's) as LF."""
    return ANSI.sub("", transcript).replace("\r\n", "\n").replace("\r", "\n")
