#!/usr/bin/env python3
"""Weights fan-out, simulated: the real wave planner (qwen27b.plan.fanout.plan_waves) for N hosts,
each wave timed from the link speeds that benchmarks/fanout.py measured on 4 nspawn hosts. It
answers what the 4-host benchmark cannot (2 shared cores, one disk): how 16 or 32 hosts fare.

    python3 benchmarks/fanout_sim.py                       # the tables, 2 GiB bench + 20.4 GiB checkpoint
    python3 benchmarks/fanout_sim.py --peer-ratio 0.9 --hosts 1,16 --fabric shared

The model (every input a figure of docs/deploy-bench.md, fan-out section, final run):
- a copy takes `copy_overhead_s` (pyinfra's round trips, the seed start) plus its bytes at its leg's
  rate times that leg's stream efficiency; the efficiencies come from the measured end-to-end
  figures at the bench size (the one-host mirror copy's 45.2 s; the peer legs' qwen27b/rsync ratio);
- mirror legs of a wave share the WAN (the emulated site uplink is one token bucket);
- peer legs: `fabric="nic"` (a real lab: each host its own NIC and disk, a non-blocking switch)
  gives a copy the LAN rate divided by its seed's concurrent uploads; `fabric="shared"` (the
  nspawn bench: one kernel, one disk, 2 cores) caps a wave's peer legs together at `lan_agg_mbs`;
- staged (as deployed): a wave starts when the previous one has ended (one pyinfra operation per
  wave), so the run is `setup_s` + the sum of each wave's slowest copy.
plan_waves gives a seed one copy per wave and a host at most one download per wave, so under
"nic" no NIC is ever shared in the deployed plan. PROPOSALS, simulation only (nothing deployed
uses them): relaying while receiving (pipelined_wall_s, on plan_waves' tree or plan_chain) and
several streams per seed (plan_kary), whose streams share the seed's NIC.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qwen27b.plan.checkpoint import load_shape  # noqa: E402
from qwen27b.plan.fanout import MIRROR, Copy, FanoutPlan, Member, plan_waves  # noqa: E402

SOURCE = "docs/deploy-bench.md, weights fan-out, final run (benchmarks/fanout-results/results.json)"
BENCH_BYTES = 2_147_483_731  # the generated 2.00 GiB checkpoint of the measured run
CHECKPOINT = ROOT / "qwen27b/plan/checkpoints/nvidia--Qwen3.8-27B-NVFP4"
MEASURED = {  # what benchmarks/fanout.py measured; the calibration compares against these
    "one_wall_s": 47.9, "one_transfers_s": 45.2,
    "tree4_wall_s": 72.3, "tree4_x": 1.51, "each4_transfers_s": 172.2, "each4_x": 3.66,
    "peer_ratios": (0.51, 0.55, 0.67), "wan_mbs": 50.0, "lan_mbs": 429.0,
}
GOAL_X = 1.5
GOAL_PEER_RATIO = 0.9


@dataclass(frozen=True)
class Links:
    """Link speeds and fixed costs; the defaults are the measured ones (see MEASURED and SOURCE)."""

    wan_mbs: float = MEASURED["wan_mbs"]  # the emulated WAN bucket (rsync 45-50 MB/s, qwen27b 47 MB/s on it)
    wan_copy_s: float = 45.2  # one host's qwen27b mirror copy of BENCH_BYTES, end to end
    lan_mbs: float = MEASURED["lan_mbs"]  # rsync peer leg alone (tree wave 1: 5.0 s for 2 GiB)
    peer_ratio: float = sum(MEASURED["peer_ratios"]) / 3  # qwen27b/rsync, end to end, at BENCH_BYTES
    copy_overhead_s: float = 1.0  # round trips + seed start inside a copy ("~0.5-1 s")
    setup_s: float = 2.7  # one host: wall 47.9 - transfers 45.2 (connect, facts, preflight)
    fabric: str = "nic"  # "nic": per-host NICs; "shared": the bench machine's one kernel/disk
    lan_agg_mbs: float = 470.0  # "shared" only: tree wave 2's two rsyncs together (2 x 2 GiB in 9.1 s)
    stream_cap_mbs: float | None = None  # one stream's own limit below the NIC (a CPU-bound fetch); None: none

    def _eff(self, end_to_end_s: float, raw_s: float) -> float:
        stream_s = end_to_end_s - self.copy_overhead_s
        if stream_s <= 0:
            raise ValueError("copy_overhead_s exceeds the measured copy time")
        return raw_s / stream_s

    @property
    def wan_eff(self) -> float:
        """Stream efficiency of a mirror leg: the bench's raw WAN time over its copy less overhead
        (at the measured WAN rate, so that --wan-mbs scales the rate, not the efficiency)."""
        return self._eff(self.wan_copy_s, BENCH_BYTES / (MEASURED["wan_mbs"] * 1e6))

    @property
    def peer_eff(self) -> float:
        """Stream efficiency of a peer leg, from the end-to-end qwen27b/rsync ratio at the bench
        size and the measured LAN rate (so that --lan-mbs scales the rate, not the efficiency)."""
        raw = BENCH_BYTES / (MEASURED["lan_mbs"] * 1e6)
        return self._eff(raw / self.peer_ratio, raw)


def group(n: int, addressed: bool = True) -> list[Member]:
    """N hosts without the checkpoint; `addressed=False`: none can seed (the `each` case)."""
    return [Member(f"h{i:02d}", f"10.0.0.{i}" if addressed else None) for i in range(1, n + 1)]


def _rates(copies: list[Copy], links: Links, concurrent: list[Copy]) -> dict[str, float]:
    """Bytes/s of each copy given the copies that run at the same time (`concurrent`)."""
    mirror = sum(c.from_mirror for c in concurrent)
    peers = [c for c in concurrent if not c.from_mirror]
    uploads = Counter(c.source for c in peers)
    rates = {}
    for c in copies:
        if c.from_mirror:
            rates[c.host] = links.wan_mbs * 1e6 / mirror * links.wan_eff
            continue
        link = min(links.lan_mbs / uploads[c.source], links.stream_cap_mbs or math.inf)
        if links.fabric == "shared":
            link = min(link, links.lan_agg_mbs / len(peers))
        rates[c.host] = link * 1e6 * links.peer_eff
    return rates


def wave_times(plan: FanoutPlan, nbytes: int, links: Links) -> list[float]:
    """Staged, as deployed: each wave's slowest copy, the waves one after the other."""
    out = []
    for wave in range(plan.waves):
        copies = [c for c in plan.copies if c.wave == wave]
        rates = _rates(copies, links, copies)
        out.append(max(links.copy_overhead_s + nbytes / rates[c.host] for c in copies))
    return out


def staged_wall_s(plan: FanoutPlan, nbytes: int, links: Links) -> float:
    return links.setup_s + sum(wave_times(plan, nbytes, links))


def pipelined_wall_s(plan: FanoutPlan, nbytes: int, links: Links, chunk_bytes: int) -> float:
    """PROPOSAL: every copy of the plan runs at once, a receiver relaying what it has so far (its
    seed serves the growing part file by Range). A copy starts once its source holds a chunk,
    streams at the lesser of its source's rate and its own share of the source's NIC, and ends
    no earlier than a chunk after its source's end. The copies start in one operation, so the
    per-copy overhead is paid once."""
    copies = sorted(plan.copies, key=lambda c: c.wave)
    rates = _rates(copies, links, copies)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for c in copies:
        if c.from_mirror:
            start[c.host] = links.copy_overhead_s
            end[c.host] = start[c.host] + nbytes / rates[c.host]
            continue
        src_rate = rates.get(c.source, math.inf)
        rates[c.host] = min(rates[c.host], src_rate)
        start[c.host] = start.get(c.source, 0.0) + chunk_bytes / src_rate
        end[c.host] = max(start[c.host] + nbytes / rates[c.host], end.get(c.source, 0.0) + chunk_bytes / rates[c.host])
    return links.setup_s + max(end.values(), default=0.0)


def plan_chain(members: list[Member]) -> FanoutPlan:
    """PROPOSAL (simulation only): a chain by name, host i fed by host i-1; `wave` is the hop.
    Only for a group in which every host has a lab address and none holds a copy yet."""
    members = sorted(members, key=lambda m: m.name)
    if any(m.has_copy or not m.address for m in members):
        raise ValueError("plan_chain: every member needs a lab address and no copy")
    copies = [Copy(members[0].name, 0, MIRROR, None, "the one transfer over the WAN")] if members else []
    copies += [Copy(m.name, i, prev.name, prev.address, f"relayed by {prev.name} as it receives")
               for i, (prev, m) in enumerate(zip(members, members[1:]), start=1)]
    return FanoutPlan(tuple(members), tuple(copies))


def plan_kary(members: list[Member], k: int) -> FanoutPlan:
    """PROPOSAL (simulation only): staged like plan_waves, but each holder serves up to `k` hosts
    at once per wave (holders grow (k+1)-fold a wave, a seed's NIC shared by its k streams)."""
    members = sorted(members, key=lambda m: m.name)
    if any(m.has_copy or not m.address for m in members):
        raise ValueError("plan_kary: every member needs a lab address and no copy")
    holders, rest = members[:1], members[1:]
    copies = [Copy(holders[0].name, 0, MIRROR, None, "the one transfer over the WAN")] if members else []
    wave = 1
    while rest:
        batch, rest = rest[:k * len(holders)], rest[k * len(holders):]
        copies += [Copy(m.name, wave, holders[i % len(holders)].name, holders[i % len(holders)].address,
                        f"stream {i // len(holders) + 1} of its seed") for i, m in enumerate(batch)]
        holders, wave = holders + batch, wave + 1
    return FanoutPlan(tuple(members), tuple(copies))


@dataclass(frozen=True)
class Row:
    hosts: int
    waves: int
    wan_copies: int
    wall_s: float
    x_one: float

    @property
    def met(self) -> bool:
        return self.wan_copies == 1 and self.x_one <= GOAL_X + 1e-9


def one_host_s(nbytes: int, links: Links) -> float:
    return staged_wall_s(plan_waves(group(1)), nbytes, links)


def simulate(n: int, nbytes: int, links: Links, how: str = "staged", chunk_bytes: int = 16 << 20) -> Row:
    """One row: `how` is "staged" (plan_waves, as deployed), "pipelined" (plan_waves' tree,
    relayed), "chain" (plan_chain, relayed) or "k<K>" (plan_kary, staged); the ratio is to one
    host's staged run."""
    if how == "chain":
        plan = plan_chain(group(n))
    elif how.startswith("k"):
        plan = plan_kary(group(n), int(how[1:]))
    else:
        plan = plan_waves(group(n))
    relayed = how in ("pipelined", "chain")
    wall = pipelined_wall_s(plan, nbytes, links, chunk_bytes) if relayed else staged_wall_s(plan, nbytes, links)
    return Row(n, plan.waves, plan.mirror_copies, wall, wall / one_host_s(nbytes, links))


def calibration(links: Links | None = None) -> dict[str, float]:
    """The bench at 4 hosts (shared fabric), simulated from the measured link speeds."""
    bench = replace(links or Links(), fabric="shared")
    one = one_host_s(BENCH_BYTES, bench)
    each = bench.setup_s + sum(wave_times(plan_waves(group(4, addressed=False)), BENCH_BYTES, bench))
    return {"one_wall_s": one, "tree4_x": simulate(4, BENCH_BYTES, bench).x_one,
            "tree4_x_lo": simulate(4, BENCH_BYTES, replace(bench, peer_ratio=max(MEASURED["peer_ratios"]))).x_one,
            "tree4_x_hi": simulate(4, BENCH_BYTES, replace(bench, peer_ratio=min(MEASURED["peer_ratios"]))).x_one,
            "each4_x": each / one}


# ---------------------------------------------------------------- printing

def _table(head: list[str], rows: list[list]) -> list[str]:
    cells = [head] + [[str(x) for x in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(len(head))]
    fmt = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, width)) + " |"  # noqa: E731
    return [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|", *map(fmt, cells[1:])]


def _size_label(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def report(hosts: list[int], links: Links, sizes: list[int], chunk_bytes: int) -> list[str]:
    out = ["weights fan-out, SIMULATED (benchmarks/fanout_sim.py) with qwen27b.plan.fanout.plan_waves;",
           f"inputs MEASURED ({SOURCE}):",
           f"  WAN {links.wan_mbs:g} MB/s shared (one-host mirror copy {links.wan_copy_s:g} s -> stream eff {links.wan_eff:.2f});"
           f" LAN {links.lan_mbs:g} MB/s (rsync peer leg alone); peer qwen27b/rsync {links.peer_ratio:.2f} end to end"
           f" (measured {'-'.join(map(str, MEASURED['peer_ratios']))});",
           f"  per copy {links.copy_overhead_s:g} s (round trips + seed start, docs: ~0.5-1 s); setup {links.setup_s:g} s"
           f" (one host: wall 47.9 - transfers 45.2); fabric {links.fabric!r}"
           + (f" (peer legs of a wave share {links.lan_agg_mbs:g} MB/s)" if links.fabric == "shared" else
              " (each host its own NIC; plan_waves: one upload and one download per host per wave)"), ""]

    cal = calibration(links)
    out += ["calibration: the 4-host bench (fabric 'shared': one kernel, disk, 2 cores), SIMULATED vs MEASURED",
            *_table(["case", "simulated x one host", "measured x one host"],
                    [["one host wall s", f"{cal['one_wall_s']:.1f} (input)", f"{MEASURED['one_wall_s']}"],
                     ["tree, 4 hosts", f"{cal['tree4_x']:.2f} ({cal['tree4_x_lo']:.2f}-{cal['tree4_x_hi']:.2f} at peer ratio "
                      f"{max(MEASURED['peer_ratios'])}-{min(MEASURED['peer_ratios'])})",
                      f"{MEASURED['tree4_x']}"],
                     ["each from the mirror, 4 hosts", f"{cal['each4_x']:.2f}", f"{MEASURED['each4_x']}"]]), ""]

    for nbytes in sizes:
        out += [f"staged tree as deployed (plan_waves), {_size_label(nbytes)}, SIMULATED; one host "
                f"{one_host_s(nbytes, links):.1f} s",
                *_table(["hosts", "waves", "WAN copies", "wall s", "x one host", f"<= {GOAL_X}x, 1.00x WAN?"],
                        [[r.hosts, r.waves, r.wan_copies, f"{r.wall_s:.1f}", f"{r.x_one:.2f}", "yes" if r.met else "no"]
                         for r in (simulate(n, nbytes, links) for n in hosts)]), ""]

    ratios = [("measured low", min(MEASURED["peer_ratios"])), ("measured mean", links.peer_ratio),
              ("measured high", max(MEASURED["peer_ratios"])), ("goal", GOAL_PEER_RATIO), ("as rsync", 1.0)]
    for nbytes in sizes:
        out += [f"x one host by peer-leg ratio (qwen27b/rsync), staged tree, {_size_label(nbytes)}, SIMULATED",
                *_table(["peer ratio", *[f"{n} hosts" for n in hosts]],
                        [[f"{v:.2f} ({name})", *[f"{simulate(n, nbytes, replace(links, peer_ratio=v)).x_one:.2f}"
                                                for n in hosts]] for name, v in ratios]), ""]

    n16 = 16
    out += [f"what it takes at {n16} hosts: x one host by LAN speed (WAN {links.wan_mbs:g} MB/s, peer ratio "
            f"{GOAL_PEER_RATIO}, {_size_label(sizes[-1])}), SIMULATED; pipelined/chain are PROPOSALS "
            f"({chunk_bytes >> 20} MiB chunks)",
            *_table(["LAN MB/s", "LAN/WAN", "staged tree", "pipelined tree", "chain"],
                    [[f"{lan:g}", f"{lan / links.wan_mbs:.1f}",
                      *[f"{simulate(n16, sizes[-1], replace(links, lan_mbs=lan, peer_ratio=GOAL_PEER_RATIO), how, chunk_bytes).x_one:.2f}"
                        for how in ("staged", "pipelined", "chain")]]
                     for lan in (100.0, 200.0, links.lan_mbs, 1000.0, 1250.0)]), ""]

    for nbytes in sizes:
        for name, v in (("measured mean", links.peer_ratio), ("goal", GOAL_PEER_RATIO)):
            lk = replace(links, peer_ratio=v)
            out += [f"PROPOSALS vs as deployed, {_size_label(nbytes)}, peer ratio {v:.2f} ({name}), SIMULATED: x one host",
                    *_table(["hosts", "staged tree (deployed)", "pipelined tree", "chain"],
                            [[n, *[f"{simulate(n, nbytes, lk, how, chunk_bytes).x_one:.2f}"
                                   for how in ("staged", "pipelined", "chain")]] for n in hosts]), ""]
    lan10g = replace(links, lan_mbs=1250.0, peer_ratio=GOAL_PEER_RATIO)
    capped = replace(lan10g, stream_cap_mbs=links.lan_mbs)
    out += [f"PROPOSAL: several streams per seed (plan_kary, staged), {_size_label(sizes[-1])}, peer ratio "
            f"{GOAL_PEER_RATIO}, SIMULATED: x one host",
            *_table(["hosts", "k=1 (= plan_waves)", "k=2", "k=3", "k=4", "LAN, per stream"],
                    [[n, *[f"{simulate(n, sizes[-1], lk, how).x_one:.2f}" for how in ("k1", "k2", "k3", "k4")], what]
                     for lk, what in ((replace(links, peer_ratio=GOAL_PEER_RATIO), f"{links.lan_mbs:g} MB/s NIC, no stream cap"),
                                      (capped, f"1250 MB/s NIC, {links.lan_mbs:g} MB/s a stream"))
                     for n in (16, 32)]), ""]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,2,4,8,16,32", help="comma-separated host counts")
    ap.add_argument("--wan-mbs", type=float, default=Links.wan_mbs)
    ap.add_argument("--lan-mbs", type=float, default=Links.lan_mbs)
    ap.add_argument("--peer-ratio", type=float, default=Links.peer_ratio)
    ap.add_argument("--copy-overhead-s", type=float, default=Links.copy_overhead_s)
    ap.add_argument("--fabric", choices=("nic", "shared"), default=Links.fabric)
    ap.add_argument("--chunk-mib", type=int, default=16, help="relay granularity of the pipelined proposals")
    ap.add_argument("--size-bytes", type=int, default=0, help="one model size instead of the bench's and the checkpoint's")
    args = ap.parse_args(argv)
    links = Links(wan_mbs=args.wan_mbs, lan_mbs=args.lan_mbs, peer_ratio=args.peer_ratio,
                  copy_overhead_s=args.copy_overhead_s, fabric=args.fabric)
    sizes = [args.size_bytes] if args.size_bytes else [BENCH_BYTES, load_shape(CHECKPOINT).weight_bytes]
    print("\n".join(report([int(h) for h in args.hosts.split(",")], links, sizes, args.chunk_mib << 20)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
