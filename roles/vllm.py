"""vLLM: the stack's build for this GPU generation, into a versioned release venv."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def vllm(decision: Decision) -> None:
    v = decision.choice("vllm")
    would = [f"{v.action} {v.value} ({v.reason})"]
    if any(c.what == "torch" for c in decision.choices):
        t = decision.choice("torch")
        would.append(f"torch {t.value} ({t.reason})")
    not_implemented("vllm", decision, would)
