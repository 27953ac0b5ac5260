"""`qwen27b rollout`: a rolling upgrade, batch by batch, canary first, each batch verified before
the next starts; the first host that fails stops the rollout, named, exit code 1.

    qwen27b rollout INVENTORY [--limit HOST ...] [--canary HOST ...] [--batch-size N] [--dry]
                    [--rollback-on-regression] [--reports DIR] [-- PYINFRA_ARGS...]

A thin layer over pyinfra's own `--limit`: each batch is the real `pyinfra INVENTORY deploy.py -y
--limit HOST...` (arguments after `--`, e.g. `--data qwen27b_stack_overrides=...`, are passed to
every run), whose verify role checks each host it restarted and rolls back a host whose new
release fails (roles/verify.py). Its run report (reports/deploy-*.json: every host's outcome and
verify figures) says how the batch went. The hosts outside a batch keep serving meanwhile; a
later batch's weights come from the hosts already upgraded (the fan-out seeds from hosts outside
`--limit`), not over the WAN again. Re-running a stopped rollout resumes it: hosts already on the
new release plan nothing and are not restarted.

Slower or worse is a stop too (issue 26): the service role measures the serving release on the
stack's fixed prompt set right before it restarts the unit, verify measures the new one right after,
and the pair's decode tok/s, TTFT and acceptance are compared (qwen27b/plan/regression.py; limits in
the stack's serve.regression, settable per host) when the host's load counters beside the two were
alike (qwen27b/plan/loadpair.py, issue 58): else the new one is measured again, and a pair never
alike is "not judged", a stop too. The figures stored at the last deploy are history only. A host worse
by more than a limit stops the rollout there, named with its figures ("regressed"); with
`--rollback-on-regression` (host data qwen27b_rollback_on_regression=true for that run) verify rolls
it back to the previous release at once, as it does a failed one. A re-run judges the recorded
figures again: it stops at the same host until it is rolled back or the limit is raised.

`Hooks` is the seam for a gateway: `drain(hosts)` before a batch is deployed, `undrain(hosts)`
for the ones that verified after it (a host rolled back serves its previous release, verified).
The CLI uses `GatewayHooks`: each backend of the batch (a host serving copies: each copy,
HOST.NAME, as the gateway names them) is drained at every gateway of the
inventory (qwen27b/controller/gateway_drain.py: out of the pool, its requests finished) before its
restart and undrained (back in the pool, healthy) after; an inventory without a gateway drains
nothing. A drain that fails stops the rollout before that batch is touched.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from qwen27b.controller.report import reports_dir, table
from qwen27b.plan.urlsecret import shown_argv
from qwen27b.plan.lifecycle import rollout_batches
from qwen27b.plan.loadpair import NOT_JUDGED
from qwen27b.plan.regression import REGRESSED


ROLLBACK_ON_REGRESSION = "qwen27b_rollback_on_regression"
SERVING = ("ok", "rolled back", "regressed", NOT_JUDGED)  # verified after the batch: the new release, or the previous one again


class Hooks:
    """Called around each batch's deploy (a gateway drains a host before its restart and sends it
    traffic again once it verified). Subclass and pass to `rollout`."""

    def drain(self, hosts: list[str]) -> None:
        """Before the batch's deploy: stop sending these hosts new requests."""

    def undrain(self, hosts: list[str]) -> None:
        """After the batch's deploy: these hosts verified (on the new release, or rolled back to the
        previous one); send them traffic again. A host that failed otherwise stays drained."""


class GatewayHooks(Hooks):
    """The gateways of `inventory` (the qwen27b_gateway group) drain and take back each backend of
    a batch, one at a time; the gateway hosts themselves are no backends and are skipped. `backends`:
    host -> the backends the gateways know it by (plan/gateway.backend_names: a host serving copies
    is HOST.NAME per copy, each drained, all its copies being restarted); a host not in it is itself."""

    def __init__(self, inventory: str, gateways: set[str] | frozenset[str] = frozenset(),
                 backends: dict[str, list[str]] | None = None):
        self.inventory, self.gateways, self.backends = inventory, set(gateways), dict(backends or {})

    def _backends(self, hosts: list[str]) -> list[str]:
        return [backend for name in hosts if name not in self.gateways for backend in self.backends.get(name, [name])]

    def drain(self, hosts: list[str]) -> None:
        from qwen27b.controller import gateway_drain  # noqa: PLC0415 (only a rollout that drains needs it)

        for name in self._backends(hosts):
            answers = gateway_drain.drain(self.inventory, name)
            if answers:
                print(f"--> rollout: drained {name} at {', '.join(a.gateway for a in answers)} "
                      f"(in-flight requests done after {max(a.seconds for a in answers):.1f} s)", flush=True)

    def undrain(self, hosts: list[str]) -> None:
        from qwen27b.controller import gateway_drain  # noqa: PLC0415

        for name in self._backends(hosts):
            answers = gateway_drain.undrain(self.inventory, name)
            if answers:
                print(f"--> rollout: back in the pool: {name} at {', '.join(a.gateway for a in answers)}", flush=True)


@dataclass
class HostRow:
    batch: int
    host: str
    outcome: str = "not started"
    detail: str = ""
    ttft_ms: float | None = None
    seconds: float | None = None  # the batch's deploy, wall clock
    comparison: dict | None = None  # verify's: the release before the switch against the new one (plan/loadpair.py)


@dataclass
class Rollout:
    batches: list[list[str]]
    rows: list[HostRow] = field(default_factory=list)
    stopped_at: str | None = None  # the first failed host
    gateways: set[str] = field(default_factory=set)  # hosts of the qwen27b_gateway group: no release to upgrade

    @property
    def ok(self) -> bool:
        return self.stopped_at is None and all(r.outcome == "ok" for r in self.rows)


def pyinfra_argv(inventory: str, deploy_file: str, limit: list[str], extra: list[str], dry: bool = False) -> list[str]:
    """The pyinfra command line of one run: `python -m pyinfra INVENTORY FILE -y|--dry --limit H...`."""
    limits = [part for name in limit for part in ("--limit", name)]
    return [sys.executable, "-m", "pyinfra", inventory, deploy_file, "--dry" if dry else "-y", *limits, *extra]


def new_report(reports: Path, before: set[str]) -> dict | None:
    """The run report the last run wrote (a deploy-*.json not in `before`), or None."""
    fresh = sorted(p for p in reports.glob("deploy-*.json") if p.name not in before) if reports.is_dir() else []
    for path in reversed(fresh):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return None


def batch_rows(number: int, batch: list[str], report: dict | None, code: int) -> list[HostRow]:
    """Each host's row from its run's report: the run summary's outcome, verify's TTFT."""
    outcomes = {o.get("host"): o for o in (report or {}).get("summary") or [] if isinstance(o, dict)}
    verified = {h.get("host"): h for h in (report or {}).get("hosts") or [] if isinstance(h, dict)}
    rows = []
    for name in batch:
        row = HostRow(number, name)
        outcome = outcomes.get(name)
        if outcome is None:
            row.outcome, row.detail = "failed", f"no outcome in a run report (pyinfra exit {code}): see its output above"
        else:
            row.outcome, row.detail = str(outcome.get("status") or "failed"), str(outcome.get("detail") or "")
        ttft = (verified.get(name) or {}).get("ttft_s")
        row.ttft_ms = round(ttft * 1000) if isinstance(ttft, (int, float)) else None
        comparison = (verified.get(name) or {}).get("comparison")
        row.comparison = comparison if isinstance(comparison, dict) else None
        if row.outcome == "ok" and row.comparison and row.comparison.get("verdict") in (REGRESSED, NOT_JUDGED):
            # a pair measured under different load is no pass: the rollout stops there, named (issue 58)
            row.outcome = "regressed" if row.comparison["verdict"] == REGRESSED else NOT_JUDGED
            row.detail = str(row.comparison.get("text") or "")
        rows.append(row)
    return rows


GATEWAY_DETAIL = "gateway: no release to upgrade (its config re-rendered where it changed, verified as a client)"


def rollout(inventory: str, batches: list[list[str]], extra: list[str], reports: Path, hooks: Hooks | None = None,
            deploy_file: str = "deploy.py", run=subprocess.run, say=print,
            gateways: set[str] | frozenset[str] = frozenset()) -> Rollout:
    """Deploy batch after batch; stop after the first batch with a host that is not ok. `gateways`:
    the gateway hosts among them (deployed and verified too, but never counted as upgraded)."""
    hooks = hooks or Hooks()
    result = Rollout(batches, gateways=set(gateways))
    for number, batch in enumerate(batches, 1):
        label = "canary" if number == 1 and len(batches) > 1 else f"batch {number}/{len(batches)}"
        say(f"--> rollout {label}: {', '.join(batch)}")
        before = {p.name for p in reports.glob("deploy-*.json")} if reports.is_dir() else set()
        started = time.monotonic()
        try:
            hooks.drain(batch)
        except Exception as error:  # noqa: BLE001 (a gateway's failure: the batch is not touched)
            rows = [HostRow(number, name, "failed", f"not deployed: drain failed: {error}") for name in batch]
            code = 1
        else:
            code = run(pyinfra_argv(inventory, deploy_file, batch, extra)).returncode
            rows = batch_rows(number, batch, new_report(reports, before), code)
            try:
                hooks.undrain([r.host for r in rows if r.outcome in SERVING])
            except Exception as error:  # noqa: BLE001
                for row in rows:
                    row.outcome, row.detail = "failed", f"deployed ({row.outcome}), but undrain failed: {error}"
                code = 1
        for row in rows:
            row.seconds = round(time.monotonic() - started, 1)
            if row.host in result.gateways and row.outcome == "ok" and not row.detail:
                row.detail = GATEWAY_DETAIL
        result.rows += rows
        bad = [r for r in rows if r.outcome != "ok"]
        if bad or code != 0:
            result.stopped_at = bad[0].host if bad else batch[0]
            result.rows += [HostRow(n, name) for n, later in enumerate(batches[number:], number + 1) for name in later]
            break
    return result


def summary(result: Rollout) -> str:
    rows = [[str(r.batch), r.host, r.outcome, "-" if r.ttft_ms is None else f"{r.ttft_ms:.0f} ms",
             "-" if r.seconds is None else f"{r.seconds:.0f} s", r.detail] for r in result.rows]
    text = table(["batch", "host", "outcome", "TTFT", "batch time", "detail"], rows, [5, 28, 12, 8, 10, 70])
    text += "".join(f"\nvs previous release: {r.host}: {r.comparison.get('text', '')}"
                    for r in result.rows if r.comparison)
    if result.ok:
        gateways = [r.host for r in result.rows if r.host in result.gateways]
        upgraded = len(result.rows) - len(gateways)
        return (f"--> rollout done: {upgraded} host(s) upgraded and verified, batch by batch"
                + (f"; gateway {', '.join(gateways)} verified (no release to upgrade)" if gateways else "") + f"\n{text}")
    failed = next(r for r in result.rows if r.host == result.stopped_at)
    left = [r.host for r in result.rows if r.outcome == "not started"]
    why = failed.detail.removeprefix(f"{failed.outcome}: ") or "see the output above"
    return (f"--> rollout STOPPED at {failed.host} ({failed.outcome}: {why})\n{text}\n"
            + (f"not started: {', '.join(left)} (still on their release)\n" if left else "")
            + (f"{failed.host} serves the slower release: roll it back with `qwen27b rollback INVENTORY --limit "
               f"{failed.host}` (or run with --rollback-on-regression), or raise the stack's serve.regression limit\n"
               if failed.outcome == "regressed" else "")
            + (f"{failed.host} serves the new release, not judged: the two measurements' loads differed on every try; "
               f"run the rollout again when the host's load is steady (the load counters are in the run report)\n"
               if failed.outcome == NOT_JUDGED else "")
            + "fix the cause, then run the same command again: upgraded hosts plan nothing and keep serving")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="qwen27b rollout", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s INVENTORY [options] [-- PYINFRA_ARGS ...]",
                                epilog="arguments after `--` go to every batch's pyinfra run, e.g.\n"
                                       "  qwen27b rollout inventory/mylab.py --canary gpu-c -- --data "
                                       "qwen27b_stack_overrides='{\"model_revision\": \"REV\"}'\n"
                                       "  qwen27b rollout inventory/mylab.py -- --data KEY=VALUE --data KEY2=VALUE2")
    p.add_argument("inventory", help="pyinfra inventory file (as for deploy.py)")
    p.add_argument("--limit", nargs="+", action="extend", metavar="HOST", help="only these hosts or groups (globs)")
    p.add_argument("--canary", nargs="+", action="extend", metavar="HOST",
                   help="deployed and verified alone, first (default: the first selected host)")
    p.add_argument("--batch-size", type=int, default=1, metavar="N", help="hosts per batch after the canary (default 1)")
    p.add_argument("--dry", action="store_true", help="print the batches and the commands, run nothing")
    p.add_argument("--rollback-on-regression", action="store_true",
                   help="a host verify measured slower or worse than its previous release (the stack's "
                        "serve.regression limits) is rolled back at once; default: left on the new release, "
                        "the rollout stops there")
    p.add_argument("--deploy-file", default="deploy.py", help="the deploy file (default deploy.py)")
    p.add_argument("--reports", type=Path, default=reports_dir(),
                   help="where the deploy writes its run reports (default $QWEN27B_REPORTS or ./reports)")
    return p.parse_args(argv), extra


def run_deploy_file(prog: str, deploy_file: str, about: str, argv: list[str], data: dict | None = None,
                    extra_options=None) -> int:
    """`qwen27b rollback|uninstall`: the real `pyinfra INVENTORY FILE -y|--dry --limit HOST...`,
    refusing to run on every host unless --all says so. `extra_options(parser)` adds options,
    whose values `data(args)` turns into pyinfra `--data key=value` arguments."""
    p = argparse.ArgumentParser(prog=prog, description=about)
    p.add_argument("inventory", help="pyinfra inventory file (as for deploy.py)")
    p.add_argument("--limit", nargs="+", action="extend", metavar="HOST", help="these hosts or groups (globs)")
    p.add_argument("--all", action="store_true", help="every host of the inventory (else --limit is required)")
    p.add_argument("--dry", action="store_true", help="print each host's plan, change nothing")
    if extra_options:
        extra_options(p)
    args = p.parse_args(argv)
    if not args.limit and not args.all:
        print(f"{prog}: name the hosts with --limit HOST (or --all for every host of the inventory)", file=sys.stderr)
        return 2
    extra = [part for key, value in (data(args) if data else {}).items() for part in ("--data", f"{key}={value}")]
    command = pyinfra_argv(args.inventory, deploy_file, args.limit or [], extra, dry=args.dry)
    print("--> pyinfra " + shlex.join(shown_argv(command[3:])), file=sys.stderr)
    return subprocess.run(command).returncode


def selected_hosts(inventory: str, limit: list[str] | None) -> tuple[list[str], set[str], dict[str, list[str]]]:
    """The inventory's host names in order, as `pyinfra INVENTORY ... --limit` selects them, the
    gateway hosts among them and each host's gateway backends (no host is contacted)."""
    from qwen27b.controller import remote
    from qwen27b.plan.gateway import backend_names, is_gateway

    _, hosts = remote.load_inventory(inventory, limit)
    if not hosts:
        raise ValueError("no host selected")
    return ([h.name for h in hosts], {h.name for h in hosts if is_gateway(h.groups)},
            {h.name: backend_names(h.name, dict(h.data.dict())) for h in hosts})


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.rollback_on_regression:
        extra = [*extra, "--data", f"{ROLLBACK_ON_REGRESSION}=true"]
    try:
        names, gateways, backends = selected_hosts(args.inventory, args.limit)
        batches = rollout_batches(names, args.canary, args.batch_size)
    except Exception as error:  # pyinfra raises many kinds for a bad inventory file
        print(f"rollout: {error}", file=sys.stderr)
        return 2
    hosts = [name for batch in batches for name in batch]
    print(f"--> rollout of {len(hosts)} host(s) in {len(batches)} batch(es): "
          + "; ".join(f"{n}) {', '.join(b)}" for n, b in enumerate(batches, 1)))
    if args.dry:
        for batch in batches:
            print("    pyinfra " + shlex.join(shown_argv(pyinfra_argv(args.inventory, args.deploy_file, batch, extra)[3:])))
        return 0
    result = rollout(args.inventory, batches, extra, args.reports, GatewayHooks(args.inventory, gateways, backends),
                     deploy_file=args.deploy_file, gateways=gateways)
    print("\n" + summary(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
