#!/usr/bin/env python3
"""What issue 28's gateway features add per request, side by side in one run, on loopback: the
gateway's nginx as the role renders it, in front of one stand-in backend that answers at once
(the stub of tests/servers/test_gateway.py, with a usage object), so the time measured is nginx's own.

    .venv/bin/python benchmarks/gateway_features.py [--requests 400] [--rounds 3]

Ways, each its own nginx, in the same order each round:
- plain: no Lua module, no limits, plain HTTP (the gateway as it was before issue 28, less the
  request log's JSON shape and the key's name in the map, which cost nothing measurable);
- usage+limits: nginx's Lua module counting each response's usage, a key with a rate, a
  concurrency limit and a daily budget (all far above the load, so nothing is refused);
- usage+limits+TLS: the same over TLS (the lab CA's certificate; one client connection kept
  alive, so the handshake is paid once, as an SDK client pays it).
For each: GET /v1/models and POST /v1/chat/completions one at a time, p50 and p99 in ms, and the
difference with plain. Then what each costs in memory, the question a host's RAM asks of a
feature: its master and workers' RSS and PSS (PSS shares each page among the processes mapping it,
so it sums to what they take together), right after start and after the latency rounds' load, and
the shared-memory zones (the Lua module's dict, the limits' zones, TLS's session cache) as mapped
and as resident: nginx maps them whole but only touched pages cost RAM.
A benchmark that prints tables, not a test; 2 shared cores: run it alone.
"""

from __future__ import annotations

import argparse
import ssl
import statistics
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


def nginx_pids(pid_file: str) -> tuple[list[int], int]:
    """The master (its pid file) and its workers (the processes whose parent it is), and how many
    other nginx processes run here: they share its libraries' pages, which lowers its PSS."""
    master = int(Path(pid_file).read_text())
    children, others = [], 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, fields = stat.read_text().rsplit(")", 1)
        except OSError:
            continue  # a process gone meanwhile
        if int(fields.split()[1]) == master:  # ppid, after "(comm)"
            children.append(int(stat.parent.name))
        elif comm.endswith("(nginx") and int(stat.parent.name) != master:
            others += 1
    return [master, *sorted(children)], others


def rollup_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) kB of one process, from /proc/PID/smaps_rollup."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return int(fields["Rss"].split()[0]), int(fields["Pss"].split()[0])


def zones_kib(pid: int) -> tuple[int, int]:
    """nginx's shared zones (anonymous shared maps, "/dev/zero (deleted)") in one process: (mapped,
    PSS) kB. A zone's page is resident once, in the page tables of the processes that touched it, so
    their PSS summed over the processes is what the zones take."""
    sums = {"Size:": 0, "Pss:": 0}
    zone = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        first = line.split(" ", 1)[0]
        if not first.endswith(":"):  # a mapping's first line: addresses, mode, ..., path
            zone = line.endswith("/dev/zero (deleted)")
        elif zone and first in sums:
            sums[first] += int(line.split()[1])
    return sums["Size:"], sums["Pss:"]


def memory(pid_file: str) -> dict:
    """The master and its workers together: their count, RSS and PSS kB, the master's PSS alone (a
    gateway has a worker per core: the rest scales with its cores), the shared zones (mapped, PSS)."""
    pids, others = nginx_pids(pid_file)
    each = [rollup_kib(pid) for pid in pids]
    zones = [zones_kib(pid) for pid in pids]
    return {"processes": len(pids), "rss": sum(r for r, _ in each), "pss": sum(p for _, p in each),
            "master_pss": each[0][1], "zones": (zones[0][0], sum(p for _, p in zones)),
            "others": others}


def print_memory(memories: dict[str, dict[str, list[dict]]]) -> None:
    """The memory table: each figure the median over the rounds (each round a fresh nginx), MiB."""
    def mib(way: str, when: str, key: str, index: int | None = None) -> float:
        values = [m[key] if index is None else m[key][index] for m in memories[way][when]]
        return statistics.median(values) / 1024

    print(f"\n{'way':<18} {'procs':>5} {'RSS idle':>9} {'RSS load':>9} {'PSS idle':>9} {'PSS load':>9} "
          f"{'PSS added (idle/load)':>22} {'load: master + workers':>23} {'zones mapped/resident':>22}")
    for way, got in memories.items():
        added = f"{mib(way, 'idle', 'pss') - mib('plain', 'idle', 'pss'):+.2f} / " \
                f"{mib(way, 'load', 'pss') - mib('plain', 'load', 'pss'):+.2f}"
        zones = f"{mib(way, 'load', 'zones', 0):.2f} / {mib(way, 'load', 'zones', 1):.2f}"
        workers = got["load"][-1]["processes"] - 1
        split = f"{mib(way, 'load', 'master_pss'):.2f} + {workers} x " \
                f"{(mib(way, 'load', 'pss') - mib(way, 'load', 'master_pss')) / workers:.2f}"
        print(f"{way:<18} {got['load'][-1]['processes']:>5} {mib(way, 'idle', 'rss'):9.2f} {mib(way, 'load', 'rss'):9.2f} "
              f"{mib(way, 'idle', 'pss'):9.2f} {mib(way, 'load', 'pss'):9.2f} {added:>22} {split:>23} {zones:>22}")
    print("(MiB; master and workers together; idle: right after start, load: after the latency rounds;\n"
          " PSS sums to what they take together, RSS counts shared pages once per process; master + workers:\n"
          " their PSS after load; zones: nginx's shared memory, mapped whole, resident (PSS) only where touched)")
    others = max(m["others"] for way in memories.values() for when in way.values() for m in when)
    if others:
        print(f"WARNING: {others} other nginx processes ran meanwhile: they share its libraries, so PSS was lower")


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
    memories: dict[str, dict[str, list[dict]]] = {w: {"idle": [], "load": []} for w in ways}
    for _ in range(args.rounds):
        for way, (plan, usage) in ways.items():
            with running_nginx(plan, work / way.replace("+", "-"), T.nginx_binary(), usage=usage) as lb:
                verify = ssl.create_default_context(cafile=str(work / "lab-ca" / "ca.crt")) if plan.tls else True
                time.sleep(0.5)  # every worker forked and settled (one answered /health already)
                memories[way]["idle"].append(memory(lb["pid_file"]))
                with httpx.Client(verify=verify, headers={"Authorization": "Bearer client-a-4567"}) as c:
                    timed(c, "GET", f"{lb['base']}/v1/models", 20)  # warm: connections, caches
                    samples[way]["GET"] += timed(c, "GET", f"{lb['base']}/v1/models", args.requests)
                    samples[way]["POST"] += timed(c, "POST", f"{lb['base']}/v1/chat/completions", args.requests)
                memories[way]["load"].append(memory(lb["pid_file"]))
    backend.shutdown()
    base = {m: pct(samples["plain"][m], 0.5) for m in ("GET", "POST")}
    print(f"\ngateway features, loopback, one stand-in backend; {args.rounds} rounds x {args.requests} requests each")
    print(f"{'way':<18} {'GET p50':>8} {'GET p99':>8} {'POST p50':>9} {'POST p99':>9} {'added p50 (GET/POST)':>22}")
    for way, got in samples.items():
        added = f"{pct(got['GET'], 0.5) - base['GET']:+.3f} / {pct(got['POST'], 0.5) - base['POST']:+.3f}"
        print(f"{way:<18} {pct(got['GET'], 0.5):8.3f} {pct(got['GET'], 0.99):8.3f} {pct(got['POST'], 0.5):9.3f} "
              f"{pct(got['POST'], 0.99):9.3f} {added:>22}")
    print("(ms; the stand-in answers in well under a millisecond, so this is nginx's own time per request)")
    print_memory(memories)
    return 0


if __name__ == "__main__":
    sys.exit(main())
