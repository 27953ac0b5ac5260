"""Shared by every part of the test hosts: the error, logging, subprocess, files, locks, paths."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path


class TestHostsError(RuntimeError):
    """Anything that stops the test hosts from coming up or going down cleanly."""

    __test__ = False  # not a pytest test class


def log(msg: str) -> None:
    print(f"[testhosts] {msg}", file=sys.stderr, flush=True)


def _run(argv, check=True, capture=True, timeout=None, input=None, env=None):  # noqa: A002 (subprocess.run's name)
    """subprocess.run with text output; raises TestHostsError with stderr on failure."""
    try:
        cp = subprocess.run(
            argv, check=False, text=True, input=input, timeout=timeout, env=env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        raise TestHostsError(f"timed out after {timeout}s: {shlex.join(map(str, argv))}") from e
    if check and cp.returncode != 0:
        raise TestHostsError(
            f"command failed (rc={cp.returncode}): {shlex.join(map(str, argv))}\n"
            f"{(cp.stderr or '').strip()}\n{(cp.stdout or '').strip()}".rstrip()
        )
    return cp



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-64000:].decode(errors="replace")
    except OSError:
        return "(no console log)"
    return "\n".join(data.splitlines()[-lines:])



def require_root() -> None:
    if os.geteuid() != 0:
        raise TestHostsError(
            "test hosts need root (network namespaces, veth pairs, systemd-nspawn, debootstrap); "
            "run as root, e.g. `sudo python3 -m tests.support.testhosts up`"
        )



def cache_dir() -> Path:
    return Path(os.environ.get("QWEN27B_CACHE") or Path.home() / ".cache" / "qwen27b").absolute()



def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)



@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) if path.exists() else str(path)
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return out


def _rm_root(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    for mp in sorted(_mounts_under(path), key=len, reverse=True):
        _run(["umount", "-l", mp], check=False)
    if _mounts_under(path):
        raise TestHostsError(f"refusing to delete {path}: still has mounts under it")
    _run(["rm", "-rf", "--one-file-system", str(path)], timeout=300)
