"""What the roles share per host while a deploy is planned: notes printed as one block at the
end of the host's plan (no interleaving between hosts), the operations whose change means a
restart, and the symlink targets a rollback returns to."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host

from qwen27b.gate import Decision

ROLLBACK_DIR = "/etc/qwen27b/rollback"  # the running release's unit and env, kept while an upgrade is verified
_notes: dict[str, list[str]] = {}
_restart_ops: dict[str, list] = {}


def note(text: str) -> None:
    _notes.setdefault(host.name, []).append(text)


def take_notes() -> list[str]:
    return _notes.pop(host.name, [])


def api_key(decision: Decision) -> str | None:
    """The API key from the controller-side file named by qwen27b_api_key_file (never logged)."""
    path = decision.settings.api_key_file
    return Path(path).expanduser().read_text().strip() if path else None


def needs_restart(op) -> None:
    """Remember an operation whose change means the service must restart (weights, release)."""
    if op is not None:
        _restart_ops.setdefault(host.name, []).append(op)


def restart_needed() -> bool:
    return any(op.will_change for op in _restart_ops.pop(host.name, []))


_previous: dict[str, list[tuple[str, str]]] = {}


def remember_previous(link: str, target: str | None) -> None:
    """What a symlink pointed to before this deploy switched it: the rollback target."""
    if target:
        _previous.setdefault(host.name, []).append((link, target))


def previous_links() -> list[tuple[str, str]]:
    return _previous.pop(host.name, [])
