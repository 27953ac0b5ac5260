"""A lab's own unit on our unit names (issue 52 item 1): a hand-written `qwen27b.service` in systemd's unit dir
(an older vLLM on 0.0.0.0:8000 holding the GPUs) is not ours, though its name is. Ours is what the deploy
rendered: every unit template's first line says "# Rendered by qwen27b" (templates/). A unit file named
`qwen27b*` without it is the lab's: the gate refuses the host naming the unit, its ExecStart and the fix,
before anything is installed, since the deploy would overwrite it and restart it with no copy kept.

`qwen27b_take_over_unit: true` says the admin means it: the deploy keeps a copy of each such unit and its
EnvironmentFile(s) (root-only, under the state dir's `takeover/`, with a `restore.sh` written from the
plan), stops and disables it, then installs ours; `qwen27b rollback` (with no earlier release of ours to go
back to) and `qwen27b uninstall` run `restore.sh`: the unit and env files back, daemon-reload, enabled and
started as they were.

The UnitFiles fact (controller/facts.py) runs `units_command`; `parse_unit_files` reads it (pure), and
`foreign` / `take_over_commands` / `restore_commands` decide.
"""

from __future__ import annotations

import re
import shlex
from typing import NamedTuple

from qwen27b.plan.hostfacts_parse import FactParseError, numbered_lines

MARKER = "# Rendered by qwen27b"  # the first line of every unit the deploy renders (templates/*.j2)
SETTING = "qwen27b_take_over_unit"
_UNIT = re.compile(r"qwen27b[A-Za-z0-9@._-]*\.(?:service|socket|timer)")
_PATH = re.compile(r"/[A-Za-z0-9@._+/-]+")
_HEAD = re.compile(r"^== unit (?P<unit>\S+)(?: (?P<enabled>\S+))?(?: (?P<active>\S+))?$")
_SECRET = re.compile(r"(--api-key[= ]\s*|API_KEY=)\S+")


class Unit(NamedTuple):
    """One unit file named qwen27b* in the unit dir: its first line, ExecStart (continuations joined),
    EnvironmentFile paths (a leading '-': optional), `systemctl is-enabled` / `is-active`."""

    name: str
    first: str
    exec_start: str
    env_files: tuple
    enabled: str
    active: str

    @property
    def ours(self) -> bool:
        return self.first.startswith(MARKER)


def units_command(unit_dir: str, kept_dir: str) -> str:
    """The UnitFiles fact's command: for each qwen27b* unit file, a head line (name, is-enabled,
    is-active), its first line and its ExecStart= / EnvironmentFile= lines (with continuations; no
    other line: a hand-written unit may set a key in Environment=); then the kept take-over's manifest."""
    awk = r"""{p = (NR == 1 || c || $0 ~ /^[ \t]*(ExecStart|EnvironmentFile)=/); c = p && /\\$/; if (p) print}"""
    return (f"for f in {shlex.quote(unit_dir)}/qwen27b*.service {shlex.quote(unit_dir)}/qwen27b*.socket "
            f"{shlex.quote(unit_dir)}/qwen27b*.timer; do [ -f \"$f\" ] || continue; u=${{f##*/}}; "
            'e=$(systemctl is-enabled "$u" 2>/dev/null); a=$(systemctl is-active "$u" 2>/dev/null); '
            'echo "== unit $u ${e:-unknown} ${a:-unknown}"; '
            f"awk {shlex.quote(awk)} \"$f\"; done; echo '== kept'; cat {shlex.quote(kept_dir)}/manifest 2>/dev/null; true")


def parse_unit_files(output: list[str]) -> dict | None:
    """{"units": [Unit as a dict], "kept": [manifest lines]}; None for no output (not read)."""
    lines = numbered_lines(output)
    if not lines:
        return None
    found: dict = {"units": [], "kept": []}
    current, kept = None, False
    for n, line in lines:
        head = _HEAD.match(line.strip())
        if head and _UNIT.fullmatch(head["unit"]):
            current, kept = {"name": head["unit"], "first": None, "exec": [], "env": [],
                             "enabled": head["enabled"] or "unknown", "active": head["active"] or "unknown"}, False
            found["units"].append(current)
            continue
        if line.strip() == "== kept":
            current, kept = None, True
            continue
        if kept:
            found["kept"].append(line.strip())
            continue
        if current is None:
            raise FactParseError("UnitFiles", n, "'== unit qwen27b<...>.service <enabled> <active>' first", line)
        if current["first"] is None:
            current["first"] = line.rstrip()
            continue
        text = line.strip()
        if text.startswith("EnvironmentFile="):
            current["env"].append(text.split("=", 1)[1].strip())
        else:  # ExecStart= or one of its continuation lines
            current["exec"].append(text.split("=", 1)[1] if text.startswith("ExecStart=") else text)
    found["units"] = [Unit(u["name"], u["first"] or "", " ".join(p.rstrip("\\").strip() for p in u["exec"]),
                           list(u["env"]), u["enabled"], u["active"])._asdict() for u in found["units"]]
    return found


def _units(fact: dict | None) -> list[Unit]:
    return [Unit(**u) for u in (fact or {}).get("units", [])]


def shown(exec_start: str) -> str:
    """ExecStart for a plan or a refusal: an API key given on the command line is never printed."""
    return _SECRET.sub(lambda m: m[1] + "<redacted>", exec_start)[:300] or "(no ExecStart)"


def foreign(fact: dict | None) -> list[Unit]:
    """The unit files on our unit names that the deploy did not render."""
    return [u for u in _units(fact) if not u.ours]


def _env_path(entry: str) -> str:
    return entry[1:] if entry.startswith("-") else entry


def foreign_units(fact: dict | None, take_over: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """(refusals as (cause, fix), plan lines): each foreign unit refused, or with take-over, said."""
    refusals, lines = [], []
    for unit in foreign(fact):
        said = f"{unit.name} ({unit.enabled}, {unit.active}; ExecStart={shown(unit.exec_start)})"
        bad = [p for p in map(_env_path, unit.env_files) if not _PATH.fullmatch(p)]
        if not take_over:
            refusals.append((f"{said} is not a unit qwen27b rendered (its first line is not '{MARKER}...'): the deploy "
                             "would overwrite it and restart it, and the lab's server would be gone with no copy kept",
                             f"stop and move it away yourself (`sudo systemctl disable --now {unit.name}` and rename "
                             f"the file), or set {SETTING}: true to have the deploy keep a copy of it and its env "
                             "file, stop and disable it, and put it back on `qwen27b rollback` / `qwen27b uninstall`"))
        elif bad:
            refusals.append((f"{said}: its EnvironmentFile {', '.join(bad)} is not a plain path the take-over can copy",
                             f"write the path out in {unit.name}, or move the unit away yourself and leave {SETTING} out"))
        else:
            lines.append(f"take over {said}: a copy of it and its env file(s) kept, it is stopped and disabled, and "
                         f"`qwen27b rollback` / `uninstall` put it back ({SETTING})")
    return refusals, lines


def _lines_to(path: str, lines: list[str]) -> str:
    return f"printf '%s\\n' {' '.join(shlex.quote(line) for line in lines)} > {shlex.quote(path)}"


def take_over_commands(fact: dict | None, unit_dir: str, kept_dir: str) -> list[str]:
    """The deploy's take-over, before our unit is written: copies (root-only), restore.sh, then each
    foreign unit stopped and disabled. restore.sh runs from its own directory (it may be moved)."""
    units = foreign(fact)
    if not units:
        return []
    stop = f"systemctl disable --now {' '.join(shlex.quote(u.name) for u in units)}"
    if fact.get("kept"):  # taken over by a deploy that failed before ours was written: its copy (and the
        return [stop]     # state it recorded, enabled and running) stands; this one found it stopped
    k = shlex.quote(kept_dir)
    out = [f"install -d -m 0700 -o root -g root {k} {k}/units {k}/env"]
    restore = ["set -e", 'cd "$(dirname "$0")"']
    manifest, n = [], 0
    for unit in units:
        src = f"{unit_dir}/{unit.name}"
        out.append(f"cp -a {shlex.quote(src)} {k}/units/{shlex.quote(unit.name)}")
        restore.append(f"cp -a units/{shlex.quote(unit.name)} {shlex.quote(src)}")
        manifest.append(f"unit {unit.name} {unit.enabled} {unit.active}")
        for entry in unit.env_files:
            path, optional = _env_path(entry), entry.startswith("-")
            copy = f"{k}/env/{n}"
            out.append(f"if [ -e {shlex.quote(path)} ]; then cp -a {shlex.quote(path)} {copy}; fi" if optional
                       else f"cp -a {shlex.quote(path)} {copy}")
            restore.append(f"if [ -e env/{n} ]; then mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')} && "
                           f"cp -a env/{n} {shlex.quote(path)}; fi")
            manifest.append(f"env {n} {path}")
            n += 1
    restore.append("systemctl daemon-reload")
    for unit in units:
        if unit.enabled == "enabled":
            restore.append(f"systemctl enable {shlex.quote(unit.name)}")
        if unit.active in ("active", "activating", "reloading"):
            restore.append(f"systemctl start {shlex.quote(unit.name)}")
    out += [_lines_to(f"{kept_dir}/restore.sh", restore), f"chmod 0700 {k}/restore.sh",
            _lines_to(f"{kept_dir}/manifest", manifest)]
    out.append(stop)
    return out


def restore_commands(kept_dir: str, ours: list[str]) -> list[str]:
    """Put the taken-over units back (rollback, uninstall): ours stopped and disabled first, then the
    kept restore.sh, then the kept copies removed (they are back in place)."""
    k = shlex.quote(kept_dir)
    return [f"for u in {' '.join(shlex.quote(u) for u in ours)}; do systemctl disable --now \"$u\" 2>/dev/null || true; done",
            f"sh {k}/restore.sh", f"rm -rf {k}"]
