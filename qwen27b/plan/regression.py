"""Is the new release slower or worse than the one it replaced on the same host? (issue 26, part 3)

A minor engine bump can cost speculative acceptance (16% DFlash2 acceptance for one team:
syv-ai/qwen38-27b-rtx3090#73) or speed while every verify check still passes. Verify measures the
same fixed prompt set the same way on every deploy, after the unit's warm-up (`figures`: the best
of each figure over the runs, since other work on the machine only ever slows a run: the best run is
the nearest to the release's own speed), keeps the figures in the release record, and `compare`s them with the
previous release's record: worse by more than the stack's limit (profile `serve.regression`,
settable per host with qwen27b_stack_overrides) is a regression, named figure by figure.

Pure: numbers in, a verdict out (no host I/O).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

FIGURES = ("decode_tok_s", "ttft_ms", "acceptance")
LIMIT_KEYS = {"decode_tok_s": "max_decode_drop", "ttft_ms": "max_ttft_rise", "acceptance": "max_acceptance_drop"}
LABELS = {"decode_tok_s": "decode tok/s", "ttft_ms": "TTFT ms", "acceptance": "acceptance"}
HIGHER_IS_BETTER = {"decode_tok_s": True, "ttft_ms": False, "acceptance": True}
PASSED, REGRESSED, NO_BASELINE = "passed", "regressed", "no baseline"


def prompt_set(limits: dict) -> str:
    """What the figures were measured on, as 12 hex digits of a hash of the prompts and max_tokens:
    figures taken on another set (the stack's prompts changed between two releases) are not compared."""
    text = json.dumps({"prompts": limits["prompts"], "max_tokens": limits["max_tokens"]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def figures(runs: list[dict], acceptance: float | None = None, measured_on: str | None = None) -> dict:
    """The best of the measuring runs (each {"ttft_s", "decode_tok_s"}: one streamed completion): the
    shortest TTFT and the fastest decode, with the acceptance verify measured; the run count says how
    many runs the best was taken from. Not the median: a deploy's neighbours (another host's start,
    a test tier on the same cores) slow some runs and never speed one up, and on the CPU test hosts
    the medians of one release moved 5x between deploys (docs/lifecycle.md). `measured_on`: the
    prompt_set they were measured on, kept beside them."""
    ttft = [r["ttft_s"] * 1000 for r in runs if isinstance(r.get("ttft_s"), (int, float))]
    decode = [r["decode_tok_s"] for r in runs if isinstance(r.get("decode_tok_s"), (int, float))]
    return {"ttft_ms": round(min(ttft), 1) if ttft else None,
            "decode_tok_s": round(max(decode), 2) if decode else None,
            "acceptance": round(acceptance, 4) if isinstance(acceptance, (int, float)) else None, "runs": len(runs),
            **({"prompt_set": measured_on} if measured_on else {})}


def check_limits(limits: dict) -> None:
    """The stack's (or a host's override of) serve.regression: each limit a fraction (0.25: 25% worse
    is allowed; a drop below 1, a rise up to 10), at least one prompt, one repeat and one token.
    ValueError names the key."""
    for figure, key in LIMIT_KEYS.items():
        value, top = limits.get(key), 1 if HIGHER_IS_BETTER[figure] else 10
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < top:
            raise ValueError(f"{key} must be a fraction from 0 to below {top} (0.25: 25% worse allowed), got {value!r}")
    for key in ("repeats", "max_tokens"):
        value = limits.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a whole number of 1 or more, got {value!r}")
    prompts = limits.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"prompts must be a list of one or more non-empty strings, got {prompts!r}")
    check_load_limits(limits)  # the rollout gate's pair: after-measurements and load allowances


# the rollout gate's pair (plan/loadpair.py): how far the two measurements' loads may differ
LOAD_KEYS = {"max_requests_diff": "requests", "max_cpu_diff": "cpu", "max_gpu_diff": "gpu"}


def check_load_limits(limits: dict) -> None:
    """serve.regression's `pairs` (after-measurements at most, 1-5) and `load` allowances (requests: a
    count, cpu: a share 0-1, gpu: percentage points 0-100). ValueError names the key."""
    pairs = limits.get("pairs")
    if isinstance(pairs, bool) or not isinstance(pairs, int) or not 1 <= pairs <= 5:
        raise ValueError(f"pairs must be a whole number from 1 to 5 (after-measurements to find a like load), got {pairs!r}")
    load = limits.get("load")
    if not isinstance(load, dict) or set(load) - {*LOAD_KEYS, "source"} or not set(LOAD_KEYS) <= set(load):
        raise ValueError(f"load must map {', '.join(LOAD_KEYS)} to allowances, got {load!r}")
    for key, top in (("max_requests_diff", 1000), ("max_cpu_diff", 1), ("max_gpu_diff", 100)):
        value = load[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
            raise ValueError(f"load.{key} must be a number from 0 to {top}, got {value!r}")



@dataclass(frozen=True)
class Change:
    """One figure, before -> after: `change` is the relative change in the worse direction (0.3: 30%
    worse; negative: better), `limit` the stack's allowance, `worse` when it goes past it."""

    figure: str
    before: float
    after: float
    change: float
    limit: float

    @property
    def worse(self) -> bool:
        return self.change > self.limit

    def text(self) -> str:
        sign = "-" if HIGHER_IS_BETTER[self.figure] else "+"
        moved = (self.after - self.before) / self.before * 100 if self.before else 0.0
        return (f"{LABELS[self.figure]} {self.before:g} -> {self.after:g} ({moved:+.0f}%, "
                f"limit {sign}{self.limit * 100:.0f}%)")


@dataclass(frozen=True)
class Comparison:
    verdict: str  # passed | regressed | no baseline
    changes: tuple[Change, ...] = ()
    unmeasured: tuple[str, ...] = ()  # figures one of the two releases lacks (acceptance with speculation off)
    why: str = ""  # no baseline: why not

    @property
    def regressed(self) -> bool:
        return self.verdict == REGRESSED

    def text(self) -> str:
        if self.verdict == NO_BASELINE:
            return self.why or "no previous release with verify figures on this host: nothing to compare"
        worse = [c for c in self.changes if c.worse]
        shown = worse if worse else self.changes
        head = "REGRESSED: " if worse else "within limits: "
        return head + "; ".join(c.text() for c in shown) if shown else head + "no figure measured on both"

    def as_json(self) -> dict:
        return {"verdict": self.verdict, "text": self.text(),
                "figures": [{"figure": c.figure, "before": c.before, "after": c.after, "change": round(c.change, 4),
                             "limit": c.limit, "worse": c.worse} for c in self.changes],
                **({"unmeasured": list(self.unmeasured)} if self.unmeasured else {})}


def compare(previous: dict | None, new: dict, limits: dict) -> Comparison:
    """The new release's figures against the previous release's on the same host. A figure is worse
    when it moved the wrong way by more than its limit, relative to the previous value (decode tok/s
    and acceptance down, TTFT up). No previous figures: no baseline (a first deploy, an older record);
    figures of another prompt set neither (a record without one is compared: older releases' set)."""
    if not previous or not any(isinstance(previous.get(f), (int, float)) for f in FIGURES):
        return Comparison(NO_BASELINE)
    before_set, after_set = previous.get("prompt_set"), new.get("prompt_set")
    if before_set and after_set and before_set != after_set:
        return Comparison(NO_BASELINE, why=f"the previous release was measured on another prompt set ({before_set}, now "
                                           f"{after_set}: the stack's serve.regression prompts or max_tokens changed): "
                                           f"nothing to compare, this release's figures are the next one's baseline")
    changes, unmeasured = [], []
    for figure in FIGURES:
        before, after = previous.get(figure), new.get(figure)
        if not isinstance(before, (int, float)) or not isinstance(after, (int, float)) or before <= 0:
            if before is not None or after is not None:
                unmeasured.append(figure)
            continue
        relative = (after - before) / before
        changes.append(Change(figure, before, after, -relative if HIGHER_IS_BETTER[figure] else relative,
                              float(limits[LIMIT_KEYS[figure]])))
    verdict = REGRESSED if any(c.worse for c in changes) else PASSED
    return Comparison(verdict, tuple(changes), tuple(unmeasured))
