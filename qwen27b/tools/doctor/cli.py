"""`qwen27b doctor` / `python -m qwen27b.tools.doctor`: read the hosts (or replay saved snapshots),
diagnose each, print a table per host or JSON; exit 1 when a step fails, 2 for usage errors."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

from qwen27b.controller import apikey, remote
from qwen27b.plan.stack import load_stack

from .collection import collect
from .diagnosis import diagnose
from .model import STEPS, HostSnapshot
from .output import table


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qwen27b doctor", description=sys.modules[__package__].__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Steps: " + ", ".join(f"{n} {s}" for n, s in STEPS.items()))
    parser.add_argument("inventory", nargs="?", help="pyinfra inventory file (as for deploy.py)")
    parser.add_argument("--limit", nargs="+", action="extend", metavar="NAME",
                        help="only these hosts or groups (globs, as pyinfra's --limit; repeatable)")
    parser.add_argument("--json", action="store_true", help="JSON for machines instead of tables")
    parser.add_argument("--save", metavar="DIR", help="also write each host's snapshot (command outputs) to DIR/HOST/")
    parser.add_argument("--replay", metavar="DIR", help="diagnose saved snapshot dir(s) instead of reading hosts")
    parser.add_argument("--timeout", type=int, default=300, metavar="S",
                        help="seconds per host for the main script (default 300)")
    parser.add_argument("--parallel", type=int, metavar="N", help="hosts read at once (as pyinfra's --parallel; "
                        "default pyinfra's: 20 per CPU)")
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
    if args.replay:
        snapshots = replayed(Path(args.replay), args.limit)
    else:
        from gevent import monkey  # as pyinfra's CLI: sockets and subprocesses cooperate, hosts overlap
        monkey.patch_all()
        try:
            state, hosts = remote.load_inventory(args.inventory, args.limit, parallel=args.parallel)
        except Exception as error:  # pyinfra raises many kinds for a bad inventory file
            print(f"doctor: cannot load inventory {args.inventory}: {error}", file=sys.stderr)
            return 2
        snapshots = collect(state, hosts, stack, args.timeout)
        for snap in snapshots:  # the plan doctor compares the unit with has the deploy's key (apikey.py)
            snap.data = apikey.lab_data(snap.data or {}, args.inventory)
        for snap in snapshots if args.save else []:
            snap.save(Path(args.save) / snap.host)
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
            for name, part in r.copies.items() or [(None, r)]:
                if name is not None:  # a host serving copies: a section per copy, as a host's
                    print(f"-- copy {name} ({part.unit}): {part.headline()}")
                    print()
                print(table(part))
                print()
    return 1 if failed else 0
