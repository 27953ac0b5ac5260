"""CUDA toolkit from NVIDIA's repo, only where the vLLM build needs a compiler."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def cuda(decision: Decision) -> None:
    if not decision.gpus:
        not_implemented("cuda", decision, ["skip: no GPU in this profile"])
        return
    c = decision.choice("cuda")
    not_implemented("cuda", decision, [f"{c.action} {c.value} ({c.reason})"])
