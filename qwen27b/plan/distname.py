"""PEP 503's distribution name: the one spelling every comparison of wheel, pin and venv uses."""

import re


def normalize(name: str) -> str:
    """`1Cat_vLLM`, `1cat.vllm` and `1cat-vllm` are one project (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
