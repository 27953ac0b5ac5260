"""`qwen27b bench --methods off,mtp,dflash2 --inventory INV --host HOST`: the speculative methods
compared on one host in one run (issue 22).

For each method, in order (`off` first: the baseline every ratio is against), the host is deployed
with it by the real `pyinfra INV deploy.py -y --limit HOST --data qwen27b_speculative=METHOD`
(tools/rollout.py's command line and run-report reading); the run report says whether verify passed
and on which flags: a deploy whose verify fell back to another method (plan/retry.py) is benched and
reported as the method it ran, marked as a fallback, never as the method asked. Each verified
deployment is benched with the same prompts seed and options. Finally the host is deployed once more
with no --data, as its inventory says, whatever happened before (try/finally); a restore that fails
is said, loudly, and fails the command.

The pure parts (method list, what a report says ran, the comparison) are unit-tested
(tests/unit/slow/test_bench_methods.py); `run_methods` takes the deploy and the bench as arguments.
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from qwen27b.plan.hostdata import SPECULATIVE_MODES
from qwen27b.plan.settings import OPEN_API
from qwen27b.tools.bench.common import BenchError
from qwen27b.tools.bench.matrix import ab_compare
from qwen27b.tools.bench.output import _grid, _x

BASELINE = "off"
# auto is a choice the planner makes, not a method: a row named "auto" would not say what was measured
METHODS = tuple(m for m in SPECULATIVE_MODES if m != "auto")


def parse_methods(text: str) -> list[str]:
    """`off,mtp,dflash2` -> the methods in order, `off` first (added when missing: the baseline)."""
    names = [m.strip().lower() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise BenchError(f"--methods {text!r}: {', '.join(bad)} is not a method; use the stack's qwen27b_speculative "
                         f"values {', '.join(METHODS)} (auto is left out: it names no one method)")
    if len(set(names)) != len(names):
        raise BenchError(f"--methods {text!r}: a method is named twice")
    rest = [m for m in names if m != BASELINE]
    if not rest:
        raise BenchError(f"--methods {text!r}: name at least one method besides off to compare with it")
    return [BASELINE, *rest]


@dataclass
class Deployed:
    """What one deploy of the host did, as its run report says."""

    asked: str
    ok: bool
    ran: str | None = None  # the method verify passed on (None: not verified)
    flags: str = ""  # as plan/retry.py writes them: "speculative ngram (k=3)"
    detail: str = ""
    url: str = ""

    @property
    def fell_back(self) -> bool:
        return self.ok and self.ran != self.asked


def _method_of(flags: str) -> str | None:
    words = flags.split()
    return words[1].rstrip(",") if len(words) > 1 and words[0] == "speculative" else None


def deployed(report: dict | None, host: str, asked: str, code: int) -> Deployed:
    """The run report's word on `host`: its outcome, and the flags verify passed on. One start: the
    method asked (the plan ran it, verify passed); several (a retry): the last start's flags."""
    outcome = next((o for o in (report or {}).get("summary") or [] if isinstance(o, dict) and o.get("host") == host), None)
    result = next((h for h in (report or {}).get("hosts") or [] if isinstance(h, dict) and h.get("host") == host), {})
    if outcome is None:
        return Deployed(asked, False, detail=f"no outcome for {host} in a run report (pyinfra exit {code})")
    status, detail = str(outcome.get("status") or "failed"), str(outcome.get("detail") or "")
    if status != "ok":
        return Deployed(asked, False, detail=f"{status}: {detail}".rstrip(": "), url=str(result.get("url") or ""))
    attempts = [a for a in result.get("attempts") or [] if isinstance(a, dict)]
    if attempts:
        flags = str(attempts[-1].get("flags") or "")
        ran = _method_of(flags)
        detail = str(result.get("reason") or detail)
    else:
        flags, ran = f"speculative {asked}", asked
    return Deployed(asked, ran is not None, ran, flags, detail, str(result.get("url") or ""))


def _acceptance(level: dict) -> float | None:
    return level.get("spec_acceptance_rate")


def compare(entries: list[dict]) -> dict:
    """entries: [{method, deployed (Deployed as dict), run (bench.json) or None, error}], off first.
    Per method and concurrency: decode tok/s p50, TTFT p50, acceptance, and the ratio against off
    (matrix.ab_compare: decode as B/A, TTFT as A/B, so >1 is better for both)."""
    base = next((e["run"] for e in entries if e["method"] == BASELINE and e.get("run")), None)
    rows, warnings = [], []
    for e in entries:
        d, run = e["deployed"], e.get("run")
        label = e["method"] if not d.get("ok") or d.get("ran") == e["method"] else f"{e['method']} -> {d.get('ran')}"
        if not run:
            rows.append({"method": e["method"], "label": label, "ran": d.get("ran"), "flags": d.get("flags"),
                         "concurrency": None, "measured": False, "why": e.get("error") or d.get("detail") or "not run"})
            continue
        ab = ab_compare(base, run) if base and run is not base else None
        ratios = {r["concurrency"]: r for r in (ab or {}).get("rows", [])}
        if ab:
            warnings += [f"{e['method']}: {w}" for w in ab["warnings"]]
        for lv in run.get("levels", []):
            r = ratios.get(lv["concurrency"], {})
            rows.append({"method": e["method"], "label": label, "ran": d.get("ran"), "flags": d.get("flags"),
                         "concurrency": lv["concurrency"], "measured": bool(lv.get("ok")), "ok": lv.get("ok"),
                         "errors": lv.get("errors"), "decode_tok_s_p50": lv.get("decode_tok_s_p50"),
                         "ttft_p50_ms": lv.get("ttft_p50_ms"), "acceptance": _acceptance(lv),
                         "decode_vs_off": 1.0 if run is base else r.get("decode_tok_s"),
                         "ttft_vs_off": 1.0 if run is base else r.get("ttft_p50")})
    if base is None:
        warnings.append("off was not measured: no ratios")
    for e in entries:
        d, exported = e["deployed"], (e.get("run") or {}).get("spec_counters_exported")
        if exported is not None and exported != (d.get("ran") != BASELINE):  # the engine's own word
            warnings.append(f"{e['method']}: the report says {d.get('flags')}, but the endpoint "
                            f"{'exports' if exported else 'exports no'} spec-decode counters: check its ExecStart")
        if d.get("ok") and d.get("ran") != e["method"]:
            warnings.append(f"{e['method']} fell back to {d.get('ran')} at deploy ({d.get('detail')}): its row "
                            f"measures {d.get('ran')}, not {e['method']}")
    return {"rows": rows, "warnings": warnings}


def format_comparison(comparison: dict, host: str = "") -> str:
    grid = [["method", "flags verified", "conc", "decode tok/s p50", "TTFT p50", "acceptance", "decode vs off",
             "TTFT vs off"]]
    for r in comparison["rows"]:
        if r["concurrency"] is None:
            grid.append([r["label"], r.get("flags") or "-", "-", f"not measured: {r['why']}", "", "", "", ""])
            continue
        grid.append([r["label"], r.get("flags") or "-", str(r["concurrency"]),
                     "-" if r["decode_tok_s_p50"] is None else f"{r['decode_tok_s_p50']:.1f}",
                     "-" if r["ttft_p50_ms"] is None else f"{r['ttft_p50_ms']:.0f} ms",
                     "-" if r["acceptance"] is None else f"{r['acceptance']:.1%}",
                     _x(r["decode_vs_off"]), _x(r["ttft_vs_off"])])
    lines = [f"methods compared on {host}, one after another (ratios against off; >1 = better, TTFT as off/method):"
             if host else "methods compared (ratios against off; >1 = better, TTFT as off/method):", "", _grid(grid)]
    lines += [f"warning: {w}" for w in comparison["warnings"]]
    restore = comparison.get("restore")
    if restore:
        lines.append(f"host restored to its inventory's settings: {restore['detail']}" if restore["ok"] else
                     f"RESTORE FAILED: {host} is NOT back on its inventory's settings ({restore['detail']}); "
                     "re-run the plain deploy for it")
    return "\n".join(lines)


def api_key_file(data: dict, inventory: str) -> str | None:
    """The key file the deploy gives the host: its qwen27b_api_key_file, else the lab key
    (controller/apikey.lab_data); None for an open API. The key itself is read by measure."""
    from qwen27b.controller import apikey  # noqa: PLC0415 (only this mode reads an inventory)

    path = apikey.lab_data(dict(data), inventory).get("qwen27b_api_key_file")
    return None if not path or path == OPEN_API else str(path)


def host_data(inventory: str, host: str) -> tuple[dict, str]:
    """(the host's inventory data, the address the controller reaches it at); refuses an unknown host."""
    from qwen27b.controller import remote  # noqa: PLC0415

    try:
        _, hosts = remote.load_inventory(inventory)
    except Exception as error:  # noqa: BLE001 (pyinfra raises many kinds for a bad inventory file)
        raise BenchError(f"cannot load inventory {inventory}: {error}") from None
    match = [h for h in hosts if h.name == host]
    if not match:
        raise BenchError(f"--host {host}: no such host in {inventory} (hosts: {', '.join(h.name for h in hosts)})")
    data = dict(match[0].data.dict())
    return data, str(data.get("ssh_hostname") or host)


def reachable(url: str, address: str) -> str:
    """verify's URL names the serve --host; a wildcard bind is reached at the host's address."""
    for wildcard in ("0.0.0.0", "[::]"):
        if f"//{wildcard}:" in url:
            return url.replace(wildcard, address if ":" not in address else f"[{address}]", 1)
    return url


def run_methods(args, methods: list[str], deploy: Callable[[list[str]], tuple[int, dict | None]],
                bench: Callable, address: str, say=print) -> dict:
    """Deploy, read, bench each method; restore the host in `finally`. deploy(extra pyinfra args) ->
    (exit code, the run report it wrote); bench(args) -> a run (measure)."""
    entries, restore = [], None
    args.seed = args.seed if args.seed is not None else secrets.randbelow(2**31)  # the same prompts for all
    try:
        for method in methods:
            say(f"--> bench --methods: deploying {args.host} with qwen27b_speculative={method}")
            code, report = deploy(["--data", f"qwen27b_speculative={method}"])
            d = deployed(report, args.host, method, code)
            entry = {"method": method, "deployed": asdict(d), "run": None, "error": None}
            entries.append(entry)
            if not d.ok:
                entry["error"] = f"deploy did not verify: {d.detail}"
                say(f"--> {method}: {entry['error']}; not benched")
                continue
            if d.fell_back:
                say(f"--> {method}: the deploy fell back to {d.ran} ({d.flags}); benching what runs")
            one = copy.copy(args)
            one.url = args.url or reachable(d.url, address)
            one.out = Path(args.out) / method
            one.spec = "off" if d.ran == BASELINE else "on"
            try:
                entry["run"] = bench(one)
            except Exception as error:  # noqa: BLE001 (one method's failure: the next is still compared)
                entry["error"] = f"bench failed: {error}"
                say(f"--> {method}: {entry['error']}")
    finally:
        say(f"--> bench --methods: restoring {args.host} as the inventory says (the plain deploy, no --data)")
        try:
            code, report = deploy([])
            outcome = deployed(report, args.host, "", code)
            restore = {"ok": outcome.ok and code == 0, "detail": f"pyinfra exit {code}, verify: {outcome.detail or 'ok'}"}
        except Exception as error:  # noqa: BLE001 (said in the table and the exit code, never swallowed)
            restore = {"ok": False, "detail": f"the restore deploy raised {type(error).__name__}: {error}"}
        if not restore["ok"]:
            say(f"--> RESTORE FAILED for {args.host}: {restore['detail']}")
    comparison = compare(entries)
    comparison.update({"host": args.host, "inventory": args.inventory, "methods": methods, "seed": args.seed,
                       "restore": restore, "entries": [{k: v for k, v in e.items() if k != "run"} for e in entries]})
    return {"comparison": comparison, "runs": {e["method"]: e["run"] for e in entries if e["run"]}}


def pyinfra_deploy(inventory: str, host: str, deploy_file: str, reports: Path, run=subprocess.run):
    """deploy(extra) for run_methods: the real pyinfra run and the report it wrote (tools/rollout.py)."""
    from qwen27b.tools.rollout import new_report, pyinfra_argv  # noqa: PLC0415

    def deploy(extra: list[str]) -> tuple[int, dict | None]:
        before = {p.name for p in reports.glob("deploy-*.json")} if reports.is_dir() else set()
        code = run(pyinfra_argv(inventory, deploy_file, [host], extra)).returncode
        return code, new_report(reports, before)
    return deploy


def write_comparison(result: dict, out: Path, write_outputs) -> list[Path]:
    """bench.json (and csv/txt/png) per method under out/METHOD, comparison.json under out."""
    paths = []
    for method, run in result["runs"].items():
        paths += list(write_outputs(run, Path(out) / method).values())
    out.mkdir(parents=True, exist_ok=True)
    path = Path(out) / "comparison.json"
    path.write_text(json.dumps(result["comparison"], indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [*paths, path]
