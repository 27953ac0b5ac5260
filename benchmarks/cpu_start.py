#!/usr/bin/env python3
"""vLLM's start on the CPU smoke profile: the worker in its own process, or in the engine core's.

Every e2e deploy, restart, rollout and rollback waits for one ``vllm serve`` start on the test
machines' 2 cores (issue 31: ~35 of them per run). vLLM's CPU platform spawns a worker process
beside the engine core, which imports torch and vLLM a third time; with
``--distributed-executor-backend uni`` and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the stack's
``cpu-smoke`` profile, [cpu-uni-executor]) the worker runs inside the engine core.

    .venv/bin/python benchmarks/cpu_start.py               # 2 rounds, each mode once per round
    .venv/bin/python benchmarks/cpu_start.py --rounds 3 --tokens 128

Uses the controller cache's check venv and tiny model (``./run tests`` or ``python -m
qwen27b.tools.cpu_smoke check`` builds them) and ``cpu_build.serve_command`` / ``serve_env``, the
unit tier's server. Each round runs both modes back to back (alternating which goes first), so a
noisy neighbour hits both alike. Reported per start: seconds to /health 200, the processes under
the server, and one ``--tokens``-token completion (ignore_eos) right after. A benchmark that
prints a table, not a test: nothing fails on a slow machine.
"""

from __future__ import annotations

import argparse
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
from qwen27b.tools import cpu_smoke as cs  # noqa: E402
from qwen27b.tools.cpu_smoke.check import descendants  # noqa: E402

MODES = {
    "three processes (vLLM's default)": False,
    "two processes (uni, the profile)": True,
}


def one_start(one_process: bool, work: Path, tokens: int) -> tuple[float, int, float]:
    """(seconds to /health, processes under the server, seconds for one completion)."""
    cache = cs.cache_root()
    venv, model = cache / "check" / "venv", cs.default_model_dir(cache)
    port = cs.free_port()
    argv = cb.serve_command(str(venv), str(model), "m", "127.0.0.1", port)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), **cb.serve_env(str(work / "cache"))}
    if not one_process:
        at = argv.index(cb.ONE_PROCESS_WORKER_FLAG[0])
        del argv[at:at + 2]
        for name in cb.ONE_PROCESS_WORKER_ENV:
            env.pop(name)
    log = work / f"serve-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        started = cs.wait_health(f"http://127.0.0.1:{port}", proc, log, timeout=300)
        processes = 1 + len(descendants(proc.pid))  # the API server and everything under it
        t0 = time.monotonic()
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                           json={"model": "m", "prompt": "Once upon a time", "max_tokens": tokens,
                                 "ignore_eos": True})
        reply.raise_for_status()
        return started, processes, time.monotonic() - t0
    finally:
        cs.stop_server(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, int, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="cpu-start-") as tmp:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                result = one_start(MODES[mode], Path(tmp), args.tokens)
                results[mode].append(result)
                print(f"round {round_ + 1}: {mode}: /health {result[0]:.1f} s, {result[1]} processes, "
                      f"{args.tokens} tokens {result[2]:.2f} s", flush=True)
    print(f"\n{'mode':34} | {'/health (s), each':20} | median | processes | {args.tokens} tokens (s), each")
    print("-" * 34 + "-+-" + "-" * 20 + "-+--------+-----------+" + "-" * 24)
    for mode, rows in results.items():
        starts = ", ".join(f"{r[0]:.1f}" for r in rows)
        decodes = ", ".join(f"{r[2]:.2f}" for r in rows)
        print(f"{mode:34} | {starts:20} | {statistics.median(r[0] for r in rows):6.1f} | "
              f"{rows[0][1]:9} | {decodes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
