#!/usr/bin/env python3
"""A fan-out peer copy on loopback: qwen27b-fetch from a seed server, before and after a change,
beside curl of the same files from the same server.

    python3 benchmarks/fetch_loopback.py                        # 1 GiB in 4 files, 3 repeats, before = main
    python3 benchmarks/fetch_loopback.py --size 2G --files 8 --before 776f7fd
    python3 benchmarks/fetch_loopback.py --chunks 256K,4M       # fetch.CHUNK variants of this tree's fetch.py
    python3 benchmarks/fetch_loopback.py --before 56ef630 --servers after   # two clients, one server
    /usr/bin/python3 benchmarks/fetch_loopback.py               # the interpreter a host runs fetch.py with

Why: the tree fan-out's peer legs ran at 0.51-0.67 of rsync (docs/deploy-bench.md); this isolates
the two programs involved, qwen27b/onhost/fetch.py (client) and qwen27b/onhost/mirror.py in seed
mode (server, its own process with --token-file/--allow as its unit runs it), from pyinfra and the
test hosts. "before" is both files at git revision --before, "after" this tree's; every client
runs against both servers, so the table separates the client's share from the server's. curl
(`-o`, no hashing: the transfer alone) is the reference; rsync is not on this machine.

The files are random, generated once and read once before timing (warm page cache: source and
destination share this machine's disk and memory, like the nspawn hosts). Every repeat runs
every case, rotating the order so a noisy neighbour hits all alike; the destination is removed
and `sync` run between runs, outside the timing. Client CPU is the child's user+sys, server CPU
the seed process's (from /proc); "best s" (the fastest repeat) is the steadier figure when the
machine is shared. A benchmark that prints a table, not a test; it says when the
load average was >= 2 (2 shared cores: the figures are then noise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.hash_speed import human, make_file, parse_size, warm  # noqa: E402
from qwen27b.onhost import fetch  # noqa: E402
from qwen27b.tools.cpu_smoke import free_port  # noqa: E402

REVISION = "x--bench@1"
RUN_FETCH = ("import sys; sys.path.insert(0, sys.argv[1]); import fetch; fetch.CHUNK = int(sys.argv[2]); "
             "sys.exit(fetch.main(sys.argv[3:]))")


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_seed(python: str, code: Path, rev: Path, token_file: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([python, str(code / "mirror.py"), str(rev), "--host", "127.0.0.1", "--port", str(port),
                             "--token-file", str(token_file), "--allow", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while subprocess.run(["curl", "-sf", "-o", "/dev/null", "-H", f"Authorization: Bearer {token_file.read_text().strip()}",
                          f"http://127.0.0.1:{port}/{REVISION}/config.json"]).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the seed server of {code} did not start")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}/{REVISION}"


def generate(rev: Path, size: int, files: int) -> dict:
    rev.mkdir(parents=True)
    (rev / "config.json").write_text("{}")
    for i in range(1, files + 1):
        make_file(rev / f"model-{i:05d}-of-{files:05d}.safetensors", size // files)
    return {"files": {p.name: {"size": p.stat().st_size, "sha256": fetch.sha256_of(str(p))} for p in sorted(rev.iterdir())}}


def load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1G", help="total size of the files (default 1G)")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", default="main",
                        help="git revision of the 'before' fetch.py and mirror.py, or a directory holding them")
    parser.add_argument("--servers", default="before,after", help="which seed servers to run every client against")
    parser.add_argument("--chunks", default="", help="extra fetch.CHUNK sizes for this tree's fetch.py, e.g. 256K,4M")
    parser.add_argument("--python", default=sys.executable, help="interpreter for fetch.py and mirror.py")
    parser.add_argument("--dir", help="scratch dir (default: a temp dir, removed after)")
    args = parser.parse_args(argv)
    size = parse_size(args.size)

    with tempfile.TemporaryDirectory(prefix="q27-fetchbench-", dir=args.dir) as tmp_text:
        tmp = Path(tmp_text)
        code = {"after": ROOT / "qwen27b" / "onhost", "before": tmp / "before"}
        code["before"].mkdir()
        for name in ("fetch.py", "mirror.py"):
            if os.path.isdir(args.before):
                shutil.copy(os.path.join(args.before, name), code["before"] / name)
                continue
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.before}:qwen27b/onhost/{name}"],
                                  check=True, capture_output=True, text=True).stdout
            (code["before"] / name).write_text(text)
        t0 = time.perf_counter()
        manifest = generate(tmp / "src" / REVISION, size, args.files)
        for name in manifest["files"]:
            warm(tmp / "src" / REVISION / name)
        (tmp / "listing.json").write_text(json.dumps(manifest))
        token_file = tmp / "seed.token"
        token_file.write_text(secrets.token_urlsafe(32) + "\n")
        token = token_file.read_text().strip()
        total = sum(meta["size"] for meta in manifest["files"].values())
        print(f"fetch on loopback: {total / 2**30:.2f} GiB in {len(manifest['files'])} files (generated and read in "
              f"{time.perf_counter() - t0:.1f} s); before = {args.before}; {platform.python_implementation()} "
              f"{platform.python_version()} ({args.python}); {os.cpu_count()} CPUs; load {load():.2f}", flush=True)

        servers = [which for which in ("before", "after") if which in args.servers.split(",")]
        seeds = {which: start_seed(args.python, code[which], tmp / "src" / REVISION, token_file) for which in servers}
        dest = tmp / "dest"
        chunks = [fetch.CHUNK] + [c for c in (parse_size(x) for x in args.chunks.split(",") if x.strip())
                                  if c != fetch.CHUNK]
        cases = []  # (label, client, server, argv builder)
        for server in servers:
            urls = [f"{seeds[server][1]}/{name}" for name in manifest["files"]]
            cases.append((f"curl -o, {server} server", "curl", server,
                          ["curl", "-sf", "-H", f"Authorization: Bearer {token}",
                           *[part for url, name in zip(urls, manifest["files"]) for part in (url, "-o", str(dest / name))]]))
            for client in ("before", "after"):
                for chunk in (chunks if client == "after" else [chunks[0]]):
                    label = f"fetch {client}{'' if chunk == fetch.CHUNK else f' (CHUNK {human(chunk)})'}, {server} server"
                    cases.append((label, f"fetch {client}", server,
                                  [args.python, "-c", RUN_FETCH, str(code[client]), str(chunk), "--base", seeds[server][1],
                                   "--dest", str(dest), "--manifest", str(tmp / "listing.json"), "--token-file",
                                   str(token_file)]))
        runs: dict[str, list[tuple[float, float, float]]] = {label: [] for label, *_ in cases}
        loads = [load()]
        try:
            for repeat in range(args.repeats):
                shift = repeat % len(cases)
                for label, _client, server, command in cases[shift:] + cases[:shift]:
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir()
                    os.sync()
                    pid = seeds[server][0].pid
                    cpu0, scpu0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), server_cpu(pid), time.perf_counter()
                    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
                    wall = time.perf_counter() - t0
                    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    client_cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
                    got = sum((dest / name).stat().st_size for name in manifest["files"])
                    if got != total:
                        raise SystemExit(f"{label}: {got} of {total} bytes")
                    runs[label].append((wall, client_cpu, server_cpu(pid) - scpu0))
                    loads.append(load())
                    print(f"  repeat {repeat + 1}: {label:<38} {wall:6.2f} s  client cpu {client_cpu:5.2f} s  "
                          f"server cpu {runs[label][-1][2]:5.2f} s  load {loads[-1]:.2f}", flush=True)
        finally:
            for proc, _ in seeds.values():
                proc.terminate()
                proc.wait(timeout=10)

    reference = {server: statistics.median(w for w, *_ in runs[f"curl -o, {server} server"]) for server in servers}
    print()
    print(f"| case | wall s (median of {args.repeats}) | best s | MB/s | client cpu s | server cpu s "
          "| vs curl, same server |")
    print("|---|---|---|---|---|---|---|")
    for label, _client, server, _ in cases:
        wall = statistics.median(w for w, *_ in runs[label])
        client_cpu = statistics.median(c for _, c, _ in runs[label])
        srv_cpu = statistics.median(s for *_, s in runs[label])
        print(f"| {label} | {wall:.2f} | {min(w for w, *_ in runs[label]):.2f} | {total / 1e6 / wall:,.0f} | {client_cpu:.2f} | {srv_cpu:.2f} "
              f"| {reference[server] / wall:.2f} |")
    print(f"\nload average during the runs: {min(loads):.2f}-{max(loads):.2f}"
          + ("  (>= 2: the figures are noise, re-run on a quieter machine)" if max(loads) >= 2 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
