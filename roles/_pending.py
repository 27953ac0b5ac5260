"""Per-host plan notes, printed as one block at the end of the host's plan (no interleaving
between hosts), and the honest placeholder for roles not built yet: no fake success."""

from __future__ import annotations

from pyinfra import host

from qwen27b.gate import Decision

_notes: dict[str, list[str]] = {}


def note(text: str) -> None:
    _notes.setdefault(host.name, []).append(text)


def take_notes() -> list[str]:
    return _notes.pop(host.name, [])


def not_implemented(role: str, decision: Decision, would: list[str]) -> None:
    note(f"{role}: not implemented yet (next issue) - would: {'; '.join(would) if would else 'nothing'}")
