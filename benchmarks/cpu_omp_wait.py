#!/usr/bin/env python3
"""vLLM on the CPU smoke profile: OpenMP threads that spin after each parallel region, or sleep.

torch's CPU build uses GNU OpenMP (libgomp): with ``OMP_WAIT_POLICY`` unset its threads spin up to
300,000 times after every parallel region before they sleep. A 135M model's decode step is hundreds
of tiny regions, so an engine serving requests keeps every core it has busy, also between regions.
On the e2e tier's 2 shared cores (issue 31) the other test hosts' engines, installs and the
controller then wait for that spinning. ``OMP_WAIT_POLICY=PASSIVE`` lets the threads sleep at once.

    .venv/bin/python benchmarks/cpu_omp_wait.py                 # 2 rounds, each mode once per round
    .venv/bin/python benchmarks/cpu_omp_wait.py --rounds 3 --requests 12

Per mode and round, one server (``cpu_build.serve_command`` / ``serve_env``, the unit tier's server,
with the check venv and tiny model) answers the same work twice: alone, then beside a competing
CPU-bound job (a pure-Python loop, one per core, standing in for the other hosts' work). Reported:
wall seconds for the work, CPU seconds the server's processes used for it, and how many loop
iterations per second the competing job got (more: the engine left more CPU to others). Each round
runs every mode back to back, rotating which goes first. A benchmark that prints a table, not a
test: nothing fails on a slow machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from qwen27b.controller import cpu_build as cb  # noqa: E402
from qwen27b.tools import cpu_smoke as cs  # noqa: E402
from qwen27b.tools.cpu_smoke.check import descendants  # noqa: E402

MODES = {"spin (libgomp's default)": {}, "sleep (OMP_WAIT_POLICY=PASSIVE)": {"OMP_WAIT_POLICY": "PASSIVE"},
         "one thread (OMP_NUM_THREADS=1)": {"OMP_NUM_THREADS": "1"}}
PROMPT = ("A small lab shares one server with four used V100 cards. Write five short sentences on "
          "what its part-time administrator should note before the next driver upgrade.")
HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (their own threads included), in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / HZ


def work(base: str, requests: int, tokens: int) -> None:
    """`requests` completions, two at a time (as verify and the health probes overlap on a host)."""
    def one(i: int) -> None:
        r = httpx.post(f"{base}/v1/completions", timeout=300,
                       json={"model": "m", "prompt": f"{i}. {PROMPT}", "max_tokens": tokens, "ignore_eos": True})
        r.raise_for_status()
    for i in range(0, requests, 2):
        threads = [threading.Thread(target=one, args=(j,)) for j in range(i, min(i + 2, requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def measured(base: str, pids: list[int], requests: int, tokens: int) -> tuple[float, float]:
    """The work alone: (wall s, server CPU s)."""
    cpu0, t0 = cpu_seconds(pids), time.monotonic()
    work(base, requests, tokens)
    return time.monotonic() - t0, cpu_seconds(pids) - cpu0


def one_round(env_extra: dict, work_dir: Path, requests: int, tokens: int) -> dict:
    cache = cs.cache_root()
    venv, model = cache / "check" / "venv", cs.default_model_dir(cache)
    port = cs.free_port()
    argv = cb.serve_command(str(venv), str(model), "m", "127.0.0.1", port)
    base = {k: v for k, v in cb.serve_env(str(work_dir / "cache")).items() if k not in cb.ONE_OMP_THREAD_ENV}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work_dir), **base, **env_extra}
    log = work_dir / f"serve-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=work_dir)
    try:
        start_s = cs.wait_health(f"http://127.0.0.1:{port}", proc, log, timeout=300)
        base = f"http://127.0.0.1:{port}"
        work(base, 2, 4)  # warm
        pids = [proc.pid, *descendants(proc.pid)]
        alone = measured(base, pids, requests, tokens)
        beside = measured_beside(base, pids, requests, tokens)
        return {"start_s": start_s, "alone": alone, "beside": beside}
    finally:
        cs.stop_server(proc)


def measured_beside(base: str, pids: list[int], requests: int, tokens: int) -> tuple[float, float, float]:
    """The work beside one CPU-bound loop per core: (wall s, server CPU s, the loops' CPU share)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        hog_cpu0, cpu0, t0 = cpu_seconds([h.pid for h in hogs]), cpu_seconds(pids), time.monotonic()
        work(base, requests, tokens)
        wall = time.monotonic() - t0
        cpu, hog_cpu = cpu_seconds(pids) - cpu0, cpu_seconds([h.pid for h in hogs]) - hog_cpu0
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return wall, cpu, hog_cpu / (wall * (os.cpu_count() or 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="cpu-omp-") as tmp:
        for round_ in range(args.rounds):
            order = list(MODES)[round_ % len(MODES):] + list(MODES)[:round_ % len(MODES)]
            for mode in order:
                r = one_round(MODES[mode], Path(tmp), args.requests, args.tokens)
                results[mode].append(r)
                print(f"round {round_ + 1}: {mode}: /health after {r['start_s']:.1f} s; alone {r['alone'][0]:.1f} s wall / {r['alone'][1]:.1f} s CPU; "
                      f"beside loops {r['beside'][0]:.1f} s wall / {r['beside'][1]:.1f} s CPU, "
                      f"loops got {r['beside'][2]:.0%} of the cores", flush=True)
    print(f"\n{args.requests} completions of {args.tokens} tokens, two at a time (medians of {args.rounds} rounds)")
    print(f"{'mode':34} | /health s | alone: wall s | CPU s | beside loops: wall s | CPU s | loops' share")
    print("-" * 34 + "-+-----------+---------------+-------+----------------------+-------+-------------")
    for mode, rows in results.items():
        med = lambda part, i: statistics.median(r[part][i] for r in rows)  # noqa: E731
        start = statistics.median(r["start_s"] for r in rows)
        print(f"{mode:34} | {start:9.1f} | {med('alone', 0):13.1f} | {med('alone', 1):5.1f} | {med('beside', 0):20.1f} | "
              f"{med('beside', 1):5.1f} | {med('beside', 2):11.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
