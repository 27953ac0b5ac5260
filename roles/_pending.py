"""Per-host plan notes, printed as one block at the end of the host's plan (no interleaving
between hosts), and the honest placeholder for roles not built yet: no fake success."""

from __future__ import annotations

from pyinfra import host

from qwen27b.gate import Decision

_notes: dict[str, list[str]] = {}
_restart_ops: dict[str, list] = {}


def note(text: str) -> None:
    _notes.setdefault(host.name, []).append(text)


def take_notes() -> list[str]:
    return _notes.pop(host.name, [])


def not_implemented(role: str, decision: Decision, would: list[str]) -> None:
    note(f"{role}: not implemented yet (next issue) - would: {'; '.join(would) if would else 'nothing'}")


def needs_restart(op) -> None:
    """Remember an operation whose change means the service must restart (weights, release)."""
    _restart_ops.setdefault(host.name, []).append(op)


def restart_needed() -> bool:
    return any(op.will_change for op in _restart_ops.pop(host.name, []))
