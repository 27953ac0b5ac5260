"""The idle probe's decision (issue 56, item 2; qwen27b/onhost/idleprobe.py): a core frozen while idle
is named within a minute of the timer, and a probe that was late only because other requests ran is
never named hung. Progress readings come from recorded /metrics texts of the real CPU build
(tests/fixtures/vllm/: 24 tokens idle, 192 after a greedy run)."""

from __future__ import annotations

from qwen27b.onhost import contract
from qwen27b.onhost import health as hc
from qwen27b.onhost import idleprobe
from qwen27b.plan.settings import Settings
from qwen27b.plan.stack import load_stack
from tests.support.paths import ROOT

VLLM = ROOT / "tests" / "fixtures" / "vllm"
IDLE = hc.progress_reading((VLLM / "metrics-cpu-0.32.0.txt").read_text())
LATER = hc.progress_reading((VLLM / "metrics-cpu-0.32.0-ngram-1-after-greedy.txt").read_text())
LATE = {"ok": False, "latency_ms": None, "error": "ReadTimeout: timed out", "deadline_s": 20.0, "tokens": None}
BASE = {"url": "http://127.0.0.1:8000", "unit": "qwen27b.service", "health": {"status": 200, "latency_ms": 2.0},
        "models": {"status": 200, "ids": ["m"]}, "served_name": "m"}


def test_a_late_probe_on_an_unmoved_counter_is_a_frozen_engine():
    assert IDLE["tokens"] == 24.0 and LATER["tokens"] == 192.0
    judged = idleprobe.judge(LATE, IDLE, dict(IDLE))
    assert judged == LATE and idleprobe.frozen(judged)
    code, findings = hc.verdict({**BASE, "idle_probe": judged})
    assert code == contract.CRITICAL and findings[0]["kind"] == contract.ENGINE_STALLED_FINDING
    # /metrics unreadable after the probe: nothing explains the silence, the probe stands
    assert idleprobe.frozen(idleprobe.judge(LATE, IDLE, None))


def test_a_late_probe_while_the_counter_moved_is_busy_not_frozen():
    judged = idleprobe.judge(LATE, IDLE, LATER)
    assert not idleprobe.frozen(judged) and "moved 24 -> 192" in judged["busy"]
    assert hc.verdict({**BASE, "idle_probe": judged}) == (contract.OK, [])
    ok = {**LATE, "ok": True, "error": None, "latency_ms": 40.0}
    assert idleprobe.judge(ok, IDLE, LATER) == ok and not idleprobe.frozen(ok) and not idleprobe.frozen(None)


def test_the_stack_names_a_frozen_idle_engine_within_a_minute():
    """Frozen right after a good probe: the next run that probes comes `idle_probe_every_s` later,
    at the timer's next tick, and fails `idle_probe_deadline_s` after."""
    live = load_stack()["profiles"]["sm70"]["serve"]["liveness"]
    interval = Settings().health_interval_s
    assert live["idle_probe_every_s"] <= interval  # every idle run probes
    assert idleprobe.named_within_s(interval, live["idle_probe_every_s"], live["idle_probe_deadline_s"]) <= 60
    assert idleprobe.named_within_s(30, 300, 20) == 320  # the former default: five minutes
    assert idleprobe.named_within_s(30, 31, 20) == 80 and idleprobe.named_within_s(30, 30, 20) == 50
    assert hc.parse_args(["--url", "http://x"]).idle_probe_every_s == live["idle_probe_every_s"]


def test_the_probe_asks_one_token_of_a_one_character_prompt():
    assert idleprobe.probe_body("m") == {"model": "m", "prompt": ".", "max_tokens": 1, "temperature": 0}


def test_the_probe_is_due_every_idle_run_at_the_stacks_rate():
    live = load_stack()["profiles"]["sm70"]["serve"]["liveness"]
    every, interval = live["idle_probe_every_s"], Settings().health_interval_s
    memory = {**IDLE, "busy_since": None, "last_probe": {"time": 1000.0, "ok": True}}
    assert idleprobe.idle_probe_due(memory, 1000.0 + interval, every)  # the timer's next run
    assert not idleprobe.idle_probe_due({**memory, "running": 1.0}, 1000.0 + interval, every)  # busy: the counter
