#!/usr/bin/env python3
"""Hashing speed of qwen27b-fetch (qwen27b/onhost/fetch.py: sha256_of) against GNU `sha256sum`.

qwen27b-fetch hashes every checkpoint file it downloads, and every file already present before
it skips it; `sha256sum` is what the FileHashes fact runs on the host. Goal (issue 6): ours at
>= 90 % of sha256sum's speed.

    python3 benchmarks/hash_speed.py                      # 2 GiB file in a temp dir, 3 repeats
    python3 benchmarks/hash_speed.py --size 512M --repeats 5
    python3 benchmarks/hash_speed.py --chunks 64K,1M,4M,16M   # fetch.CHUNK variants (same function)
    /usr/bin/python3 benchmarks/hash_speed.py             # the interpreter a host runs fetch.py with

Stdlib only (like fetch.py), so any python3 runs it. The file is random data, read once before
timing (warm page cache: this measures hashing, not the disk). Each repeat runs ours and
sha256sum back to back (alternating which goes first) so a noisy neighbour hits both alike.
Reported: wall-clock MB/s (MB = 10^6 bytes), CPU MB/s (bytes / user+sys CPU seconds: steadier on
a shared machine), the ratio ours / sha256sum, and whether the goal is met. This is a benchmark
that prints a table, not a test: nothing fails on a slow machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qwen27b.onhost import fetch  # noqa: E402  (stdlib-only module: the code shipped to hosts)

GOAL = 0.90
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def human(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]} {unit}iB"
    return f"{n} B"


def make_file(path: Path, size: int) -> None:
    block = 16 * 2**20
    with open(path, "wb") as out:
        left = size
        while left > 0:
            out.write(os.urandom(min(block, left)))
            left -= block


def warm(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(8 * 2**20):
            pass


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def time_ours(path: Path, chunk: int) -> tuple[float, float, str]:
    """(wall s, cpu s, hex) for fetch.sha256_of with fetch.CHUNK = chunk."""
    saved = fetch.CHUNK
    fetch.CHUNK = chunk  # sha256_of reads the module global at call time
    try:
        cpu0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
        digest = fetch.sha256_of(str(path))
        return time.perf_counter() - t0, _cpu(resource.RUSAGE_SELF) - cpu0, digest
    finally:
        fetch.CHUNK = saved


def time_sha256sum(path: Path) -> tuple[float, float, str]:
    cpu0, t0 = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(["sha256sum", str(path)], check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t0, _cpu(resource.RUSAGE_CHILDREN) - cpu0, out.split()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="2G", help="test file size, e.g. 2G, 512M (default 2G)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", help="where to write the test file (default: a temp dir, removed after)")
    parser.add_argument("--chunks", default="",
                        help="comma-separated read sizes to try besides fetch.CHUNK, e.g. 4M,16M (same function, "
                             "fetch.CHUNK set for the call)")
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    chunks = [fetch.CHUNK] + [c for c in (parse_size(x) for x in args.chunks.split(",") if x.strip())
                              if c != fetch.CHUNK]

    print(f"hash speed: {human(size)} random file, warm page cache, {args.repeats} repeats; "
          f"{platform.python_implementation()} {platform.python_version()} ({sys.executable}), "
          f"{__import__('ssl').OPENSSL_VERSION}; fetch.CHUNK = {human(fetch.CHUNK)}; {os.cpu_count()} CPUs",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="q27-hash-", dir=args.dir) as tmp:
        path = Path(tmp) / "blob.bin"
        t0 = time.perf_counter()
        make_file(path, size)
        warm(path)
        print(f"  test file written and read once in {time.perf_counter() - t0:.1f} s: {path}", flush=True)

        runs: dict[str, list[tuple[float, float]]] = {"sha256sum": []}
        runs.update({f"ours (fetch.sha256_of, CHUNK {human(c)})": [] for c in chunks})
        labels = list(runs)
        digests = set()
        for repeat in range(args.repeats):
            order = labels if repeat % 2 == 0 else labels[::-1]
            for label in order:
                if label == "sha256sum":
                    wall, cpu, digest = time_sha256sum(path)
                else:
                    wall, cpu, digest = time_ours(path, chunks[labels.index(label) - 1])
                runs[label].append((wall, cpu))
                digests.add(digest)
                print(f"  repeat {repeat + 1}: {label:<40} {wall:6.2f} s wall  {cpu:6.2f} s cpu", flush=True)
        if len(digests) != 1:
            print(f"ERROR: the hashes differ: {sorted(digests)}", file=sys.stderr)
            return 1

    base_wall = statistics.median(w for w, _ in runs["sha256sum"])
    base_cpu = statistics.median(c for _, c in runs["sha256sum"])
    mb = size / 1e6
    print()
    print(f"| hasher | wall s (median of {args.repeats}) | MB/s wall | MB/s cpu | vs sha256sum (wall) "
          f"| vs sha256sum (cpu) | goal >= {GOAL:.0%} |")
    print("|---|---|---|---|---|---|---|")
    for label, samples in runs.items():
        wall = statistics.median(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        ratio_wall, ratio_cpu = base_wall / wall, base_cpu / max(cpu, 1e-9)
        goal = "-" if label == "sha256sum" else ("met" if ratio_wall >= GOAL else "NOT met")
        print(f"| {label} | {wall:.2f} | {mb / wall:,.0f} | {mb / max(cpu, 1e-9):,.0f} | {ratio_wall:.0%} "
              f"| {ratio_cpu:.0%} | {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
