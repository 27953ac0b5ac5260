"""A deploy's next start after a failed one, when a changed engine flag fixes the failure (issues 22
and 23): pure functions of the plan, the failure's evidence and the stack's `retry` section.

Two failures have a flag that fixes them: a speculative method whose measured acceptance is below
the stack's floor (engine.fallback names the next method; the last start allowed is speculation
off, so a host never stays slower than without it), and a start-up that makes no progress with
custom all-reduce on at TP > 1 (1Cat-vLLM issues 652, 430: --disable-custom-all-reduce fixed both).
Anything else fails as it did, with its evidence: a retry never hides a fault no flag fixes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass

from qwen27b.plan import engine
from qwen27b.plan.planner import Flag, ServePlan
from qwen27b.plan.stack import ResolvedStack

ACCEPTANCE, STALLED = "acceptance", "stalled"  # the failures a flag fixes
SPEC_FLAG, ALL_REDUCE_OFF = "--speculative-config", "--disable-custom-all-reduce"


@dataclass(frozen=True)
class Failure:
    """Why a start did not verify, as the planner reads it: `kind` ACCEPTANCE (with `next`, the
    method engine.fallback picked) or STALLED (the watchdog's evidence); anything else is None."""

    kind: str
    evidence: str
    next: engine.SpecChoice | None = None


@dataclass(frozen=True)
class Attempt:
    """One start of the service in this deploy, for the report and the release record."""

    number: int
    flags: str  # what this start ran with, as far as a retry changes it
    outcome: str  # verified | failed
    measured: dict  # ready_s, decode_tok_s, acceptance: what verify measured (None: not reached)
    why: str  # why it moved on (or "verified")

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def flags_tried(serve: ServePlan) -> str:
    """The flags a retry can change, as this start ran them."""
    spec = f"speculative {serve.spec.method}" + (f" (k={serve.spec.depth})" if serve.spec.on else "")
    if not serve.has("--tensor-parallel-size") or int(serve.value("--tensor-parallel-size")) < 2:
        return spec
    return spec + (", custom all-reduce off" if serve.has(ALL_REDUCE_OFF) else ", custom all-reduce on")


def _pinned(serve: ServePlan, name: str) -> bool:
    return any(flag.name == name and flag.pinned for flag in serve.flags)


def _with_spec(stack: ResolvedStack, serve: ServePlan, choice: engine.SpecChoice, draft_path: str | None) -> ServePlan:
    """`serve` with `choice` in place of its speculative method (off: the flag removed)."""
    flags = [flag for flag in serve.flags if flag.name != SPEC_FLAG]
    if choice.on:
        value = json.dumps(engine.speculative_config(stack, choice, draft_path), separators=(",", ":"))
        at = next((i for i, flag in enumerate(serve.flags) if flag.name == SPEC_FLAG), len(flags))
        flags.insert(at, Flag(SPEC_FLAG, value, choice.reason))
    return dataclasses.replace(serve, flags=flags, spec=choice)


def plan_retry(stack: ResolvedStack, serve: ServePlan, draft_path: str | None, failure: Failure | None,
               starts: int) -> tuple[ServePlan | None, str]:
    """The flags of the next start after `starts` starts, the last of which failed with `failure`:
    (the new ServePlan, what changed and why) or (None, why there is no retry)."""
    most = int((stack.retry or {}).get("max_attempts", 1))
    if failure is None:
        return None, "no engine flag fixes this failure"
    if starts >= most:
        return None, f"{starts} start(s) made, the stack's retry.max_attempts is {most}"
    if failure.kind == ACCEPTANCE:
        if _pinned(serve, SPEC_FLAG):
            return None, f"{SPEC_FLAG} is pinned in host data (qwen27b_serve_flags): unpin it to let the deploy fall back"
        choice = failure.next or engine.OFF
        if choice.on and starts + 1 >= most:  # the last start allowed: never leave a host on a method below its floor
            choice = engine.SpecChoice("off", 0, f"{choice.reason}; but start {starts + 1} is the last of "
                                                 f"retry.max_attempts {most}: speculation off")
        return _with_spec(stack, serve, choice, draft_path), \
            f"{failure.evidence}: restarting with speculative {choice.method} ({choice.reason})"
    if failure.kind == STALLED:
        tp = int(serve.value("--tensor-parallel-size")) if serve.has("--tensor-parallel-size") else 1
        if tp < 2:
            return None, f"{failure.evidence}; at TP {tp} there is no custom all-reduce to turn off"
        if serve.has(ALL_REDUCE_OFF):
            return None, f"{failure.evidence}; custom all-reduce is already off: no flag left that fixes a stalled start"
        flags = list(serve.flags) + [Flag(ALL_REDUCE_OFF, None, f"retry: {failure.evidence} "
                                                                 f"{stack.cite(['1cat-652', '1cat-430'])}")]
        return dataclasses.replace(serve, flags=flags), \
            (f"{failure.evidence}: stopped, restarting once with {ALL_REDUCE_OFF} (the start-up deadlock and the "
             f"capture that never converged went away with it) {stack.cite(['1cat-652', '1cat-430'])}")
    return None, f"no engine flag fixes a {failure.kind} failure"


def _flag_lines(serve: ServePlan) -> list[str]:
    return [f"{f.name} {f.value}" if f.value is not None else f.name for f in serve.flags]


def _method_of(stack: ResolvedStack, config: dict) -> str | None:
    """Our method name for a --speculative-config the planner wrote (its `method`), or None."""
    if config.get("method") == (stack.speculative.get("mtp") or {}).get("method"):
        return "mtp"
    if config.get("method") == (stack.speculative.get("ngram") or {}).get("method"):
        return "ngram"
    if stack.draft and config.get("method") == stack.draft["speculative"]["method"]:
        return "dflash2"
    return None


def carry_over(stack: ResolvedStack, serve: ServePlan, draft_path: str | None, recorded: tuple,
               attempts: tuple) -> tuple[ServePlan, str | None]:
    """Where the host's release record says the last deploy of this very plan (same flags but the two a
    retry changes; the caller checks release and model) verified only after a retry: the flags that
    verified, and why; else (serve, None). Without it every deploy would restart a serving host on the
    flags that failed, measure again and fall back again."""
    if len(attempts) < 2 or attempts[-1].get("outcome") != "verified" or attempts[0].get("flags") != flags_tried(serve):
        return serve, None
    if any(flag.pinned and flag.name in (SPEC_FLAG, ALL_REDUCE_OFF) for flag in serve.flags):
        return serve, None

    def others(lines) -> list[str]:
        return sorted(line for line in lines if not line.startswith((SPEC_FLAG, ALL_REDUCE_OFF)))

    if others(_flag_lines(serve)) != others(recorded):
        return serve, None
    why = (f"carried from the last deploy of these flags, verified on start {len(attempts)} after "
           f"{attempts[-2].get('why', '')[:300]}")
    spec = [line[len(SPEC_FLAG) + 1:] for line in recorded if line.startswith(SPEC_FLAG + " ")]
    if spec and serve.has(SPEC_FLAG) and spec[0] == serve.value(SPEC_FLAG):
        pass  # the method the plan picks is the one that verified
    elif spec:
        if not serve.has(SPEC_FLAG):
            return serve, None  # the plan turned speculation off since: nothing to carry
        try:
            config = json.loads(spec[0])
            method = _method_of(stack, config)
            choice = engine.SpecChoice(method, int(config.get("num_speculative_tokens") or 0), why)
        except (ValueError, TypeError, AttributeError):
            return serve, None
        # only a value this planner writes reaches the unit (the record is the host's file)
        if method is None or _with_spec(stack, serve, choice, draft_path).value(SPEC_FLAG) != spec[0]:
            return serve, None
        serve = _with_spec(stack, serve, choice, draft_path)
    elif serve.spec.on:
        serve = _with_spec(stack, serve, engine.SpecChoice("off", 0, why), None)
    if ALL_REDUCE_OFF in recorded and not serve.has(ALL_REDUCE_OFF):
        serve = dataclasses.replace(serve, flags=list(serve.flags) + [Flag(ALL_REDUCE_OFF, None, why)])
    return serve, f"retry: starting on {flags_tried(serve)}, {why}"


def plan_notes(stack: ResolvedStack, serve: ServePlan) -> list[str]:
    """The plan's lines for what verify will retry on this host, with their sources."""
    rule, most = (stack.retry or {}).get("start_watchdog"), int((stack.retry or {}).get("max_attempts", 1))
    lines = []
    if serve.spec.on and most > 1:
        lines.append(f"retry: {serve.spec.method} measured below its acceptance floor restarts on the next method, the "
                     f"last of at most {most} starts with speculation off {stack.cite(stack.retry.get('source'))}")
    probe = (stack.speculative.get(serve.spec.method) or {}).get("probe") if serve.spec.on else None
    if probe:
        lines.append(f"verify measures {serve.spec.method} on a greedy {probe['max_tokens']}-token completion of text "
                     f"that repeats itself (its chat drafts too little to judge) "
                     f"{stack.cite(stack.speculative[serve.spec.method].get('source'))}")
    timeout = stack.profile["serve"].get("start_timeout_s", 0)
    if rule and float(rule["no_progress_s"]) >= timeout:
        lines.append(f"start-up watchdog: its bound {rule['no_progress_s']} s is not below this profile's start_timeout_s "
                     f"{timeout} s: the start's timeout alone applies")
    elif rule:
        tp = int(serve.value("--tensor-parallel-size")) if serve.has("--tensor-parallel-size") else 1
        then = ("restarted once with --disable-custom-all-reduce (on at TP " f"{tp} here)" if tp > 1 and not
                serve.has(ALL_REDUCE_OFF) and most > 1 else "the host failed with the evidence (no flag to retry with)")
        lines.append(f"start-up watchdog: a start whose journal says nothing new for {rule['no_progress_s']} s while "
                     f"/health is silent is stopped and {then} {stack.cite(rule.get('source'))}")
    return lines


# --- the start-up watchdog ------------------------------------------------------------------------

_UNIX = re.compile(r"^(\d{9,11}(?:\.\d+)?) ")  # journalctl -o short-unix
_SHORT = re.compile(r"^([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) ")  # journalctl's default (recorded journals)


def line_time(line: str, year: int = 2026) -> float | None:
    """A journal line's time (epoch seconds), from short-unix or the default short format."""
    found = _UNIX.match(line)
    if found:
        return float(found.group(1))
    found = _SHORT.match(line)
    if found:
        return time.mktime(time.strptime(f"{year} {found.group(1)}", "%Y %b %d %H:%M:%S"))
    return None


def start_stalled(journal: str, now: float, unit_state: str, watchdog: dict) -> str | None:
    """Evidence that a start makes no progress, or None. Called only while /health does not answer:
    the unit still activating and no journal line of this start but `idle_lines` (vLLM's shm_broadcast
    wait, logged every minute by a deadlocked start) for `no_progress_s`. No lines, no verdict: the
    start's own timeout still applies."""
    if not unit_state.startswith("activating"):
        return None
    bound = float(watchdog["no_progress_s"])
    idle = [text for text in watchdog.get("idle_lines") or []]
    last, idle_since = None, 0
    for line in journal.splitlines():
        at = line_time(line)
        if at is None:
            continue
        if any(text in line for text in idle):
            idle_since += 1
        else:
            last, idle_since = (at, line), 0
    if last is None:
        return None
    quiet = now - last[0]
    if quiet < bound:
        return None
    said = last[1].split(": ", 1)[-1].strip()[:160]
    return (f"start-up made no progress for {quiet:.0f} s (bound {bound:.0f} s, retry.start_watchdog): unit "
            f"{unit_state}, /health not answering, last journal line {said!r}"
            + (f", {idle_since} idle line(s) since" if idle_since else ""))
