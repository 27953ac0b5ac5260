"""The ``python3 -m tests.support.testhosts`` command line (usage: the package docstring)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .common import TestHostsError, cache_dir, log
from .hosts import NspawnHosts


def all_profiles(cache: Path | None = None) -> list[str]:
    base = (Path(cache) if cache else cache_dir()) / "testhosts"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "state.json").exists())


def print_table(rows: list[dict]) -> None:
    cols = ["profile", "name", "address", "address6", "supervisor_pid", "nspawn_pid", "state"]
    data = [[str(r.get(c) if r.get(c) is not None else "-") for c in cols] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) if data else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for d in data:
        print("  ".join(v.ljust(w) for v, w in zip(d, widths)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.support.testhosts",
                                 description=sys.modules[__package__].__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None,
                    help="set of hosts (state dir); default $QWEN27B_TESTHOSTS_PROFILE or "
                         "'default'. status/down without --profile cover every profile")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="boot N hosts (reuses running ones)")
    p_up.add_argument("-n", type=int, default=1)
    p_up.add_argument("--timeout", type=float, default=180.0, help="per-host boot timeout (s)")
    p_up.add_argument("--link-peers", action="store_true",
                      help="let the hosts reach each other (routes + forwarding on their veths only)")
    sub.add_parser("down", help="stop all hosts and helpers, delete roots (keeps the cache)")
    sub.add_parser("status", help="table of hosts")
    p_ssh = sub.add_parser("ssh", help="ssh into a host")
    p_ssh.add_argument("name")
    p_ssh.add_argument("command", nargs=argparse.REMAINDER)
    p_reset = sub.add_parser("reset", help="fresh root from the tarball, boot again")
    p_reset.add_argument("name")
    p_check = sub.add_parser("check", help="apt-get update and pip download six inside")
    p_check.add_argument("name", nargs="?")
    sub.add_parser("paths", help="print the inventory / ssh_config / key paths")
    p_labinv = sub.add_parser("lab-inventory", help="write README's lab inventory for the profile's hosts "
                              "(the admin sudo account, a gateway) into DIR (./run up N)")
    p_labinv.add_argument("dir", type=Path)
    args = ap.parse_args(argv)

    explicit = args.profile or os.environ.get("QWEN27B_TESTHOSTS_PROFILE")
    profile = explicit or "default"
    try:
        if args.cmd in ("down", "status"):
            profiles = [explicit] if explicit else (all_profiles() or [profile])
            if args.cmd == "down":
                for p in profiles:
                    NspawnHosts(p).down()
                log("down: nothing of ours left running")
                return 0
            rows = [r for p in profiles for r in NspawnHosts(p).status()]
            print_table(rows)
            return 0
        lab = NspawnHosts(profile)
        if args.cmd == "up":
            lab.boot_timeout = args.timeout
            try:
                lab.up(args.n)
                if args.link_peers:
                    lab.link_peers()
            except TestHostsError as e:
                raise TestHostsError(f"{e}\n(hosts left as they are, for a look: "
                                     "`python3 -m tests.support.testhosts down` cleans up)") from e
            except KeyboardInterrupt:
                log("interrupted: tearing down")
                lab.down()
                return 130
            print_table(lab.status())
            print(f"inventory:  {lab.inventory}\nssh_config: {lab.ssh_config}\n"
                  f"e.g.:       pyinfra -y {lab.inventory} exec -- uptime\n"
                  f"            ssh -F {lab.ssh_config} {lab.hosts[0]['name']}")
            return 0
        if args.cmd == "ssh":
            lab.host(args.name)
            argv2 = lab.ssh_argv(args.name, *args.command, tty=not args.command)
            os.execvp(argv2[0], argv2)
        if args.cmd == "reset":
            lab.reset(args.name)
            print_table(lab.status())
            return 0
        if args.cmd == "check":
            names = [args.name] if args.name else [h["name"] for h in lab.hosts]
            for name in names:
                t0 = time.monotonic()
                lab.ssh(name, "apt-get update -q", timeout=300)
                t1 = time.monotonic()
                lab.ssh(name, "set -e; python3 -m venv /tmp/q27t-check; "
                              "/tmp/q27t-check/bin/pip download -q -d /tmp/q27t-dl six; "
                              "ls /tmp/q27t-dl; rm -rf /tmp/q27t-check /tmp/q27t-dl", timeout=300)
                print(f"{name}: apt-get update ok ({t1 - t0:.1f}s), pip download six ok "
                      f"({time.monotonic() - t1:.1f}s)")
            return 0
        if args.cmd == "lab-inventory":
            from .labinventory import write_lab
            if len(lab.hosts) < 2:
                raise TestHostsError(f"profile {profile!r} has {len(lab.hosts)} host(s): a lab needs two (`up -n 2`)")
            inventory = write_lab(lab, args.dir)
            hosts = lab.hosts
            print(f"inventory:  {inventory}  (groups serving: {', '.join(h['name'] for h in hosts[:-1])}; "
                  f"qwen27b_gateway: {hosts[-1]['name']}; as admin with sudo)\n"
                  f"ssh_config: {inventory.parent / 'ssh_config'}\n"
                  f"e.g.:       pyinfra {inventory} deploy.py --dry -v\n"
                  f"            ssh -F {inventory.parent / 'ssh_config'} {hosts[0]['name']} sudo systemctl status qwen27b")
            return 0
        if args.cmd == "paths":
            print(f"inventory {lab.inventory}\nssh_config {lab.ssh_config}\n"
                  f"known_hosts {lab.known_hosts}\nkey {lab.key}\nstate {lab.state_file}")
            return 0
    except TestHostsError as e:
        print(f"testhosts: error: {e}", file=sys.stderr)
        return 1
    return 2
