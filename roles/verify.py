"""Verify: readiness, /v1/models, a streamed completion, speculative acceptance."""

from __future__ import annotations

from qwen27b.gate import Decision

from ._pending import not_implemented


def verify(decision: Decision) -> None:
    address, port = decision.serve.value("--host"), decision.serve.value("--port")
    not_implemented("verify", decision, [f"wait for http://{address}:{port}/health, chat completion, acceptance rate"])
