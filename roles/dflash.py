"""DFlash2 draft weights (kept fp16/bf16) for speculative decoding."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def dflash(decision: Decision) -> None:
    if decision.draft_path is None:
        not_implemented("dflash", decision, ["skip: speculative decoding off or no draft in this profile"])
        return
    d = decision.choice("draft")
    not_implemented("dflash", decision, [f"{d.value} -> {decision.draft_path} ({d.reason})"])
