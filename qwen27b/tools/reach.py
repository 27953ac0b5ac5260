"""`qwen27b reach INVENTORY`: can each host reach every source its plan fetches from? (issue 30)

    qwen27b reach INVENTORY [--limit HOST ...] [--timeout S] [--json]

From each host, a HEAD request to each source the plan will use (the plan's `fetch:` lines:
installs.host_fetches over the host's gate facts, the same reading doctor makes), through the host's
qwen27b_http_proxy, with a short timeout; then a table of source, host, result and the setting that
would point a failing fetch elsewhere. Nothing is installed or changed: the facts are read-only
commands and the probe is the host's own python3 (stdlib urllib, present on every Ubuntu). URLs and
the proxy go to the probe on its standard input, never its command line (a login would show in `ps`).
A host the gate refuses is probed for every GPU profile's sources (its plan is not known).

Any HTTP answer counts as reached (a mirror's base may answer 404), except a proxy's refusal
(407) or its failure to connect (502, 503, 504). Exit 1 when a source is out of reach, 2 for a bad
inventory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from qwen27b.controller import reachrecord, remote
from qwen27b.controller.host_facts import PROBE, PROBE_COMMAND  # noqa: F401 (the probe lives with its fact: the gate runs it on --dry)
from qwen27b.controller.reachprobe import PROXY_FAILED, Row, probe_input, rows_for, verdict  # noqa: F401 (the probe's shared part)
from qwen27b.controller.report import table

HEADERS = ["source", "host", "result", "fix (setting)"]
WIDTHS = [44, 24, 48, 48]


def reach_table(rows: list[Row]) -> str:
    return table(HEADERS, [[f"{r.source}\n{r.url}", r.host, r.result, r.fix] for r in rows], WIDTHS)


def host_fetches_of(name: str, data: dict, stack: dict, outputs: dict[str, str]):
    """(fetches, note) for one host from its gate facts (doctor's fact commands' outputs): the plan's
    sources, or every GPU profile's when the gate refuses the host or its data is bad."""
    from qwen27b.controller.artifacts import python_builds
    from qwen27b.plan import sources
    from qwen27b.plan.gate import RefusedHost
    from qwen27b.plan.installs import host_fetches
    from qwen27b.plan.hostdata import BadHostData, Settings, settings_for
    from qwen27b.plan.serving import decide
    from qwen27b.plan.stack import StackError, resolve_stack
    from qwen27b.tools.doctor.context import host_facts
    from qwen27b.tools.doctor.model import HostSnapshot

    try:
        settings = settings_for(name, data)
    except BadHostData as bad:
        settings, why = Settings(), str(bad)
    else:
        try:
            decision = decide(name, host_facts(HostSnapshot(host=name, outputs=outputs)), stack, settings)
            return host_fetches(decision, python_builds()), None
        except (RefusedHost, StackError) as refused:
            why = f"the gate refuses it ({refused})"
    seen, out = set(), []
    for profile in ([settings.profile] if settings.profile else [p for p in stack["profiles"] if p != "cpu-smoke"]):
        rs = resolve_stack(stack, profile, None, model_source=settings.model_source)
        py = sources.python_source(settings, rs.fetch_sources, rs.profile["python"]["version"], python_builds())
        for f in sources.fetches(rs.fetch_sources, rs.profile, settings, py, [rs.model] + ([rs.draft] if rs.draft else [])):
            if f.url not in seen:
                seen.add(f.url)
                out.append(f)
    return out, f"{name}: every GPU profile's sources: {why}"


def check_host(state, host, stack: dict, timeout: float, script_timeout: int) -> tuple[list[Row], str | None]:
    """Read the host's gate facts, then probe the sources its plan fetches from."""
    from qwen27b.tools.doctor.collection import fact_commands, run_phase

    facts = {key: command for key, (_, command) in fact_commands(stack["paths"]).items()}
    outputs, _, error = run_phase(state, host, facts, script_timeout)
    data = dict(host.data.dict())
    if error:
        return [Row(host.name, "(the host)", "", False, error, "")], None
    fetches, note = host_fetches_of(host.name, data, stack, outputs)
    proxy = data.get("qwen27b_http_proxy")
    answer = remote.run_command(state, host, PROBE_COMMAND, script_timeout, stdin=probe_input(fetches, proxy, timeout))
    missing = "python3 not found on the host" if "python3: not found" in answer.stderr or \
        "python3: command not found" in answer.stderr else None
    return rows_for(host.name, fetches, answer.stdout, answer.error or missing), note


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b reach", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="pyinfra inventory file (as for deploy.py)")
    p.add_argument("--limit", nargs="+", action="extend", metavar="HOST", help="only these hosts or groups (globs)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per HEAD request (default 5)")
    p.add_argument("--json", action="store_true", help="JSON for machines instead of the table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from gevent import monkey  # as pyinfra's CLI: hosts overlap
    monkey.patch_all()
    from qwen27b.plan.stack import load_stack

    stack, started = load_stack(), time.monotonic()
    selected = remote.selected_hosts("reach", args.inventory, args.limit)
    if selected is None:
        return 2
    state, hosts = selected
    budget = int(120 + 2 * args.timeout * 12)
    results = remote.on_every_host(state, hosts, lambda h: check_host(state, h, stack, args.timeout, budget),
                                   lambda h, why: ([Row(h.name, "(the host)", "", False, why, "")], None))
    rows = [row for host_rows, _ in results for row in host_rows]
    notes = [note for _, note in results if note]
    code = 0 if all(r.ok for r in rows) else 1
    checked = {h.name for h in hosts}
    reachrecord.save({name: [r.url for r in rows if r.host == name and not r.ok and r.url] for name in checked
                      if not any(r.host == name and r.source == "(the host)" for r in rows)})
    if args.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "notes": notes, "exit_code": code}, indent=2))
    else:
        print(reach_table(rows))
        for note in notes:
            print(f"note: {note}")
        bad = sorted({r.host for r in rows if not r.ok})
        print(f"\nchecked {len(rows)} source(s) on {len(hosts)} host(s) in {time.monotonic() - started:.1f} s"
              + (f"; out of reach on {', '.join(bad)}" if bad else "; all reached"))
    return code


if __name__ == "__main__":
    sys.exit(main())
