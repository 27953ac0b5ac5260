"""`qwen27b qualify`: a bounded burn-in of each GPU of the hosts before they serve (issue 27).

    qwen27b qualify INVENTORY [--limit HOST ...] [--minutes N] [--force] [--dry] [--out DIR] [--json]

For each host, at once: refused while qwen27b.service (or a copy, qwen27b@NAME) is active or
starting, unless --force (the burn-in would fight vLLM for the GPUs and its memory); else the
release venv's torch runs `qwen27b_onhost.qualify` there (qwen27b/onhost/qualify.py: matmuls,
memory traffic and a pattern check on every GPU for N minutes, nvidia-smi before, under load and
after, the kernel's Xids), and this prints one table of every GPU with its verdict and writes
its JSON record to OUT/<host>/gpu<N>.json. A host without an NVIDIA GPU (the CPU profile) runs
the dry path. Exit 0 when every GPU passed or warned, 1 when one failed or a host was refused or
not read, 2 for a bad inventory or arguments. Hosts are reached as `qwen27b status` reaches them
(qwen27b.controller.remote: the inventory's connector data, sudo included).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from qwen27b.controller import remote
from qwen27b.onhost.contract import SERVICE_UNIT, module_command
from qwen27b.onhost.qualify import parse_records, render_table
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan.stack import load_stack
from qwen27b.controller.report import reports_dir

MINUTES = (0.1, 60.0)  # bounded: a burn-in, not a soak
SERVING = (f"systemctl list-units --no-legend --plain --state=active,activating {SERVICE_UNIT} 'qwen27b@*.service' "
           "2>/dev/null | cut -d' ' -f1")


def probe_commands(layout: HostLayout) -> dict[str, str]:
    """What phase 1 reads: the units serving now, whether the release venv is there."""
    venv = layout.current_venv
    return {"serving": SERVING, "venv": f"test -x {shlex.quote(venv)}/bin/python && echo yes || echo no"}


def refusal(host: str, serving: list[str], venv: bool, force: bool) -> str | None:
    """Why phase 2 must not run on this host, or None. Pure."""
    if serving and not force:
        units = ", ".join(serving)
        return (f"{host}: refused: {units} is serving: a burn-in would compete with vLLM for the GPUs and their "
                f"memory. Fix: stop it first (`sudo systemctl stop {serving[0]}`), or pass --force")
    if not venv:
        return (f"{host}: refused: no release venv ({SERVICE_UNIT} was never deployed here): qualify runs with its "
                "torch. Fix: deploy first (`pyinfra INVENTORY deploy.py`), then qualify")
    return None


def qualify_command(layout: HostLayout, minutes: float, dry: bool, remote_dir: str) -> str:
    """The host's command: the burn-in with the release venv's python, bounded by `timeout`."""
    limit = int(minutes * 60) + 300  # the load, plus torch's start and the pattern read-back
    return (f"timeout {limit} {module_command(layout.current_venv, 'qualify')} --minutes {minutes:g}"
            f" --json-dir {shlex.quote(remote_dir)}" + (" --dry" if dry else ""))


def write_records(out: Path, host: str, records: list[dict]) -> list[Path]:
    """OUT/<host>/gpu<N>.json, one per GPU record."""
    folder = out / host.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for r in records:
        path = folder / f"gpu{r['host_gpu']}.json"
        path.write_text(json.dumps(r, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b qualify", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="pyinfra inventory file (as for deploy.py)")
    p.add_argument("--limit", nargs="+", action="extend", metavar="HOST", help="only these hosts or groups")
    p.add_argument("--minutes", type=float, default=5.0, help=f"load time per GPU, {MINUTES[0]}-{MINUTES[1]:g} (default 5)")
    p.add_argument("--force", action="store_true", help="run on a host whose service is serving (it competes for the GPUs)")
    p.add_argument("--dry", action="store_true", help="the CPU dry path on every host, GPUs or not")
    p.add_argument("--out", type=Path, default=None, help="where the JSON records go (default reports/qualify-<time>)")
    p.add_argument("--json", action="store_true", help="the records as JSON on stdout instead of the table")
    args = p.parse_args(argv)
    if not MINUTES[0] <= args.minutes <= MINUTES[1]:
        p.error(f"--minutes must be in {MINUTES[0]}-{MINUTES[1]:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:
        return int(stop.code or 0)
    from gevent import monkey  # as pyinfra's CLI: hosts overlap
    monkey.patch_all()

    layout = HostLayout.of(load_stack()["paths"])
    selected = remote.selected_hosts("qualify", args.inventory, args.limit)
    if selected is None:
        return 2
    state, hosts = selected
    out = args.out or reports_dir() / time.strftime("qualify-%Y%m%dT%H%M%S")
    nonces = {host.name: remote.new_nonce() for host in hosts}
    probes = remote.run_everywhere(state, hosts, lambda host: remote.script(probe_commands(layout), nonces[host.name]))
    problems, chosen = [], []
    for host, answer in zip(hosts, probes):
        outputs, _ = remote.parse_script_output(answer.stdout, nonces[host.name]) if not answer.error else ({}, {})
        if answer.error or "venv" not in outputs:
            problems.append(f"{host.name}: not read: {answer.error or remote.no_sections_why(answer)}")
            continue
        why = refusal(host.name, outputs.get("serving", "").split(), outputs["venv"].strip() == "yes", args.force)
        if why:
            problems.append(why)
        else:
            chosen.append(host)
    results: dict[str, list[dict]] = {}
    if chosen:
        remote_dir = f"{layout.state}/qualify"
        command = qualify_command(layout, args.minutes, args.dry, remote_dir)
        answers = remote.run_everywhere(state, chosen, lambda host: command, timeout=int(args.minutes * 60) + 400)
        for answer in answers:
            records = parse_records(answer.stdout) if not answer.error else []
            if not records:
                problems.append(f"{answer.host}: the burn-in gave no result: "
                                f"{answer.error or remote.no_sections_why(answer)}")
                continue
            results[answer.host] = records
            write_records(out, answer.host, records)
    if args.json:
        print(json.dumps(results, indent=1, sort_keys=True))
    elif results:
        print(render_table(results))
        print(f"\nJSON per GPU under {out}/ (also on each host under {layout.state}/qualify/)")
    for problem in problems:
        print(problem, file=sys.stderr)
    failed = any(r["verdict"] == "FAIL" for records in results.values() for r in records)
    return 1 if failed or problems else 0
