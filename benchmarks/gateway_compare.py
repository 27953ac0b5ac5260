#!/usr/bin/env python3
"""Two gateways side by side on the same traffic, on loopback: nginx's upstream module (as the
gateway role renders it, with qwen27b-gateway-pool) and vllm-router (PyPI, the Rust router), in
front of two real vLLM CPU servers (the check venv, SmolLM2-135M, each behind qwen27b's route
guard and a backend key).

    flock /tmp/qwen27b-heavy.lock .venv/bin/python benchmarks/gateway_compare.py
    ... --requests 60 --concurrency 4 --router-venv /tmp/vllm-router-venv

For each way in (direct: the client alternates between the two backends itself; nginx;
vllm-router) and in the same order each round:
- overhead: GET /v1/models one at a time (no model work: the proxy's own cost), p50/p99;
- load: `--requests` chat completions (max_tokens 16) at `--concurrency`, throughput and
  latency p50/p99; "added" is the difference with direct;
- failover: the same load for `--fail-window` s; after 3 s one backend's vLLM gets SIGKILL (by
  the PID this script started): failed requests (non-200 or a broken connection, no client
  retry), and the failover time (the kill to the end of the last failed request; 0 when none
  failed). The backend is started again before the next gateway.

vllm-router forwards the client's Authorization header to the backends as it is (it has no
key of its own for them, and no client keys but a validation URL): its client sends the backends'
key here. nginx holds the client keys and adds the backends' key (what the role deploys).
Needs nginx (`apt-get install nginx-light`), the check venv (`python -m qwen27b.tools.cpu_smoke
check`) and vllm-router (installed into --router-venv from PyPI when missing). A benchmark that
prints a table, not a test; 2 shared cores: run it under the heavy lock.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen27b.controller import cpu_build as cb  # noqa: E402
from qwen27b.onhost.contract import MIDDLEWARE  # noqa: E402
from qwen27b.plan.gateway import Backend, GatewayPlan  # noqa: E402
from qwen27b.tools import cpu_smoke as cs  # noqa: E402
from qwen27b.tools.cpu_smoke.check import descendants  # noqa: E402
from tests.support import onhost_lib  # noqa: E402
from tests.support.gateway_lab import render_scratch  # noqa: E402

BACKEND_KEY = "bench-backend-" + os.urandom(6).hex()
CLIENT_KEY = "bench-client-" + os.urandom(6).hex()
NAME = "smollm2-135m"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Backends:
    """Two `vllm serve` on loopback, as conftest's session server runs one (route guard, key)."""

    def __init__(self, work: Path):
        self.work, self.procs, self.ports = work, {}, [cs.free_port(), cs.free_port()]
        self.venv, self.model = cs.cache_root() / "check" / "venv", cs.default_model_dir(cs.cache_root())
        self.lib = work / "lib"
        onhost_lib.install(self.lib)

    def start(self, i: int) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.work),
               **cb.serve_env(str(self.work / f"cache{i}")), "VLLM_API_KEY": BACKEND_KEY, "PYTHONPATH": str(self.lib)}
        argv = cb.serve_command(str(self.venv), str(self.model), NAME, "127.0.0.1", self.ports[i]) + ["--middleware", MIDDLEWARE]
        log = self.work / f"serve{i}.log"
        with open(log, "ab") as fh:
            self.procs[i] = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=self.work)

    def wait(self, i: int) -> float:
        return cs.wait_health(self.url(i), self.procs[i], self.work / f"serve{i}.log", timeout=400)

    def kill(self, i: int) -> None:
        """SIGKILL the API server and its children (the engine core), by the PIDs started here."""
        kids = descendants(self.procs[i].pid)
        self.procs[i].kill()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs[i].wait()

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def stop(self) -> None:
        for proc in self.procs.values():
            cs.stop_server(proc)


def start_nginx(work: Path, backends: Backends, keys: Path) -> tuple[str, list[subprocess.Popen]]:
    """The role's files, rendered under a scratch root: nginx.conf, keys, the pool watcher."""
    (keys / "client.key").write_text(CLIENT_KEY + "\n")
    (keys / "backend.key").write_text(BACKEND_KEY + "\n")
    for f in keys.iterdir():
        f.chmod(0o600)
    port = cs.free_port()
    plan = GatewayPlan("bench", "127.0.0.1", port, (str(keys / "client.key"),),
                       tuple(Backend(f"b{i}", "127.0.0.1", p, p) for i, p in enumerate(backends.ports)),
                       str(keys / "backend.key"), NAME, 600)
    # the pool probes vLLM's /health on both ports: loopback has no qwen27b-health-http
    where = render_scratch(plan, work / "nginx-root")
    pool, env = where["pool"], where["env"]
    subprocess.run(pool + ["render"], env=env, check=True)
    procs = [subprocess.Popen(["nginx", "-c", where["config"]], stderr=open(work / "nginx.log", "ab")),
             subprocess.Popen(pool + ["watch"], env=env, stderr=open(work / "pool.log", "ab"))]
    return f"http://127.0.0.1:{port}", procs


def start_router(work: Path, backends: Backends, venv: Path) -> tuple[str, list[subprocess.Popen]]:
    if not (venv / "bin" / "vllm-router").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "vllm-router==0.1.17"], check=True)
    port = cs.free_port()
    # health checks every second, out after 2 failures, back after 2 successes: as qwen27b-gateway-pool
    argv = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
            *[backends.url(i) for i in range(2)], "--policy", "cache_aware", "--health-check-interval-secs", "1",
            "--health-failure-threshold", "2", "--health-success-threshold", "2", "--health-check-timeout-secs", "1",
            "--prometheus-port", str(cs.free_port())]
    return f"http://127.0.0.1:{port}", [subprocess.Popen(argv, stdout=open(work / "router.log", "ab"),
                                                          stderr=subprocess.STDOUT)]


def wait_up(base: str, key: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{base} did not answer /v1/models in {timeout:.0f} s")


BODY = {"model": NAME, "messages": [{"role": "user", "content": "Count from one to ten."}], "max_tokens": 16,
        "temperature": 0}


def load(bases: list[str], key: str, requests: int, concurrency: int, until: float | None = None) -> dict:
    """`requests` completions (or as many as fit before `until`) on `concurrency` threads; each
    thread alternates between `bases`. Returns latencies of the good ones and (start, end, why)
    of the failed ones."""
    lock, results = threading.Lock(), {"ok": [], "failed": [], "issued": 0}

    def worker(n: int) -> None:
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:
            i = 0
            while True:
                with lock:
                    if (until is None and results["issued"] >= requests) or (until and time.monotonic() >= until):
                        return
                    results["issued"] += 1
                base = bases[(n + i) % len(bases)]
                i += 1
                t0 = time.monotonic()
                try:
                    r = client.post(f"{base}/v1/chat/completions", json=BODY)
                    ok, why = r.status_code == 200, f"HTTP {r.status_code}"
                except httpx.HTTPError as error:
                    ok, why = False, type(error).__name__
                t1 = time.monotonic()
                with lock:
                    (results["ok"].append(t1 - t0) if ok else results["failed"].append((t0, t1, why)))

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results["wall"] = time.monotonic() - started
    return results


def overhead(bases: list[str], key: str, n: int = 200) -> list[float]:
    times = []
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {key}"}) as client:
        for i in range(n):
            t0 = time.perf_counter()
            client.get(f"{bases[i % len(bases)]}/v1/models").raise_for_status()
            times.append(time.perf_counter() - t0)
    return times


def failover(backends: Backends, bases: list[str], key: str, concurrency: int, window: float) -> dict:
    until = time.monotonic() + window
    box = {}
    runner = threading.Thread(target=lambda: box.update(load(bases, key, 0, concurrency, until=until)))
    runner.start()
    time.sleep(3)
    killed_at = time.monotonic()
    backends.kill(1)
    runner.join()
    failed = box["failed"]
    box["failover_s"] = max((end - killed_at for _, end, _ in failed), default=0.0)
    box["why"] = sorted({why for _, _, why in failed})
    return box


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--fail-window", type=float, default=15.0)
    parser.add_argument("--router-venv", type=Path, default=Path(tempfile.gettempdir()) / "qwen27b-vllm-router-venv")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    keys = work / "keys"
    keys.mkdir(mode=0o700)
    backends = Backends(work)
    rows, started = [], []
    try:
        for i in range(2):
            backends.start(i)
        for i in range(2):
            print(f"backend {i} ready in {backends.wait(i):.0f} s", file=sys.stderr)
        direct = [backends.url(0), backends.url(1)]
        load(direct, BACKEND_KEY, 8, args.concurrency)  # warm-up
        base_over = overhead(direct, BACKEND_KEY)
        base_load = load(direct, BACKEND_KEY, args.requests, args.concurrency)
        rows.append(("direct (client alternates)", base_over, base_load, None))
        for label, start, key in (("nginx + qwen27b-gateway-pool", lambda: start_nginx(work, backends, keys), CLIENT_KEY),
                                  ("vllm-router 0.1.17 (cache_aware)",
                                   lambda: start_router(work, backends, args.router_venv), BACKEND_KEY)):
            base, procs = start()
            started.extend(procs)
            wait_up(base, key)
            load([base], key, 8, args.concurrency)
            over, loaded = overhead([base], key), load([base], key, args.requests, args.concurrency)
            fail = failover(backends, [base], key, args.concurrency, args.fail_window)
            rows.append((label, over, loaded, fail))
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
            backends.start(1)
            print(f"{label}: done; backend 1 back in {backends.wait(1):.0f} s", file=sys.stderr)
    finally:
        for proc in started:  # SIGTERM: nginx's master takes its workers down with it
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        backends.stop()
    b50, b99 = pct(base_over, 0.5), pct(base_over, 0.99)
    l50, l99 = pct(base_load["ok"], 0.5), pct(base_load["ok"], 0.99)
    print(f"\n{args.requests} chat completions (max_tokens 16) at concurrency {args.concurrency}; /v1/models x200 "
          f"one at a time; failover: {args.fail_window:.0f} s of the same load, backend 1 SIGKILLed at 3 s\n")
    print(f"{'way in':34} {'req/s':>6} {'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} {'+p99 ms':>8} "
          f"{'models +p50/+p99 ms':>20} {'failed':>7} {'failover s':>10}")
    for label, over, loaded, fail in rows:
        o50, o99 = pct(over, 0.5), pct(over, 0.99)
        p50, p99 = pct(loaded["ok"], 0.5), pct(loaded["ok"], 0.99)
        failed = "-" if fail is None else f"{len(fail['failed'])}/{len(fail['failed']) + len(fail['ok'])}"
        fo = "-" if fail is None else f"{fail['failover_s']:.2f}"
        print(f"{label:34} {len(loaded['ok']) / loaded['wall']:6.2f} {p50 * 1e3:7.0f} {p99 * 1e3:7.0f} "
              f"{(p50 - l50) * 1e3:+8.0f} {(p99 - l99) * 1e3:+8.0f} "
              f"{f'{(o50 - b50) * 1e3:+.2f}/{(o99 - b99) * 1e3:+.2f}':>20} {failed:>7} {fo:>10}"
              + (f"  ({', '.join(fail['why'])})" if fail and fail["why"] else ""))
    print(f"\ndirect /v1/models p50/p99: {b50 * 1e3:.2f}/{b99 * 1e3:.2f} ms; load average {os.getloadavg()[0]:.1f}"
          + (" (>= 2: the machine was busy, figures are noisy)" if os.getloadavg()[0] >= 2 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
