"""Recorded host outputs -> `fake_responses` for a pyinfra `@fake` host.

A recorded host is a directory (tests/fixtures/hosts/<name>/) holding, for each fact in
qwen27b.controller.facts, the output of its command in the file SNAPSHOT_NAMES names:

- file present: the fact's command answers with the file's lines, split as pyinfra's connectors
  split a real host's output (at each newline only: a carriage return or an escape sequence the
  host printed stays in the line); an empty file answers with empty output, which pyinfra turns
  into the fact's default;
- file holding the single line ``##PYINFRA_NOCMD##``: the fact's `requires_command` binary is
  absent on that machine (that is what pyinfra's guard prints), so pyinfra returns the default;
- file absent and named in ``not-recorded.txt`` (a line ``FILE  why``): deliberately absent, the
  command answers with empty success output (the fact's default), as the @fake connector does;
- file absent and not named there: the command FAILS, its stderr naming the fact and the file, so
  pyinfra reports "could not load fact" and fails the host: a plan of a recorded host never passes
  on an answer nobody recorded (issue 57).

An optional ``extra.yaml`` adds responses for pyinfra's own facts (or anything else), after the
facts, since the connector takes the first matching key:

    - match: "uname -m"        # substring of the command, or a regex with regex: true
      regex: false
      stdout: [x86_64]
      success: true            # optional, default true; stderr: [...] is optional too

README.md and any other file or directory are ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from qwen27b.controller import facts as F
from qwen27b.controller import host_facts as H
from qwen27b.controller.facts import ALL_FACTS, SNAPSHOT_NAMES

EXTRA_FILE = "extra.yaml"
# The facts a recorded host deliberately does not answer: one line each, the snapshot file name
# and why ("# ..." lines are comments).
NOT_RECORDED_FILE = "not-recorded.txt"
# Answers every recorded machine gives alike (all are x86_64 Linux), for pyinfra's built-in facts;
# a host's own extra.yaml comes first and wins.
COMMON_FILE = "linux-common.yaml"


def command_pattern(command: str) -> re.Pattern:
    """A fixed command, alone or as the body of pyinfra's requires_command guard
    (`if command -v X >/dev/null 2>&1; then ( CMD ); else echo '##PYINFRA_NOCMD##'; fi`)."""
    return re.compile(r"(?:^|\( )" + re.escape(command) + r"(?:$| \);)")


# The @fake connector's key for each fact whose command is built from its arguments (or too long to
# match whole); a fact with a fixed `_command` is answered by that command (fake_match). The
# connector matches a str as a substring and an re.Pattern with .search() against the command.
FAKE_MATCH: dict[type, re.Pattern] = {
    F.DiskFree: re.compile(r'; df -P -B1 "\$p"(?:$| \);)'),
    F.ModelsOnDisk: re.compile(r"b=\$\(du -sb -- \"\$d\" \| cut -f1\)"),
    H.FileHashes: re.compile(r"python3 -c .*qwen27b-hashes\.json", re.S),
    H.VenvPackages: re.compile(re.escape(H.LIST_DISTRIBUTIONS)),
    H.SymlinkTarget: re.compile(r"^readlink .+ 2>/dev/null \|\| true$"),
    H.Subdirectories: re.compile(r"-mindepth 1 -maxdepth 1 -type d -printf '%T@ %f\\n'"),
    H.DirectoryStates: re.compile(r"^stat -c '%a %U %G %F' -- "),
    H.ServiceUser: re.compile(r"^getent passwd .+ && id -gn .+ \|\| true$"),
    H.DeployLock: re.compile(r"^cat .+ 2>/dev/null \|\| true$"),
    H.SecretFileState: re.compile(r"^if \[ -f .+ \]; then stat -c '%U %G %a' "),
    H.ReleaseRecords: re.compile(r"python3 -c .*kept_dir = sys\.argv", re.S),
    H.DeployedState: re.compile(r"^for p in .*; do if \[ -e \"\$p\" \]"),
    H.InstalledCopies: re.compile(r"qwen27b-health@\*\.timer .*; do \[ -e \"\$f\" \] \|\| \[ -L \"\$f\" \]"),
    F.UnitFiles: re.compile(r"qwen27b\*\.timer; do \[ -f \"\$f\" \] \|\| continue; u=\$\{f##\*/\}"),
}


def fake_match(fact: type) -> re.Pattern:
    """The `fake_responses` key that answers `fact`'s command on a pyinfra @fake host."""
    return FAKE_MATCH[fact] if fact in FAKE_MATCH else command_pattern(fact._command)


def fake_responses(host_dir: Path) -> dict:
    """The `fake_responses` host data for the recorded host in `host_dir`."""
    answer_scripts()
    host_dir = Path(host_dir)
    if not host_dir.is_dir():
        raise FileNotFoundError(f"no recorded host directory: {host_dir}")

    responses: dict = {}
    absent = not_recorded(host_dir)
    for fact in ALL_FACTS:
        recorded = host_dir / SNAPSHOT_NAMES[fact]
        if recorded.is_file():
            responses[fake_match(fact)] = connector_lines(recorded.read_bytes().decode("utf-8"))
        elif SNAPSHOT_NAMES[fact] not in absent:
            responses[fake_match(fact)] = {"success": False, "stderr": [
                f"recorded host {host_dir.name}: no recording of fact {fact.__name__} ({SNAPSHOT_NAMES[fact]}): "
                f"record it from the machine, or name it in {NOT_RECORDED_FILE} with the reason"]}

    for extra in (host_dir / EXTRA_FILE, host_dir.parent / COMMON_FILE):
        if not extra.is_file():
            continue
        entries = yaml.safe_load(extra.read_text(encoding="utf-8")) or []
        if not isinstance(entries, list):
            raise ValueError(f"{extra}: expected a list of {{match, regex, stdout, success}}")
        for number, entry in enumerate(entries, 1):
            if not isinstance(entry, dict) or not isinstance(entry.get("match"), str):
                raise ValueError(f"{extra}: entry {number}: expected a mapping with a 'match' string")
            key = re.compile(entry["match"]) if entry.get("regex") else entry["match"]
            response = {"stdout": _lines(entry.get("stdout")), "success": bool(entry.get("success", True))}
            if entry.get("stderr") is not None:
                response["stderr"] = _lines(entry["stderr"])
            responses.setdefault(key, response)
    return responses


_SECTION = re.compile(r"^echo '@@(\w+)@@ BEGIN (\S+)'\n\( (.*?)\n\) </dev/null 2>/dev/null\nprintf '[^\n]*\n", re.S | re.M)


def answer_scripts() -> None:
    """Make @fake hosts answer a batched fact read (qwen27b.controller.remote.script, as
    factcache.prefetch sends it) section by section, each command by the recorded answers, as a
    real shell would: pyinfra's FakeConnector alone answers a whole command by its first matching
    key, and the batch would fall back to one read per fact."""
    from pyinfra.connectors.fake import FakeConnector
    from pyinfra.connectors.util import CommandOutput, OutputLine

    if getattr(FakeConnector, "qwen27b_answers_scripts", False):
        return
    lookup = FakeConnector._lookup_response

    def lookup_sections(self, command_str: str):
        sections = _SECTION.findall(command_str)
        if not sections:
            return lookup(self, command_str)
        lines = []
        for nonce, key, command in sections:
            ok, output = lookup(self, command)
            lines += [f"@@{nonce}@@ BEGIN {key}", *output.stdout_lines, "", f"@@{nonce}@@ END {key} {0 if ok else 1}"]
        return True, CommandOutput([OutputLine("stdout", line) for line in lines])

    FakeConnector._lookup_response = lookup_sections
    FakeConnector.qwen27b_answers_scripts = True


def not_recorded(host_dir: Path) -> dict[str, str]:
    """{snapshot file name: why} from the host's NOT_RECORDED_FILE; a name that is no fact's file,
    or a file that is there after all, is an error (a typo would hide a fact)."""
    path = Path(host_dir) / NOT_RECORDED_FILE
    if not path.is_file():
        return {}
    names = set(SNAPSHOT_NAMES.values())
    absent = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, why = line.strip().partition(" ")
        if name not in names:
            raise ValueError(f"{path}: line {number}: {name!r} is no fact's snapshot file ({', '.join(sorted(names))})")
        if (Path(host_dir) / name).is_file():
            raise ValueError(f"{path}: line {number}: {name} is recorded after all: drop the line")
        if not why.strip():
            raise ValueError(f"{path}: line {number}: say why {name} is not recorded")
        absent[name] = why.strip()
    return absent


def connector_lines(text: str) -> list[str]:
    """Output text as pyinfra's connectors hand it to a fact: a line per newline (nothing else
    splits a line), the last newline ending the last line."""
    if text == "":
        return []
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def recorded_facts(host_dir: Path) -> list[type]:
    """The fact classes that have a recording in `host_dir`."""
    return [fact for fact in ALL_FACTS if (Path(host_dir) / SNAPSHOT_NAMES[fact]).is_file()]


def _lines(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.splitlines()
    return [str(line) for line in value]

