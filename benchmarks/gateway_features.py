#!/usr/bin/env python3
"""What issue 28's gateway features add per request, side by side in one run, on loopback: the
gateway's nginx as the role renders it, in front of one stand-in backend that answers at once
(the stub of tests/test_gateway.py, with a usage object), so the time measured is nginx's own.

    .venv/bin/python benchmarks/gateway_features.py [--requests 400] [--rounds 3]

Ways, each its own nginx, in the same order each round:
- plain: no Lua module, no limits, plain HTTP (the gateway as it was before issue 28, less the
  request log's JSON shape and the key's name in the map, which cost nothing measurable);
- usage+limits: nginx's Lua module counting each response's usage, a key with a rate, a
  concurrency limit and a daily budget (all far above the load, so nothing is refused);
- usage+limits+TLS: the same over TLS (the lab CA's certificate; one client connection kept
  alive, so the handshake is paid once, as an SDK client pays it).
For each: GET /v1/models and POST /v1/chat/completions one at a time, p50 and p99 in ms, and the
difference with plain. A benchmark that prints a table, not a test; 2 shared cores: run it alone.
"""

from __future__ import annotations

import argparse
import ssl
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from qwen27b.plan.gateway import Backend, Client, GatewayPlan, Tls  # noqa: E402
from tests.support.gateway_lab import free_port, running_nginx  # noqa: E402
import test_gateway as T  # noqa: E402  (its stub backend and key files)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(client: httpx.Client, method: str, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        answer = client.request(method, url, json={} if method == "POST" else None)
        out.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, (url, answer.status_code, answer.text[:200])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qwen27b-gwfeat-"))
    keys = {"backend": T.key_file(work, "backend.key", "backend-key-0123"), "a": T.key_file(work, "a.key", "client-a-4567")}
    backend = T.stub("a")
    backends = (Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),)
    limited = (Client("team-a", keys["a"], requests_per_minute=60000, concurrent=100, tokens_per_day=10**9),)
    ways = {
        "plain": (GatewayPlan("gw", "127.0.0.1", free_port(), (keys["a"],), backends, keys["backend"], None, 600), False),
        "usage+limits": (GatewayPlan("gw", "127.0.0.1", free_port(), (keys["a"],), backends, keys["backend"], None, 600,
                                     clients=limited), True),
        "usage+limits+TLS": (GatewayPlan("gw", "127.0.0.1", free_port(), (keys["a"],), backends, keys["backend"], None,
                                         600, Tls(lab_ca_dir=str(work / "lab-ca")), clients=limited), True),
    }
    samples: dict[str, dict[str, list[float]]] = {w: {"GET": [], "POST": []} for w in ways}
    for _ in range(args.rounds):
        for way, (plan, usage) in ways.items():
            with running_nginx(plan, work / way.replace("+", "-"), T.nginx_binary(), usage=usage) as lb:
                verify = ssl.create_default_context(cafile=str(work / "lab-ca" / "ca.crt")) if plan.tls else True
                with httpx.Client(verify=verify, headers={"Authorization": "Bearer client-a-4567"}) as c:
                    timed(c, "GET", f"{lb['base']}/v1/models", 20)  # warm: connections, caches
                    samples[way]["GET"] += timed(c, "GET", f"{lb['base']}/v1/models", args.requests)
                    samples[way]["POST"] += timed(c, "POST", f"{lb['base']}/v1/chat/completions", args.requests)
    backend.shutdown()
    base = {m: pct(samples["plain"][m], 0.5) for m in ("GET", "POST")}
    print(f"\ngateway features, loopback, one stand-in backend; {args.rounds} rounds x {args.requests} requests each")
    print(f"{'way':<18} {'GET p50':>8} {'GET p99':>8} {'POST p50':>9} {'POST p99':>9} {'added p50 (GET/POST)':>22}")
    for way, got in samples.items():
        added = f"{pct(got['GET'], 0.5) - base['GET']:+.3f} / {pct(got['POST'], 0.5) - base['POST']:+.3f}"
        print(f"{way:<18} {pct(got['GET'], 0.5):8.3f} {pct(got['GET'], 0.99):8.3f} {pct(got['POST'], 0.5):9.3f} "
              f"{pct(got['POST'], 0.99):9.3f} {added:>22}")
    print("(ms; the stand-in answers in well under a millisecond, so this is nginx's own time per request)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
