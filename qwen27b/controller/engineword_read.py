"""The host read behind the engine's word against ours (qwen27b/plan/engineword.py): after the
install, verify asks the installed engine for its packaged SM70 profile, through on_host (the host's
sudo settings), with the one command engineword.show_command builds, and keeps the comparison with
the unit's flags in the host's row of the run report. Never fails the host: a read that got no
answer is said in one line like an engine without the module."""

from __future__ import annotations

from qwen27b.controller.remote import on_host
from qwen27b.plan import engineword


def read(host, venv: str, flags, draft: dict | None, state=None) -> dict:
    """EngineWord.as_json() for `host`'s engine in `venv` against `flags` (planner.Flag list)."""
    ok, output = on_host(host, engineword.show_command(venv), state=state)
    return engineword.judge(list(output.stdout_lines) if ok else [], flags, draft).as_json()


def report_text(results) -> str:
    """The verify report's section (each host's line and table; "" when no host was read), ending in a
    blank line like the verify table before it."""
    lines = [line for r in results for line in engineword.report_lines(r.host, r.engine_word)]
    return "\n".join(["--> the engine's packaged profile against each unit's flags", *lines, ""]) if lines else ""
