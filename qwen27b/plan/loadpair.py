"""The rollout gate's pair: the serving release measured right before the switch and the new one right
after, each with the load the host carried meanwhile, judged only when the two loads were alike
(issue 58, part 1).

A number from the last deploy (another day, another load) compared with one from today compares
nothing: on the CPU test hosts a release's stored TTFT of 4219 ms (measured under the other e2e
process's load) let a release four times slower pass as +126%. So the gate measures both releases in
one window and reads, around each measurement, the host's own counters of load that is not the
measurement's: vLLM's running + waiting requests (other clients'), the share of the machine's CPU
time spent outside the serving unit, and the GPUs' utilisation before the runs. Two measurements
whose loads differ by more than the stack's `serve.regression.load` allowances are not a pair: the
after side is measured again (at most `pairs` times in all) and then the gate refuses to judge; it
never passes by default. A counter missing on either side is named, never treated as alike.

Pure: counters in, a verdict out (the reading is qwen27b/controller/pairmeasure.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen27b.plan import regression

NOT_JUDGED = "not judged"  # the loads of the pair differed on every try, or were never read: the rollout stops
LOAD_KEYS = regression.LOAD_KEYS
check_load_limits = regression.check_load_limits  # the stack's check of these limits: beside the others
COUNTERS = {"requests": "other clients' running + waiting requests (vLLM's gauges)",
            "cpu": "CPU busy outside the serving unit (share of the machine)",
            "gpu": "GPU utilisation before the runs (%)"}


@dataclass(frozen=True)
class Load:
    """The load a measurement ran beside: None where the counter could not be read."""

    requests: float | None = None  # other clients' requests in flight (running + waiting), the most seen
    cpu: float | None = None  # 0..1: the machine's CPU time outside the serving unit during the runs
    gpu: float | None = None  # 0..100: the busiest GPU's utilisation just before the runs

    def text(self) -> str:
        parts = [f"{self.requests:g} other request(s)" if self.requests is not None else "requests unread",
                 f"CPU {self.cpu * 100:.0f}% outside the unit" if self.cpu is not None else "CPU unread",
                 f"GPU {self.gpu:.0f}%" if self.gpu is not None else "no GPU reading"]
        return ", ".join(parts)

    def as_json(self) -> dict:
        return {"requests": self.requests, "cpu": None if self.cpu is None else round(self.cpu, 3), "gpu": self.gpu}


def parse_sample(lines: list[str]) -> dict:
    """One reading of the host's counters (pairmeasure.SAMPLE's output): the `cpu` line of /proc/stat
    (busy and total jiffies), the clock tick, the serving unit's CPUUsageNSec (or, without CPU
    accounting, its processes' ticks from /proc), each GPU's utilisation.
    Anything unreadable is left out (never a zero)."""
    out: dict = {}
    for line in lines:
        key, _, rest = line.partition(" ")
        words = rest.split()
        if key == "stat" and len(words) >= 5 and words[0] == "cpu" and all(w.isdigit() for w in words[1:]):
            ticks = [int(w) for w in words[1:9]]
            out["total"], out["busy"] = sum(ticks), sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
        elif key == "hz" and words and words[0].isdigit() and int(words[0]) > 0:
            out["hz"] = int(words[0])
        elif key == "service" and words and words[0].isdigit():
            out["service_ns"] = int(words[0])
        elif key == "unit_ticks" and words and words[0].isdigit():
            out["unit_ticks"] = int(words[0])
        elif key == "gpu" and words and words[0].replace(".", "", 1).isdigit():
            out["gpu"] = max(out.get("gpu", 0.0), float(words[0]))
    return out


def window_load(start: dict, end: dict, requests: list[float | None]) -> Load:
    """The load beside one measurement, from the readings before and after it: the CPU share outside
    the serving unit (busy jiffies minus the unit's own CPU time, over all jiffies), the GPUs' before,
    and the most other requests vLLM's gauges showed (read while none of ours was in flight)."""
    cpu, own = None, None
    if "service_ns" in start and "service_ns" in end and "hz" in start:  # systemd's CPU accounting
        own = (end["service_ns"] - start["service_ns"]) / 1e9 * start["hz"]
    elif "unit_ticks" in start and "unit_ticks" in end:  # the unit's processes' ticks (/proc)
        own = end["unit_ticks"] - start["unit_ticks"]
    if own is not None and all(k in start and k in end for k in ("total", "busy")) and end["total"] > start["total"]:
        cpu = min(1.0, max(0.0, (end["busy"] - start["busy"] - own) / (end["total"] - start["total"])))
    seen = [r for r in requests if r is not None]
    return Load(requests=max(seen) if seen else None, cpu=cpu, gpu=start.get("gpu"))


@dataclass(frozen=True)
class LoadCheck:
    alike: bool  # every counter read on both sides within its allowance
    differences: tuple[str, ...] = ()  # "CPU outside the unit 12% -> 71% (allowance 25 points)"
    missing: tuple[str, ...] = ()  # counters not read on one side or both: named, never assumed alike

    def text(self) -> str:
        said = list(self.differences) + [f"{COUNTERS[m]}: not read" for m in self.missing]
        return "; ".join(said) if said else "alike"


def compare_load(before: Load, after: Load, allowances: dict) -> LoadCheck:
    """Were the two measurements taken under alike load? Each counter read on both sides must differ
    by no more than its allowance; a counter read on neither or one side is named as missing. With no
    counter read on both sides nothing says the loads were alike: not alike."""
    differences, missing, compared = [], [], 0
    for key, name in LOAD_KEYS.items():
        x, y = getattr(before, name), getattr(after, name)
        if x is None or y is None:
            if name != "gpu" or x is not None or y is not None:  # no GPU on either side: nothing to read, not missing
                missing.append(name)
            continue
        compared += 1
        scale = 100 if name == "cpu" else 1
        if abs(y - x) * scale > allowances[key] * scale + 1e-9:
            unit = "%" if name in ("cpu", "gpu") else ""
            differences.append(f"{COUNTERS[name]} {x * scale:.0f}{unit} -> {y * scale:.0f}{unit} "
                               f"(allowance {allowances[key] * scale:g}{' points' if unit else ''})")
    return LoadCheck(compared > 0 and not differences, tuple(differences), tuple(missing))


@dataclass(frozen=True)
class PairVerdict:
    """The gate's answer for one host: `comparison` (plan/regression.Comparison) when judged; `again`
    when the loads differed and another after-measurement may still find a like one; else refused."""

    verdict: str  # passed | regressed | no baseline | not judged | load differs (measure the after side again)
    comparison: regression.Comparison | None
    load: LoadCheck | None
    before: Load | None
    after: Load | None
    attempt: int
    pairs: int

    @property
    def again(self) -> bool:
        return self.verdict == "load differs"

    def text(self) -> str:
        where = (f"the serving release before the switch ({self.before.text()}) against this one after it "
                 f"({self.after.text()})" if self.before and self.after else "")
        if self.comparison is not None:
            said = self.comparison.text()
            return f"{said}; compared: {where}" + (f"; {self.load.text()}" if self.load and self.load.missing else "") \
                if where else said
        if self.verdict == NOT_JUDGED:
            return (f"NOT JUDGED: the two measurements were under different load on all {self.pairs} tries "
                    f"({self.load.text() if self.load else 'no load read'}); compared: {where}; run the rollout "
                    f"again when the host's load is steady, or judge it yourself from the figures")
        return f"load differs (try {self.attempt} of {self.pairs}: {self.load.text() if self.load else ''}): measuring again"

    def as_json(self) -> dict:
        base = self.comparison.as_json() if self.comparison is not None else {"verdict": self.verdict, "text": self.text()}
        return {**base, "verdict": self.verdict, "text": self.text(), "compared": "before and after the switch, one window",
                "load": {"before": self.before.as_json() if self.before else None,
                         "after": self.after.as_json() if self.after else None,
                         "check": self.load.text() if self.load else "", "tries": self.attempt}}


def judge_pair(before: dict, before_load: Load, after: dict, after_load: Load, limits: dict, attempt: int) -> PairVerdict:
    """One pair: the figures (regression.figures) of the serving release measured before the switch
    and of the new one after it, with the load beside each. Alike load: judged by regression.compare
    against the stack's limits. Different load: `load differs` while tries are left (attempt < pairs),
    then `not judged`: the gate never passes a pair it could not compare."""
    pairs = int(limits["pairs"])
    check = compare_load(before_load, after_load, limits["load"])
    if check.alike:
        comparison = regression.compare(before, after, limits)
        return PairVerdict(comparison.verdict, comparison, check, before_load, after_load, attempt, pairs)
    verdict = "load differs" if attempt < pairs else NOT_JUDGED
    return PairVerdict(verdict, None, check, before_load, after_load, attempt, pairs)
