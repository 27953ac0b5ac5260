"""One deploy at a time per host: a lock file in /run (gone after a reboot) naming its holder.

The holder is `controller=<name> pid=<pid> start=<process start ticks> user=<user> since=<time>`.
A second deploy while the holder runs is refused, naming the holder and what to do. A holder
that is gone (Ctrl-C, a dropped SSH session, a failed operation: the lock is only released at
the end of a deploy that got there) is stale when the lock says it ran on this controller and
that process no longer exists; the next deploy takes the lock over and says so. A lock from
another controller is never broken automatically: only its owner knows it is dead.

Taking the lock is one shell command (noclobber create, or replace the exact stale content), so
two deploys that both saw "no lock" in their facts still cannot both get it.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass

from qwen27b.plan.lifecycle import LOCK_DIR

LOCK_FILE = f"{LOCK_DIR}/deploy.lock"
_FIELD = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class Holder:
    controller: str
    pid: int
    start: str  # the process's start time in clock ticks since boot (/proc/PID/stat field 22)
    user: str
    since: str

    def line(self) -> str:
        return (f"controller={self.controller} pid={self.pid} start={self.start} user={self.user} "
                f"since={self.since}")

    def describe(self) -> str:
        return f"pid {self.pid} of {self.user} on controller {self.controller}, since {self.since}"


def process_start(pid: int) -> str | None:
    """Start time of a local process (clock ticks since boot), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def me() -> Holder:
    """This deploy: the controller process running pyinfra."""
    return Holder(socket.gethostname(), os.getpid(), process_start(os.getpid()) or "?", getpass.getuser(),
                  time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def parse(text: str | None) -> Holder | None:
    """The lock file's content -> Holder; None when empty. Unreadable content still names itself."""
    if not text or not text.strip():
        return None
    fields = dict(_FIELD.findall(text))
    try:
        return Holder(fields["controller"], int(fields["pid"]), fields.get("start", "?"), fields.get("user", "?"),
                      fields.get("since", "?"))
    except (KeyError, ValueError):
        return Holder("unknown", 0, "?", "?", text.strip()[:80])


def is_stale(holder: Holder, controller: str, start_of=process_start) -> bool:
    """Stale: taken by a process of this controller that no longer runs (pid gone or reused)."""
    return holder.controller == controller and holder.pid > 0 and start_of(holder.pid) != holder.start


def take_command(owner: Holder, stale: Holder | None) -> str:
    """Create the lock, or replace exactly the stale content we decided to take over; else fail."""
    line, path = shlex.quote(owner.line()), LOCK_FILE
    replace = ""
    if stale is not None:
        replace = (f'elif [ "$(cat {path})" = {shlex.quote(stale.line())} ]; then '
                   f"printf '%s\\n' {line} > {path}.new && mv -f {path}.new {path}; ")
    return (f"mkdir -p {LOCK_DIR} && if ( set -C; printf '%s\\n' {line} > {path} ) 2>/dev/null; then :; "
            f"{replace}"
            f"else echo \"qwen27b: another deploy holds {path}: $(cat {path})\" >&2; exit 1; fi")


def release_command(owner: Holder) -> str:
    """Remove the lock only if it is still ours."""
    return (f"if [ \"$(cat {LOCK_FILE} 2>/dev/null)\" = {shlex.quote(owner.line())} ]; then rm -f {LOCK_FILE}; fi")


def refusal(host: str, holder: Holder) -> tuple[str, str]:
    """(cause, fix) for a host whose lock another live deploy holds."""
    cause = f"another deploy is running on this host ({holder.describe()}; {LOCK_FILE})"
    fix = (f"wait for it to finish; if it is not running any more, remove the lock: ssh {host} rm {LOCK_FILE}"
           if holder.controller != socket.gethostname() else
           f"wait for it to finish (pid {holder.pid} on this controller)")
    return cause, fix
