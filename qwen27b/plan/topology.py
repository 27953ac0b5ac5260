"""GPU links -> the all-reduce a TP group uses: custom all-reduce on or off, NCCL's P2P on or off.

Pure: it reads the GpuTopology fact (`nvidia-smi topo -m` and `topo -p2p r`, parsed by
gpufacts_parse.parse_gpu_topology) and the engine build's evidence rules in the stack file
(vllm_builds.<build>.all_reduce, nccl_p2p). A build without rules (upstream vLLM, the CPU build)
gets no decision here: vLLM makes its own (it already turns custom all-reduce off on more than two
PCIe-only GPUs). The V100 evidence is mixed, so each case is its own sourced rule that a later
release can flip, and the plan prints which rule decided and why.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

@dataclass(frozen=True)
class AllReduce:
    """What a TP group gets: `custom` False adds --disable-custom-all-reduce, True keeps vLLM's
    default (said in a note); `env` the NCCL variables to set; each with its reason."""

    custom: bool | None  # None: no rule applies (TP 1, or a build without rules)
    reason: str
    env: dict
    env_reason: str | None = None
    rule: str | None = None


def group_link(topology: dict | None, indices: list[int]) -> tuple[str, str]:
    """("nvlink" | "pcie" | "unknown", what the links are) for the GPUs `indices` (nvidia-smi's)."""
    if not topology or any(i not in topology["gpus"] for i in indices):
        return "unknown", "GPU links not read (nvidia-smi topo -m answered nothing: no driver yet)"
    at = {g: n for n, g in enumerate(topology["gpus"])}
    pairs = [(a, b, topology["links"][at[a]][at[b]]) for n, a in enumerate(indices) for b in indices[n + 1:]]
    kinds = sorted({link for _, _, link in pairs})
    shown = ", ".join(f"{a}-{b} {link}" for a, b, link in pairs[:6]) + (", ..." if len(pairs) > 6 else "")
    if all(link.startswith("NV") for _, _, link in pairs):
        return "nvlink", f"every pair on NVLink ({shown})"
    return "pcie", f"not every pair on NVLink ({shown}; {'/'.join(kinds)})"


def p2p_failures(topology: dict | None, indices: list[int]) -> list[str]:
    """'a-b STATUS' for each pair of `indices` whose P2P read `nvidia-smi topo -p2p r` says is not OK."""
    if not topology or not topology.get("p2p_read") or any(i not in topology["gpus"] for i in indices):
        return []
    at = {g: n for n, g in enumerate(topology["gpus"])}
    matrix = topology["p2p_read"]
    return [f"{a}-{b} {matrix[at[a]][at[b]]}" for n, a in enumerate(indices) for b in indices[n + 1:]
            if matrix[at[a]][at[b]] != "OK"]


def nvlink_split(topology: dict | None, indices: list[int], sizes=(4,)) -> list[list[int]]:
    """Consecutive equal groups of `indices`, of the largest of `sizes` that divides them, each all on
    NVLink; [] when there is none (a DGX-1's 8 GPUs: two all-NVLink quads, while the eight are not)."""
    for size in sorted(sizes, reverse=True):
        if size >= len(indices) or len(indices) % size:
            continue
        groups = [indices[i:i + size] for i in range(0, len(indices), size)]
        if all(group_link(topology, group)[0] == "nvlink" for group in groups):
            return groups
    return []


# How far a pair's traffic travels, best first (nvidia-smi topo -m's legend); NV<n> is 0.
LINK_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
RANK_WORDS = ["every pair on NVLink", "every pair behind one PCIe switch (PIX)", "every pair behind PCIe switches (PXB)",
              "pairs through a CPU's host bridge (PHB)", "pairs across host bridges of one CPU (NODE)",
              "pairs across CPU sockets (SYS)", "links unknown"]


def group_rank(topology: dict, group) -> int:
    """The worst link among the pairs of `group` (0 NVLink .. 5 SYS, 6 unknown); 0 for one GPU."""
    at = {g: n for n, g in enumerate(topology["gpus"])}
    ranks = [0 if link.startswith("NV") else LINK_RANK.get(link, 6)
             for link in (topology["links"][at[a]][at[b]] for n, a in enumerate(group) for b in group[n + 1:])]
    return max(ranks, default=0)


def pick_group(topology: dict | None, indices: list[int], size: int) -> tuple[list[int], str]:
    """The `size` GPUs of `indices` best linked: all on NVLink, else behind one PCIe switch (PIX, then
    PXB), then through the CPU (PHB, NODE, SYS); ties go to the lowest indices. Without a choice (as
    many GPUs as needed, one GPU) or without links read: the first `size`, and no reason."""
    if size < 2 or size >= len(indices) or not topology or any(i not in topology["gpus"] for i in indices):
        return list(indices[:size]), ""
    best = min(itertools.combinations(indices, size), key=lambda g: (group_rank(topology, g), g))
    first = group_rank(topology, indices[:size])
    reason = (f"GPU(s) {','.join(map(str, best))}: the best linked {size} of {','.join(map(str, indices))}, "
              f"{RANK_WORDS[group_rank(topology, best)]}")
    if list(best) != list(indices[:size]):
        reason += f" (the first {size} have {RANK_WORDS[first]})"
    return list(best), reason + "; NVLink first, then one PCIe switch, then the CPU's links"


def pick_groups(topology: dict | None, indices: list[int], sizes: list[int]) -> list[tuple[list[int], str]]:
    """pick_group for each size in turn, from the GPUs the earlier ones left (the copies' order)."""
    left, out = list(indices), []
    for size in sizes:
        group, reason = pick_group(topology, left, size)
        out.append((group, reason))
        left = [g for g in left if g not in group]
    return out


def _matches(rule: dict, tp: int, link: str) -> bool:
    if "tp" in rule and tp not in rule["tp"]:
        return False
    if tp < rule.get("tp_min", 2):
        return False
    return rule.get("link", "any") in ("any", link)


def plan_all_reduce(build: dict, topology: dict | None, indices: list[int], cite) -> AllReduce:
    """The TP group `indices` (nvidia-smi indices, len = TP size) under the build's rules."""
    tp = len(indices)
    env, env_reason = {}, None
    p2p = build.get("nccl_p2p")
    failures = p2p_failures(topology, indices) if tp > 1 else []
    if p2p and failures:
        env = {p2p["env"]: str(p2p["value"])}
        env_reason = (f"{p2p['env']}={p2p['value']} in the service env: topo -p2p r says these GPUs cannot read "
                      f"each other over P2P ({', '.join(failures)}), where NCCL's P2P transport hangs "
                      f"{cite(p2p.get('source'))}")
    if tp < 2 or not build.get("all_reduce"):
        return AllReduce(None, "", env, env_reason)
    link, links = group_link(topology, indices)
    for rule in build["all_reduce"]:
        if _matches(rule, tp, link):
            reason = f"TP {tp}, {links}: {rule['why']} {cite(rule.get('source'))} (stack rule {rule['id']})"
            if rule.get("verified") is False:
                reason += " (verified: false)"
            return AllReduce(rule["custom_all_reduce"], reason, env, env_reason, rule["id"])
    return AllReduce(None, f"TP {tp}, {links}: no stack rule applies; vLLM decides", env, env_reason)
