"""How many examples a property test draws: its own count in the full tiers, a tenth of it (at least
10) under `./run tests fast` (QWEN27B_FAST=1, the edit-run loop), where a quick signal matters more."""

import os


def examples(n: int) -> int:
    return max(10, n // 10) if os.environ.get("QWEN27B_FAST") else n
