"""Toolchain: base packages, the service user, directories, Python for the release venv."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def toolchain(decision: Decision) -> None:
    py = decision.choice("python")
    not_implemented("toolchain", decision, [
        "apt base packages (build-essential, kernel headers, curl, ca-certificates, pciutils, git)",
        f"user {decision.stack.paths['service_user']}",
        f"python {py.value} ({py.action}: {py.reason})",
        f"venv {decision.stack.paths['releases']}/{decision.stack.stack_hash}/venv",
    ])
