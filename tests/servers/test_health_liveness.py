"""The health check's watch on the engine's forward progress (issue 26, part 1): vLLM's API process
answers /health and /v1/models while its engine core is hung (vLLM #39863), so the check reads
/metrics' request gauges and token counter, and proves an idle engine with a 1-token completion
(idleprobe.py), at every idle run of the timer: a core frozen while idle is named within a minute.

The pure parts run on recorded /metrics texts of the real CPU build (tests/fixtures/vllm/). The
fault is real at the end: the session's real `vllm serve` (conftest.vllm_server) has its engine-core
process frozen with SIGSTOP (found by PID as a child of the server, resumed with SIGCONT in a
finally) while the installed qwen27b-health runs against it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx

from qwen27b.onhost import contract
from qwen27b.onhost import health as hc
from qwen27b.onhost.statusfile import _valid_status
from tests.support.health_check import cli, fakebin, venv  # noqa: F401 - the installed qwen27b-health, as test_health runs it
from tests.support.paths import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "vllm" / "metrics-cpu-0.32.0.txt"
AFTER = ROOT / "tests" / "fixtures" / "vllm" / "metrics-cpu-0.32.0-ngram-1-after-greedy.txt"


def _with(text: str, name: str, value: float) -> str:
    """The recorded text with one series' value changed (its labels and everything else as recorded)."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            line = line.rsplit(" ", 1)[0] + f" {value}"
        out.append(line)
    return "\n".join(out)


def test_progress_reading_from_the_real_cpu_build():
    assert hc.progress_reading(RECORDED.read_text()) == {"running": 0.0, "waiting": 0.0, "tokens": 24.0}
    assert hc.progress_reading(AFTER.read_text())["tokens"] == 192.0


def test_progress_reading_sums_engines_and_refuses_what_is_not_vllm():
    text = RECORDED.read_text()
    two = text + "\n" + "\n".join(line.replace('engine="0"', 'engine="1"') for line in text.splitlines()
                                  if line.startswith("vllm:generation_tokens_total{"))
    assert hc.progress_reading(two)["tokens"] == 48.0
    # `_by_reason` and `_created` series share a prefix, never the name
    assert "vllm:num_requests_waiting_by_reason" in text
    no_counter = "\n".join(line for line in text.splitlines() if "generation_tokens_total" not in line)
    assert hc.progress_reading(no_counter) is None
    assert hc.progress_reading("") is None
    assert hc.progress_reading("vllm:num_requests_running 3\nvllm:num_requests_waiting 0\n"
                               "vllm:generation_tokens_total 7 1700000000\n") == {"running": 3.0, "waiting": 0.0,
                                                                                 "tokens": 7.0}
    assert hc.progress_reading("vllm:generation_tokens_total{a=\"b\"} NaNx\n") is None


def test_a_busy_engine_on_an_unmoved_counter_is_stalled_after_the_bound():
    busy = hc.progress_reading(_with(RECORDED.read_text(), "vllm:num_requests_running", 2))
    stall, memory = hc.liveness(None, busy, now=1000.0, stall_after_s=120)
    assert stall is None and memory["busy_since"] == 1000.0  # first sight: counted from here
    stall, memory = hc.liveness(memory, busy, now=1090.0, stall_after_s=120)
    assert stall is None and memory["busy_since"] == 1000.0
    stall, memory = hc.liveness(memory, busy, now=1120.0, stall_after_s=120)
    assert stall == {**busy, "for_s": 120.0}


def test_progress_idle_or_a_restart_is_no_stall():
    text = RECORDED.read_text()
    busy = hc.progress_reading(_with(text, "vllm:num_requests_waiting", 5))
    _, memory = hc.liveness(None, busy, now=0.0, stall_after_s=60)
    moved = hc.progress_reading(_with(_with(text, "vllm:num_requests_waiting", 5), "vllm:generation_tokens_total", 99))
    stall, memory = hc.liveness(memory, moved, now=100.0, stall_after_s=60)
    assert stall is None and memory["busy_since"] == 100.0  # moved: counted again from now
    restarted = hc.progress_reading(_with(text, "vllm:num_requests_waiting", 5))  # counter back at 24
    stall, memory = hc.liveness(memory, restarted, now=200.0, stall_after_s=60)
    assert stall is None and memory["busy_since"] == 200.0
    idle = hc.progress_reading(text)
    stall, memory = hc.liveness(memory, idle, now=900.0, stall_after_s=60)
    assert stall is None and memory["busy_since"] is None
    kept = {"tokens": 1.0, "running": 0.0, "waiting": 0.0, "busy_since": None, "last_probe": None}
    assert hc.liveness(kept, None, now=5.0, stall_after_s=60) == (None, kept)  # nothing read: no judgement


def test_the_idle_probe_is_rate_limited_and_repeats_after_a_failure():
    idle = {"running": 0.0, "waiting": 0.0, "tokens": 24.0, "busy_since": None}
    assert hc.idle_probe_due({**idle, "last_probe": None}, now=10, every_s=300)
    assert not hc.idle_probe_due({**idle, "last_probe": {"time": 0, "ok": True}}, now=299, every_s=300)
    assert hc.idle_probe_due({**idle, "last_probe": {"time": 0, "ok": True}}, now=300, every_s=300)
    assert hc.idle_probe_due({**idle, "last_probe": {"time": 0, "ok": False}}, now=30, every_s=300)
    assert not hc.idle_probe_due({**idle, "running": 1.0, "last_probe": None}, now=10, every_s=300)
    assert not hc.idle_probe_due({**idle, "last_probe": None}, now=10, every_s=0)
    assert not hc.idle_probe_due(None, now=10, every_s=300)


def test_verdict_names_the_stall_with_its_counters_and_kind():
    base = {"url": "http://127.0.0.1:8000", "unit": "qwen27b.service", "health": {"status": 200, "latency_ms": 2.0},
            "models": {"status": 200, "ids": ["m"]}, "served_name": "m"}
    code, findings = hc.verdict({**base, "stall": {"running": 2.0, "waiting": 1.0, "tokens": 4096.0, "for_s": 130.0}})
    assert code == contract.CRITICAL and findings[0]["kind"] == contract.ENGINE_STALLED_FINDING
    assert "2 running and 1 waiting" in findings[0]["text"] and "stayed at 4096 for 130 s" in findings[0]["text"]
    code, findings = hc.verdict({**base, "idle_probe": {"ok": False, "error": "ReadTimeout: timed out",
                                                        "deadline_s": 20.0, "latency_ms": None}})
    assert code == contract.CRITICAL and "within 20 s (ReadTimeout" in findings[0]["text"]
    assert hc.verdict({**base, "idle_probe": {"ok": True, "latency_ms": 80.0, "error": None, "deadline_s": 20}}) == (
        contract.OK, [])


def test_a_status_file_with_a_broken_liveness_memory_starts_fresh():
    good = {"consecutive_failures": 0, "liveness": {"tokens": 3.0, "running": 0.0, "waiting": 0.0,
                                                    "busy_since": None, "last_probe": {"time": 1.0, "ok": True}}}
    assert _valid_status(good) is None
    for bad in ({"tokens": "3"}, {"tokens": 3.0, "busy_since": "x"}, {"tokens": 3.0, "last_probe": {"time": None}}, []):
        assert "liveness" in _valid_status({"consecutive_failures": 0, "liveness": bad})


def test_the_unit_passes_the_stacks_bounds_as_environment():
    from qwen27b.controller.render import liveness_env
    from qwen27b.plan.stack import load_stack
    bounds = load_stack()["profiles"]["sm70"]["serve"]["liveness"]
    assert liveness_env(bounds) == [(contract.STALL_AFTER_ENV, str(bounds["stall_after_s"])),
                                    (contract.IDLE_PROBE_EVERY_ENV, str(bounds["idle_probe_every_s"])),
                                    (contract.IDLE_PROBE_DEADLINE_ENV, str(bounds["idle_probe_deadline_s"]))]
    args = hc.parse_args(["--url", "http://x"])
    assert (args.stall_after_s, args.idle_probe_every_s, args.idle_probe_deadline_s) == (120, 20, 20)


# ============================================================================ a real frozen engine

def _engine_core(server_pid: int) -> int:
    """The PID of the server's engine-core process: a descendant whose name vLLM sets to
    VLLM::EngineCore (the kernel keeps 15 characters of it)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    todo, found = [server_pid], []
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                if (Path("/proc") / str(child) / "comm").read_text().startswith("VLLM::EngineCor"):
                    found.append(child)
            except OSError:
                pass
    assert len(found) == 1, f"engine core of {server_pid}: {found}"
    return found[0]


class _Frozen:
    """SIGSTOP the engine core for the block; SIGCONT whatever happens."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def test_a_frozen_idle_engine_is_named_within_a_minute_at_the_stacks_rate(cli, vllm_server):
    """Issue 56 item 2: the check runs as the timer runs it (every Settings.health_interval_s, the
    stack's idle-probe bounds: no override); the core frozen right after a good probe is named by
    the first run that probes again, within 60 s of the freeze, while /health answers throughout."""
    from qwen27b.plan.settings import Settings
    interval = Settings().health_interval_s
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    args = ["--url", vllm_server["url"], "--served-name", vllm_server["name"], "--api-key-file",
            vllm_server["key_file"], "--no-restart"]
    ticked = time.monotonic()
    rc, out, _, s = cli(*args)
    assert rc == 0 and s["idle_probe"]["ok"] and not s["stalled"], out  # a live engine answers the probe
    with _Frozen(_engine_core(vllm_server["pid"])):
        frozen_at = time.monotonic()
        rc, out, _, s = cli(*args)  # the last probe was fine and is recent: not due, no judgement yet
        assert rc == 0 and s["idle_probe"] is None
        runs = []
        while time.monotonic() - frozen_at < 90:
            ticked += interval
            time.sleep(max(0.0, ticked - time.monotonic()))
            rc, out, _, s = cli(*args)
            runs.append((round(time.monotonic() - frozen_at, 1), rc, s["idle_probe"]))
            if rc == 2:
                break
        named_s = time.monotonic() - frozen_at
    assert rc == 2 and s["health_status"] == 200 and s["stalled"], (out, runs)  # /health answered throughout
    assert named_s <= 60, f"named {named_s:.1f} s after the freeze: {runs}"
    assert [f["kind"] for f in s["findings"] if f.get("kind")] == [contract.ENGINE_STALLED_FINDING]
    assert "generates nothing" in out and "within 20 s" in out
    rc, out, _, s = cli(*args)  # resumed: the failed probe is repeated, and passes
    assert rc == 0 and s["idle_probe"]["ok"], out
    print(f"\nfrozen idle engine named {named_s:.1f} s after SIGSTOP (runs: {runs})")


def test_a_frozen_engine_under_load_is_named_stalled(cli, vllm_server):
    """Two streamed requests in flight; the engine frozen once both have produced a token."""
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    body = {"model": vllm_server["name"], "prompt": "Count slowly from one to one thousand:", "max_tokens": 400,
            "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {vllm_server['api_key']}"}
    started, results = threading.Semaphore(0), []

    def client():
        try:
            with httpx.Client(timeout=120, trust_env=False) as c, \
                    c.stream("POST", f"{vllm_server['url']}/v1/completions", json=body, headers=headers) as r:
                first = True
                for _ in r.iter_lines():
                    if first:
                        started.release()
                        first = False
            results.append(r.status_code)
        except httpx.HTTPError as e:
            results.append(repr(e))
            started.release()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    assert started.acquire(timeout=120) and started.acquire(timeout=120)
    args = ["--url", vllm_server["url"], "--served-name", vllm_server["name"], "--api-key-file",
            vllm_server["key_file"], "--no-restart", "--stall-after-s", "3"]
    with _Frozen(_engine_core(vllm_server["pid"])):
        time.sleep(1)  # the API process's last stats from the engine are in
        rc, out, _, first = cli(*args)
        time.sleep(3.5)
        rc, out, _, s = cli(*args)
    for t in threads:
        t.join(timeout=180)
    assert first["liveness"]["running"] + first["liveness"]["waiting"] >= 1, first["liveness"]
    assert first["idle_probe"] is None  # busy: progress is judged from the counter, no probe
    assert rc == 2 and s["stalled"] and s["health_status"] == 200, out
    stalled = [f for f in s["findings"] if f.get("kind") == contract.ENGINE_STALLED_FINDING]
    assert len(stalled) == 1 and "engine stalled" in stalled[0]["text"], s["findings"]
    assert f"stayed at {s['liveness']['tokens']:.0f}" in stalled[0]["text"]
    assert results == [200, 200]  # resumed, both finished
