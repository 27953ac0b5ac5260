"""The rollout gate's two measurements and their judgement (issue 58; the pure part is
qwen27b/plan/loadpair.py): the serving release measured right before the service role restarts the
unit (`before_switch`, an operation of that role), the new one by verify right after it verified
(`judge`), each bracketed by readings of the host's load counters, the pair judged by loadpair.

Both are measured the same way: the stack's prompt set (the new deploy's serve.regression, so the
same prompts and max_tokens on both sides), each run with its own cache_salt (postdeploy.measure),
the same API key, while a rollout's gateway has the host drained. The figures stored in the release
records (verify's at each deploy) stay as history; the comparison's "before" is this window's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request

from qwen27b.controller import postdeploy as V
from qwen27b.controller import runstate
from qwen27b.onhost.contract import SERVICE_UNIT
from qwen27b.onhost.unit import show_command
from qwen27b.plan import loadpair, regression
from qwen27b.plan.lifecycle import RECORD_NAME, Record, parse_record, record_text, release_record_file, verify_figures

# one reading of the host's counters; the unit name is ours (allow-listed below), never host data
SAMPLE = ("echo \"stat $(head -1 /proc/stat)\"; echo \"hz $(getconf CLK_TCK)\"; "
          "echo \"service $({cpu_usage})\"; "
          # no CPU accounting (cgroup v1 hosts, CPUAccounting=no): the unit's processes' own and reaped
          # children's ticks from /proc, the processes listed in its cgroup (v2, or v1's unified tree)
          "cg=$({control_group}); for f in /sys/fs/cgroup$cg/cgroup.procs "
          "/sys/fs/cgroup/unified$cg/cgroup.procs; do if [ -n \"$cg\" ] && [ -r \"$f\" ]; then t=0; "
          "for p in $(cat \"$f\"); do [ \"$p\" -gt 0 ] 2>/dev/null || continue; s=$(cat /proc/$p/stat 2>/dev/null) "
          "|| continue; s=${{s##*)}}; set -- $s; t=$((t+${{12}}+${{13}}+${{14}}+${{15}})); done; echo \"unit_ticks $t\"; "
          "break; fi; done; "
          "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=utilization.gpu "
          "--format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu /'; fi")
UNIT = re.compile(r"qwen27b(@[a-z0-9][a-z0-9-]{0,30})?\.service")
GAUGE = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
BEFORE_TIMEOUT_S = 180  # a completion of the serving release before the switch (the slowest measured: 68 s)
PAIR_ALIKE = "pair_alike"  # in the record's baseline: 1 judged on alike load, 0 refused (a re-run refuses again)


def other_requests(metrics_text: str) -> float | None:
    """Requests in flight (running + waiting) from a /metrics scrape taken while none of ours was:
    other clients'. None when the scrape has no such gauge (unreachable, another engine)."""
    values = GAUGE.findall(metrics_text or "")
    return sum(float(v) for v in values) if values else None


def sample_command(unit: str) -> str:
    """SAMPLE for `unit`, its two systemctl reads built by the one builder (onhost/unit.show_command)."""
    return SAMPLE.format(cpu_usage=show_command(unit, ("CPUUsageNSec",), value=True),
                         control_group=show_command(unit, ("ControlGroup",), value=True))


def measured(url: str, served_name: str, key: str | None, limits: dict, remote, unit: str = SERVICE_UNIT,
             acceptance: float | None = None, timeout: float = 600) -> tuple[dict, loadpair.Load]:
    """The stack's prompt set measured once (regression.figures) with the load beside it: `remote(cmd)`
    runs a read on the host and returns its stdout lines."""
    if not UNIT.fullmatch(unit):
        raise ValueError(f"not a qwen27b unit name: {unit!r}")
    sample = sample_command(unit)
    start, first = loadpair.parse_sample(remote(sample)), other_requests(V.scrape(url, key))
    runs = V.measure(url, served_name, key, limits, timeout=timeout)
    last, end = other_requests(V.scrape(url, key)), loadpair.parse_sample(remote(sample))
    figures = regression.figures(runs, acceptance, measured_on=regression.prompt_set(limits))
    return figures, loadpair.window_load(start, end, [first, last])


def host_reads(host, state=None):
    """`remote` for `measured`: a read on the host with its sudo settings; its stdout lines ([] on failure)."""
    from qwen27b.controller.remote import on_host  # noqa: PLC0415 (pyinfra's, only when a host is there)

    def read(command: str) -> list[str]:
        ok, output = on_host(host, command, state=state)
        return list(output.stdout_lines) if ok else []

    return read


def before_switch(state, host, url: str, served_name: str, key: str | None, limits: dict) -> bool:
    """The service role's operation right before the restart: the serving release measured (its own
    URL and served name, from its record), kept in the run state for verify's judgement. A release
    that does not answer is said and the run goes on: the judgement then has no before (no baseline)."""
    run = runstate.of(state)
    try:
        # a release that is not serving (crashed, frozen: the deploy may be its fix) costs the deploy 5 s,
        # not a completion's 600 s time-out; one that serves gets BEFORE_TIMEOUT_S a completion
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            response.read()
        figures, load = measured(url, served_name, key, limits, host_reads(host, state), timeout=BEFORE_TIMEOUT_S)
    except (V.VerifyFailed, OSError, ValueError) as error:  # urllib's errors are OSErrors
        run.before_switch[host.name] = {"error": f"the serving release did not answer the measurement: {error}"}
        print(f"    [{host.name}] before the switch: the serving release did not answer the measurement ({error})",
              flush=True)
        return True
    run.before_switch[host.name] = {"figures": figures, "load": load}
    print(f"    [{host.name}] before the switch: the serving release measured {figures.get('ttft_ms')} ms TTFT, "
          f"{figures.get('decode_tok_s')} tok/s ({load.text()})", flush=True)
    return True


def read_record(remote, path: str) -> Record | None:
    try:
        return parse_record(json.loads("\n".join(remote(f"cat {path} 2>/dev/null")) or "null"))
    except ValueError:
        return None


def judge(result: V.HostResult, key: str | None, decision, replaced: bool, rollback_dir: str, remote, write,
          say) -> regression.Comparison | loadpair.PairVerdict | None:
    """Verify's judgement of the release (roles/verify.py): after a deploy that replaced the running
    release, this one measured (again, at most `pairs` times, while its load differs from the before's)
    and judged against the before-the-switch measurement; the record keeps the pair (verify, baseline)
    and the kept record its own history. A deploy that restarted nothing judges the recorded pair again
    (a refused pair is refused again). Returns the verdict when it stops a rollout (regressed or not
    judged), else None; the report gets it either way."""
    limits = decision.stack.profile["serve"].get("regression")
    path = release_record_file(decision.stack.paths)
    record = read_record(remote, path)
    if not limits or record is None:
        return None
    if not replaced and record.verify:
        result.figures = dict(record.verify)
        if record.baseline.get(PAIR_ALIKE) == 0:
            verdict = loadpair.PairVerdict(loadpair.NOT_JUDGED, None, None, None, None, int(limits["pairs"]),
                                           int(limits["pairs"]))
            result.comparison = {**verdict.as_json(), "text": "NOT JUDGED: the recorded pair was measured under "
                                 "different load; redeploy the release (or roll it back) to measure it again"}
            say(f"against the release before the switch (recorded): {result.comparison['text']}")
            return verdict
        comparison = regression.compare(record.baseline, record.verify, limits)
        result.comparison = comparison.as_json()
        say(f"against the release before the switch (recorded figures): {comparison.text()}")
        return comparison if comparison.regressed else None
    before = runstate.current().before_switch.pop(result.host, None) if replaced else None
    figures, load = measured(result.url, result.served_name, key, limits, remote, acceptance=result.acceptance)
    history = read_record(remote, f"{rollback_dir}/{RECORD_NAME}") if replaced else None
    if before is None or "figures" not in before:
        why = (before or {}).get("error") or ("a first deploy: no serving release to measure before the switch"
                                              if not replaced else "the serving release was not measured before the switch")
        comparison = regression.Comparison(regression.NO_BASELINE, why=f"no baseline: {why}" + (
            f" (history: its figures at its deploy were {verify_figures(history.verify)})" if history and history.verify else ""))
        verdict, baseline = comparison, {}
    else:
        for attempt in range(1, int(limits["pairs"]) + 1):
            verdict = loadpair.judge_pair(before["figures"], before["load"], figures, load, limits, attempt)
            if not verdict.again:
                break
            say(verdict.text())
            figures, load = measured(result.url, result.served_name, key, limits, remote, acceptance=result.acceptance)
        baseline = {**before["figures"], PAIR_ALIKE: 0 if verdict.verdict == loadpair.NOT_JUDGED else 1}
    result.figures = figures
    write(path, record_text(dataclasses.replace(record, verify=verify_figures(figures), baseline=verify_figures(baseline))))
    result.comparison = verdict.as_json()
    if history is not None and history.verify:
        result.comparison["history"] = verify_figures(history.verify)  # the previous release's at its deploy: not judged on
    say(f"against the release before the switch ({figures.get('runs')} runs): {verdict.text()}")
    stops = verdict.verdict in (regression.REGRESSED, loadpair.NOT_JUDGED)
    return verdict if stops else None
