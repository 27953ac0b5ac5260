"""Model weights at a pinned revision, verified, activated by an atomic symlink switch."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def weights(decision: Decision) -> None:
    m = decision.choice("model")
    not_implemented("weights", decision, [f"{m.value} -> {decision.model_path} ({m.reason})"])
