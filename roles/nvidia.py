"""NVIDIA driver: the stack's branch and package, nouveau blacklisted, held, persistence on."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def nvidia(decision: Decision) -> None:
    if not decision.gpus:
        not_implemented("nvidia", decision, ["skip: no GPU in this profile"])
        return
    drv = decision.choice("driver")
    not_implemented("nvidia", decision, [f"{drv.action} {drv.value} ({drv.reason})", "apt-mark hold the driver"])
