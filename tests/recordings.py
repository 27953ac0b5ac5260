"""Facts of recorded machines, parsed by the real fact classes (no pyinfra run needed)."""

from __future__ import annotations

from pathlib import Path

from qwen27b.controller import facts as F
from qwen27b.controller.gate_facts import build_host_facts
from qwen27b.plan.gate import HostFacts

HOSTS_DIR = Path(__file__).parent / "fixtures" / "hosts"
NOCMD = "##PYINFRA_NOCMD##"


def _read(host: str, fact_cls):
    path = HOSTS_DIR / host / F.SNAPSHOT_NAMES[fact_cls]
    if not path.exists():
        return fact_cls.default()
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines == [NOCMD] or not [line for line in lines if line.strip()]:
        return fact_cls.default()
    return fact_cls().process(lines)


def recorded_facts(host: str, **replace) -> HostFacts:
    """HostFacts for a recorded host, with optional fields replaced (a variation of a real box)."""
    return build_host_facts(lambda cls: _read(host, cls), **replace)
