"""systemd, as the health check sees and drives it: the unit's properties, and a restart either
queued directly or requested from the health unit's privileged ExecStopPost."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterable

from .contract import UNIT_PROPERTIES
from .statusfile import write_text_atomic

def show_argv(unit: str, properties: Iterable[str], value: bool = False) -> list[str]:
    """`systemctl show -p A,B [--value] UNIT`: the one way a unit's properties are asked for (the
    health check here; verify, doctor, status and the uninstall's fact from the controller), read
    back by parse_show (Key=Value lines) or, with `value`, as the bare values one per line."""
    return ["systemctl", "show", "-p", ",".join(properties), *(["--value"] if value else []), unit]


def show_command(unit: str, properties: Iterable[str], value: bool = False, expand: bool = False) -> str:
    """show_argv as a shell command, `unit` quoted; with `expand`, `unit` is a shell word the shell
    must expand (a loop's "qwen27b@$n.service") and is passed as it is."""
    *head, _ = show_argv(unit, properties, value)
    return f"{shlex.join(head)} {unit if expand else shlex.quote(unit)}"


def state_command(unit: str) -> str:
    """The unit's state on one line, as verify and its progress line say it: "activating/start"."""
    return f"{show_command(unit, ('ActiveState', 'SubState'), value=True)} | paste -sd/"


def invocation_word(unit: str) -> str:
    """The unit's current InvocationID as a shell word, to read this start's journal only
    (`journalctl _SYSTEMD_INVOCATION_ID=...`)."""
    return f"$({show_command(unit, ('InvocationID',), value=True)})"


# vLLM's access-log line of a /health probe: `INFO:     10.0.0.1:42322 - "GET /health HTTP/1.1" 200 OK`
PROBE_LINE = '"GET /health HTTP/1.1" 200'


def journal_tail_command(unit: str, lines: int = 80) -> str:
    """The unit's last `lines` journal lines for a report, less vLLM's access-log lines of /health
    probes, with their count: a gateway pool probes once a second, and a report's 80 lines then held
    nothing but probes (the cause of a failed restart was lost). Read from the last 2000 lines."""
    program = ('index($0, pat) { n++; next } { kept[k++ % max] = $0 } '
               'END { for (i = (k > max ? k - max : 0); i < k; i++) print kept[i % max]; '
               'if (n) print "(" n " lines of /health probes in the access log left out)" }')
    return (f"journalctl -u {unit} -n 2000 --no-pager | "
            f"awk -v pat={shlex.quote(PROBE_LINE)} -v max={int(lines)} {shlex.quote(program)}")


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p ...` output -> {property: value}; the first of a repeated key wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key not in out:
            out[key] = value
    return out


def unit_properties(unit: str) -> dict:
    """systemd's view of the unit (Key=Value from `systemctl show`); {} when unknown."""
    try:
        p = subprocess.run(show_argv(unit, UNIT_PROPERTIES), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_show(p.stdout) if p.returncode == 0 else {}


def restart_unit(unit: str) -> tuple[bool, str]:
    """``systemctl restart --no-block``: queue the job and return; the check never waits for a
    model load (the timer's TimeoutStartSec is far shorter)."""
    try:
        p = subprocess.run(["systemctl", "restart", "--no-block", unit],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"{type(e).__name__}: {e}"
    return p.returncode == 0, (p.stderr or p.stdout).strip()[-300:]


def request_restart(path: str, unit: str, reason: str) -> tuple[bool, str]:
    """The unprivileged route: leave the request in ``path`` for the health unit's root
    ExecStopPost (``+``: runs as root once this check has exited), which removes it and restarts
    the unit. The check itself then needs no privilege, polkit rule or capability."""
    try:
        write_text_atomic(path, reason + "\n")
    except OSError as e:
        return False, f"cannot write the restart request {path}: {e.strerror}"
    return True, f"requested in {path}; the health unit's ExecStopPost restarts {unit} as root"
