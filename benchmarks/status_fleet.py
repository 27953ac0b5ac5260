#!/usr/bin/env python3
"""`qwen27b status` on 1, 10, 50 hosts: how the wall time grows with the fleet (issue 12: "50
recorded hosts in a few seconds").

    PYTHONPATH=. .venv/bin/python benchmarks/status_fleet.py
    PYTHONPATH=. .venv/bin/python benchmarks/status_fleet.py --sizes 1,10,50,200 --latency-ms 50,200 --repeats 5

The hosts are pyinfra @fake hosts replaying the recorded status outputs of
tests/fixtures/status/ (we cannot have 50 machines); each answers its one command after
`--latency-ms` (a gevent sleep, the way an SSH round trip waits), so hosts overlap as they would
on a network. Each run is the real command in its own process (interpreter start, imports,
inventory load, every host, the table), with the status nonce pinned to the recordings' as
tests/unit/slow/test_status.py does. Printed per size: the whole process and the command's own "read N
host(s) in X s" (inventory load to last row; --json elapsed_s), median of the repeats, against
the serial floor N x latency a one-host-after-another loop would take at least.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = ("import sys\nfrom qwen27b.controller import remote\nremote.new_nonce = lambda: 'recorded'\n"
        "from qwen27b.tools.status import main\nsys.exit(main(sys.argv[1:]))\n")
INVENTORY = """\
from pathlib import Path
_recordings = sorted(Path({recorded!r}).glob('*.txt'))
hosts = [(f'@fake/gpu-{{n:03d}}', {{'fake_responses': {{'@@recorded@@ BEGIN now': _recordings[n % len(_recordings)].read_text().splitlines()}},
                                  'fake_delay': {delay}, 'fake_delay_jitter': 0}}) for n in range({n})]
"""


def one_run(n: int, delay_s: float, work: Path) -> tuple[float, float]:
    inventory = work / f"fleet-{n}.py"
    inventory.write_text(INVENTORY.format(recorded=str(ROOT / "tests" / "fixtures" / "status"), delay=delay_s, n=n))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", SHIM, str(inventory), "--json", "--reports", str(work / "reports")],
                            cwd=work, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - started
    data = json.loads(result.stdout)
    if len(data["hosts"]) != n or any(h["reach"] != "ok" for h in data["hosts"]):
        raise SystemExit(f"{n} hosts: unexpected answer {result.stdout[-500:]} {result.stderr[-500:]}")
    return wall, data["elapsed_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,10,50", help="host counts (default 1,10,50)")
    p.add_argument("--latency-ms", default="50", help="per-command delay of each @fake host, comma list (default 50)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    latencies = [float(s) for s in args.latency_ms.split(",")]
    print(f"qwen27b status on @fake hosts, median of {args.repeats} run(s); {os.cpu_count()} CPU(s)")
    print(f"{'hosts':>5}  {'latency':>7}  {'process s':>9}  {'status read s':>13}  {'serial floor s':>14}  {'per host ms':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for latency in latencies:
            for n in sizes:
                runs = [one_run(n, latency / 1000, Path(tmp)) for _ in range(args.repeats)]
                wall = statistics.median(r[0] for r in runs)
                read = statistics.median(r[1] for r in runs)
                print(f"{n:>5}  {latency:>5.0f}ms  {wall:>9.2f}  {read:>13.2f}  {n * latency / 1000:>14.2f}  "
                      f"{read / n * 1000:>11.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
