"""`qwen27b doctor` / `python -m qwen27b.tools.doctor`: read the hosts (or replay saved snapshots),
diagnose each, print a table per host or JSON; exit 1 when a step fails, 2 for usage errors."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from pathlib import Path

from qwen27b.plan.stack import load_stack

from .collection import collect
from .diagnosis import diagnose
from .model import STEPS, HostSnapshot
from .output import table


def inventory_hosts(path: str) -> list[tuple[str, dict]]:
    """(name, data) of every host in a pyinfra inventory file, group data included, as pyinfra loads it."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    ctx_state.set(State())
    inventory = make_inventory(path, cwd=os.getcwd())
    return [(h.name, dict(h.data.dict())) for h in inventory]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qwen27b doctor", description=sys.modules[__package__].__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Steps: " + ", ".join(f"{n} {s}" for n, s in STEPS.items()))
    parser.add_argument("inventory", nargs="?", help="pyinfra inventory file (as for deploy.py)")
    parser.add_argument("--limit", action="append", metavar="NAME", help="only hosts matching NAME (glob; repeatable)")
    parser.add_argument("--json", action="store_true", help="JSON for machines instead of tables")
    parser.add_argument("--save", metavar="DIR", help="also write each host's snapshot (command outputs) to DIR/HOST/")
    parser.add_argument("--replay", metavar="DIR", help="diagnose saved snapshot dir(s) instead of reading hosts")
    args = parser.parse_args(argv)
    if bool(args.inventory) == bool(args.replay):
        parser.error("give an INVENTORY or --replay DIR")
    return args


def replayed(root: Path, limit: list[str] | None) -> list[HostSnapshot]:
    """A saved snapshot dir, or a dir of them (one per host), filtered by --limit globs."""
    dirs = [root] if (root / "journal.txt").exists() or (root / "base").exists() else sorted(p for p in root.iterdir() if p.is_dir())
    snapshots = [HostSnapshot.load(d) for d in dirs]
    if limit:
        snapshots = [s for s in snapshots if any(fnmatch.fnmatch(s.host, pat) for pat in limit)]
    return snapshots


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    stack = load_stack()
    snapshots: list[HostSnapshot] = []
    if args.replay:
        snapshots = replayed(Path(args.replay), args.limit)
    else:
        try:
            hosts = inventory_hosts(args.inventory)
        except Exception as error:  # pyinfra raises many kinds for a bad inventory file
            print(f"doctor: cannot load inventory {args.inventory}: {error}", file=sys.stderr)
            return 2
        if args.limit:
            hosts = [(n, d) for n, d in hosts if any(fnmatch.fnmatch(n, pat) for pat in args.limit)]
        for name, data in hosts:
            snap = collect(name, data, stack)
            if args.save:
                snap.save(Path(args.save) / name)
            snapshots.append(snap)
    if not snapshots:
        print("doctor: no host selected", file=sys.stderr)
        return 2
    reports = [diagnose(s, stack) for s in snapshots]
    failed = any(r.first_failure is not None for r in reports)
    if args.json:
        print(json.dumps({"hosts": [r.as_dict() for r in reports], "exit_code": 1 if failed else 0}, indent=2,
                         ensure_ascii=False))
    else:
        for r in reports:
            print(f"== {r.host}")
            print(r.headline())
            print()
            print(table(r))
            print()
    return 1 if failed else 0

