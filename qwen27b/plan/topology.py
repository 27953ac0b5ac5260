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


def group_nvlinks(topology: dict, group) -> int:
    """How many NVLinks join the pairs of `group`: NV<n> counts n (a DGX-1 pair is NV1 or NV2)."""
    at = {g: n for n, g in enumerate(topology["gpus"])}
    cells = (topology["links"][at[a]][at[b]] for n, a in enumerate(group) for b in group[n + 1:])
    return sum(int(c[2:]) for c in cells if c.startswith("NV") and c[2:].isdigit())


def links_shown(topology: dict, group) -> str:
    """'3 NVLinks (0-3 NV2, 1-2 NV1)' for a group on NVLink; '' without any NVLink among its pairs."""
    at = {g: n for n, g in enumerate(topology["gpus"])}
    pairs = [f"{a}-{b} {topology['links'][at[a]][at[b]]}" for n, a in enumerate(group) for b in group[n + 1:]]
    total = group_nvlinks(topology, group)
    return f"{total} NVLink(s) ({', '.join(pairs[:6])}{', ...' if len(pairs) > 6 else ''})" if total else ""


def _group_key(topology: dict, group) -> tuple:
    """Best first: the worst link (NVLink, one switch, ... the CPU's), then more NVLinks, then the lowest indices."""
    return group_rank(topology, group), -group_nvlinks(topology, group), tuple(group)


def _readable(topology: dict | None, indices: list[int]) -> bool:
    return bool(topology) and all(i in topology["gpus"] for i in indices)


def pick_group(topology: dict | None, indices: list[int], size: int) -> tuple[list[int], str]:
    """The `size` GPUs of `indices` best linked: all on NVLink (the most NVLinks first: a DGX-1's NV2
    pairs before its NV1 pairs), else behind one PCIe switch (PIX, then PXB), then through the CPU
    (PHB, NODE, SYS); ties go to the lowest indices. Without a choice (as many GPUs as needed, one GPU)
    or without links read: the first `size`, and no reason."""
    if size < 2 or size >= len(indices) or not _readable(topology, indices):
        return list(indices[:size]), ""
    best = min(itertools.combinations(indices, size), key=lambda g: _group_key(topology, g))
    return list(best), _reason(topology, best, indices, list(indices[:size]))


def _reason(topology: dict, best, indices: list[int], first: list[int]) -> str:
    size = len(best)
    links = links_shown(topology, best)
    reason = (f"GPU(s) {','.join(map(str, best))}: the best linked {size} of {','.join(map(str, indices))}, "
              f"{RANK_WORDS[group_rank(topology, best)]}{', ' + links if links else ''}")
    if list(best) != first:
        more = group_nvlinks(topology, first)
        reason += (f" (the first {size} have {RANK_WORDS[group_rank(topology, first)]}"
                   f"{f', {more} NVLink(s)' if more else ''})")
    return reason + "; NVLink first (the most links), then one PCIe switch, then the CPU's links"


# Copies' GPU sets are searched whole (every way to split the free GPUs) up to this many candidates;
# beyond it (more than ~10 free GPUs) each copy takes the best set the earlier ones left.
SEARCH_LIMIT = 20000


def _splits(indices: list[int], sizes: list[int], limit: list[int], floor: int = -1):
    """Every choice of disjoint groups of `sizes` (equal sizes side by side) from `indices`; groups of
    one size in ascending order of their lowest GPU (the same sets in another order are one split).
    Stops once `limit` runs out."""
    if not sizes:
        yield []
        return
    size, rest = sizes[0], sizes[1:]
    for group in itertools.combinations(indices, size):
        if group[0] <= floor:
            continue
        limit[0] -= 1
        if limit[0] < 0:
            return
        left = [g for g in indices if g not in group]
        for tail in _splits(left, rest, limit, group[0] if rest and rest[0] == size else -1):
            yield [list(group)] + tail


def pick_groups(topology: dict | None, indices: list[int], sizes: list[int]) -> list[tuple[list[int], str]]:
    """The copies' GPU sets (`sizes` in the copies' order) from `indices`, chosen together: the split
    whose worst set is best linked, then the fewest weak sets, then the most NVLinks in all (four TP-2
    copies on a DGX-1 get its four NV2 pairs, 8 links, not 0-1 NV1 + 2-3 NV2 + ...: 6). Sets of one size
    go to the copies best first. Without links read, or past SEARCH_LIMIT: each copy in turn takes
    pick_group's best from the GPUs the earlier ones left."""
    if len(sizes) > 1 and sum(sizes) <= len(indices) and _readable(topology, indices):
        order = sorted(range(len(sizes)), key=lambda n: -sizes[n])  # equal sizes side by side
        limit = [SEARCH_LIMIT]
        best = None
        for split in _splits(list(indices), [sizes[n] for n in order], limit):
            ranks = sorted((group_rank(topology, g) for g in split), reverse=True)
            key = (ranks, -sum(group_nvlinks(topology, g) for g in split), sorted(split))
            if best is None or key < best[0]:
                best = (key, split)
        if best and limit[0] >= 0:
            return _assign(topology, indices, sizes, order, best[1])
    left, out = list(indices), []
    for size in sizes:
        group, reason = pick_group(topology, left, size)
        out.append((group, reason))
        left = [g for g in left if g not in group]
    return out


def _assign(topology: dict, indices: list[int], sizes: list[int], order: list[int], split: list[list[int]]):
    """The split's sets to the copies: of one size, the best linked to the earliest copy."""
    pool: dict[int, list[list[int]]] = {}
    for group in split:
        pool.setdefault(len(group), []).append(group)
    for groups in pool.values():
        groups.sort(key=lambda g: _group_key(topology, g))
    out, left = [], list(indices)
    for size in sizes:
        group = pool[size].pop(0)
        first = left[:size]
        if size >= 2 and size < len(left):
            reason = _reason(topology, group, left, first)
        elif size >= 2:
            links = links_shown(topology, group)
            reason = (f"GPU(s) {','.join(map(str, group))}: the {size} the other copies left, "
                      f"{RANK_WORDS[group_rank(topology, group)]}{', ' + links if links else ''}")
        else:
            reason = ""
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
