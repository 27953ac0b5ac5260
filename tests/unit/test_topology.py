"""The all-reduce per TP group (qwen27b/plan/topology.py) from genuine `nvidia-smi topo -m` texts
(tests/fixtures/topology) and the stack file's sourced rules (vllm_builds.1cat.all_reduce)."""


import pytest

from qwen27b.plan.gpufacts_parse import P2P_MARKER, parse_gpu_topology
from qwen27b.plan.stack import load_stack
from qwen27b.plan.topology import group_link, p2p_failures, plan_all_reduce
from tests.support.paths import TESTS

TOPOLOGY = TESTS / "fixtures" / "topology"
STACK = load_stack()
ONECAT = STACK["vllm_builds"]["1cat"]


def cite(ids):
    return f"[{', '.join([ids] if isinstance(ids, str) else ids)}]" if ids else ""


def topo(name: str) -> dict:
    return parse_gpu_topology((TOPOLOGY / name).read_text(encoding="utf-8").splitlines())


DGX1 = topo("dgx1-8x-v100-sxm2-16gb.txt")
MIXED = topo("mixed-rtx3090-2x-v100-sxm2-nv6.txt")
PCIE4 = topo("pcie-4x-pxb-pix-sys.txt")


@pytest.mark.parametrize("topology, gpus, link", [
    (DGX1, [0, 1, 2, 3], "nvlink"),  # one socket's quad: fully NVLink-connected
    (DGX1, list(range(8)), "pcie"),  # 0-5 is SYS: the hybrid cube mesh is not all-to-all
    (MIXED, [1, 2], "nvlink"),
    (MIXED, [0, 1], "pcie"),
    (PCIE4, [0, 1], "pcie"),
    (None, [0, 1], "unknown"),
    (PCIE4, [0, 4], "unknown"),  # a GPU the matrix does not list
])  # fmt: skip
def test_group_link(topology, gpus, link):
    assert group_link(topology, gpus)[0] == link


@pytest.mark.parametrize("topology, gpus, custom, rule", [
    (MIXED, [1, 2], False, "volta-tp2"),  # TP 2 failed over NVLink too (PR 88)
    (PCIE4, [0, 1], False, "volta-tp2"),
    (None, [0, 1], False, "volta-tp2"),
    (DGX1, [0, 1, 2, 3], True, "volta-nvlink"),  # 1Cat's 4x SXM2 baseline: faster with it on
    (DGX1, list(range(8)), False, "volta-pcie"),
    (PCIE4, [0, 1, 2, 3], False, "volta-pcie"),
    (None, [0, 1, 2, 3], False, "volta-unknown"),
    (DGX1, [0], None, None),  # TP 1: no all-reduce at all
])  # fmt: skip
def test_the_first_matching_stack_rule_decides(topology, gpus, custom, rule):
    decision = plan_all_reduce(ONECAT, topology, gpus, cite)
    assert (decision.custom, decision.rule) == (custom, rule)
    if rule:
        entry = next(r for r in ONECAT["all_reduce"] if r["id"] == rule)
        assert cite(entry["source"]) in decision.reason and f"(stack rule {rule})" in decision.reason
        assert all(s in STACK["sources"] for s in entry["source"])


def test_a_release_that_fixes_a_case_flips_one_rule():
    build = dict(ONECAT, all_reduce=[dict(r, custom_all_reduce=True) if r["id"] == "volta-tp2" else r
                                     for r in ONECAT["all_reduce"]])
    assert plan_all_reduce(build, MIXED, [1, 2], cite).custom is True
    assert plan_all_reduce(build, PCIE4, [0, 1, 2, 3], cite).custom is False  # the other cases stay


def test_builds_without_rules_leave_it_to_vllm():
    for name in ("upstream", "cpu"):
        decision = plan_all_reduce(STACK["vllm_builds"][name], PCIE4, [0, 1], cite)
        assert decision.custom is None and decision.env == {}


def test_nccl_p2p_off_only_where_topo_p2p_says_a_pair_cannot_read():
    gns = topo("pcie-2x-phb-p2p-gns.txt")
    assert p2p_failures(gns, [0, 1]) == ["0-1 GNS"]
    decision = plan_all_reduce(ONECAT, gns, [0, 1], cite)
    assert decision.env == {"NCCL_P2P_DISABLE": "1"} and "0-1 GNS" in decision.env_reason
    assert "[v100-skinny-3]" in decision.env_reason
    ok = parse_gpu_topology(["\tGPU0\tGPU1", "GPU0\t X \tNV2", "GPU1\tNV2\t X ", P2P_MARKER,
                             " \tGPU0\tGPU1", " GPU0\tX\tOK", " GPU1\tOK\tX"])
    assert plan_all_reduce(ONECAT, ok, [0, 1], cite).env == {}
    assert plan_all_reduce(ONECAT, DGX1, [0, 1], cite).env == {}  # not read: NCCL's own choice
    assert plan_all_reduce(ONECAT, gns, [0], cite).env == {}  # TP 1 talks to nobody


# --- through the gate and the rendered env, on the recorded hosts --------------------------------

import sys  # noqa: E402

sys.path.insert(0, str(TESTS))
from recordings import recorded_facts  # noqa: E402

from qwen27b.controller.render import service_env  # noqa: E402
from qwen27b.controller.unitwords import layout  # noqa: E402
from qwen27b.plan.gate import decide  # noqa: E402
from qwen27b.plan.hostdata import settings_for  # noqa: E402


def _decide(host: str, **data):
    return decide(host, recorded_facts(host), load_stack(), settings_for(host, data))


def test_pcie_box_gets_the_flag_and_nccl_p2p_off_in_its_env():
    d = _decide("v100x4-pcie")
    assert d.serve.has("--disable-custom-all-reduce") and "(stack rule volta-pcie)" in next(
        f.reason for f in d.serve.flags if f.name == "--disable-custom-all-reduce")
    env = dict(service_env(d, layout(d)))
    assert env["NCCL_P2P_DISABLE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "--disable-custom-all-reduce" in d.serve.argv()


def test_nvlink_quad_keeps_custom_all_reduce_and_says_why():
    d = _decide("v100x4-converged")
    assert not d.serve.has("--disable-custom-all-reduce")
    assert any(n.startswith("custom all-reduce kept on") and "volta-nvlink" in n for n in d.serve.notes)
    assert "NCCL_P2P_DISABLE" not in dict(service_env(d, layout(d)))


def test_a_pin_wins_over_the_rule():
    d = _decide("v100x4-converged", qwen27b_serve_flags={"--disable-custom-all-reduce": True})
    flag = next(f for f in d.serve.flags if f.name == "--disable-custom-all-reduce")
    assert flag.pinned and flag.value is None


def test_a_pinned_tp_below_the_gpu_count_gets_only_its_gpus_and_a_note():
    d = _decide("v100x4-pcie", qwen27b_tensor_parallel_size=2)
    assert dict(service_env(d, layout(d)))["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert any(n.startswith("GPU(s) 2, 3 are left out of this unit") and "qwen27b_instances" in n for n in d.serve.notes)
    # the TP group is GPUs 0-1 (NODE, P2P OK): the cross-socket CNS pairs are not its business
    assert "NCCL_P2P_DISABLE" not in dict(service_env(d, layout(d)))


def test_a_dgx1_is_two_all_nvlink_quads_and_the_plan_says_so():
    from qwen27b.plan.topology import nvlink_split
    assert nvlink_split(DGX1, list(range(8))) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nvlink_split(PCIE4, [0, 1, 2, 3]) == [] and nvlink_split(None, list(range(8))) == []
    assert nvlink_split(DGX1, [0, 1, 2, 3]) == []  # already one all-NVLink group: nothing to split
    d = _decide("v100x8-sxm2-dgx1")
    assert any(n.startswith("GPU(s) 0,1,2,3 and 4,5,6,7 are each all on NVLink: 2 copies of TP 4") for n in d.serve.notes)
    assert not any("are each all on NVLink" in n for n in _decide("v100x4-pcie").serve.notes)


# ------------------------------------------------------------------ which GPUs, among more than needed


@pytest.mark.parametrize("topology, gpus, size, picked", [
    (DGX1, [0, 5, 6, 7], 2, [5, 6]),  # 0 reaches 5-7 over SYS only; 5-6 and 6-7 are NVLink: the lowest
    (DGX1, list(range(8)), 4, [0, 1, 2, 3]),  # a quad on NVLink, not a SYS-spanning set
    (MIXED, [0, 1, 2], 2, [1, 2]),  # the V100 NV6 pair, not the 3090 + V100 NODE pair
    (PCIE4, [0, 1, 2, 3], 2, [2, 3]),  # one PCIe switch (PIX) before several bridges (PXB)
    (PCIE4, [0, 2], 2, [0, 2]),  # no choice: as many as needed
    (None, [0, 1, 2, 3], 2, [0, 1]),  # links not read: the first ones, as vLLM numbers them
    (DGX1, [0, 1, 2, 3], 1, [0]),
])  # fmt: skip
def test_pick_group_prefers_nvlink_then_one_switch(topology, gpus, size, picked):
    from qwen27b.plan.topology import pick_group
    group, reason = pick_group(topology, gpus, size)
    assert group == picked
    assert bool(reason) == (topology is not None and 2 <= size < len(gpus))


def test_pick_groups_gives_each_copy_its_own_gpus_in_order():
    from qwen27b.plan.topology import pick_groups
    assert [g for g, _ in pick_groups(DGX1, list(range(8)), [4, 4])] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [g for g, _ in pick_groups(PCIE4, [0, 1, 2, 3], [2, 2])] == [[2, 3], [0, 1]]


def test_four_tp2_copies_on_a_dgx1_get_its_four_nv2_pairs():
    """The DGX-1's genuine `topo -m` (NV1 and NV2 pairs): taken one copy at a time by the lowest
    indices, four TP-2 copies got 0-1 NV1, 2-3 NV2, 4-5 NV1, 6-7 NV2 (6 NVLinks); chosen together
    and by link count they get the four NV2 pairs (8), and each copy's reason shows its links."""
    from qwen27b.plan.topology import group_nvlinks, pick_groups
    picked = pick_groups(DGX1, list(range(8)), [2, 2, 2, 2])
    groups = [g for g, _ in picked]
    assert sum(group_nvlinks(DGX1, g) for g in groups) == 8
    assert all(group_nvlinks(DGX1, g) == 2 for g in groups)
    assert sorted(g for grp in groups for g in grp) == list(range(8))
    assert "2 NVLink(s) (0-3 NV2)" in picked[0][1]
    # the old chooser's split, for the record: the same four copies, 6 links
    assert sum(group_nvlinks(DGX1, g) for g in ([0, 1], [2, 3], [4, 5], [6, 7])) == 6
    # a worse-linked split never wins on link count: two quads stay the all-NVLink quads
    assert [g for g, _ in pick_groups(DGX1, list(range(8)), [4, 4])] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # mixed sizes, any order: the quad first, the pair an NV2 pair on the other socket
    assert [g for g, _ in pick_groups(DGX1, list(range(8)), [2, 4])] == [[4, 7], [0, 1, 2, 3]]


def test_the_plan_shows_each_copys_links_on_the_dgx1():
    from qwen27b.plan.serving import decide as decide_host
    facts = recorded_facts("v100x8-sxm2-dgx1")
    data = {"qwen27b_instances": [{"name": n, "gpus": 2, "port": 8000 + i} for i, n in enumerate("abcd")]}
    d = decide_host("h", facts, load_stack(), settings_for("h", data))
    assert [inst.gpus for inst, _ in d.copies] == [(0, 3), (1, 2), (4, 7), (5, 6)]
    notes = [n for _, copy in d.copies for n in copy.serve.notes if n.startswith("copy '")]
    assert len(notes) == 4 and all(" 2 NVLink(s) (" in n for n in notes)


def test_the_tp_group_among_more_gpus_is_the_best_linked_and_the_unit_gets_it():
    d = _decide("v100x8-sxm2-dgx1", qwen27b_gpu_indices=[0, 5, 6, 7], qwen27b_tensor_parallel_size=2)
    assert d.serve.tp_group == (5, 6)
    assert dict(service_env(d, layout(d)))["CUDA_VISIBLE_DEVICES"] == "5,6"
    assert any(n.startswith("TP group GPU(s) 5,6: the best linked 2 of 0,5,6,7") for n in d.serve.notes)
    assert any(n.startswith("GPU(s) 0, 7 are left out of this unit") for n in d.serve.notes)
    # the all-reduce is decided on that group's links (TP 2: off on any link, volta-tp2)
    assert "5-6 NV" in next(f.reason for f in d.serve.flags if f.name == "--disable-custom-all-reduce")


def test_copies_given_a_count_get_the_best_linked_free_gpus():
    from qwen27b.plan.serving import decide as decide_host
    from qwen27b.plan.gate import RefusedHost
    facts = recorded_facts("v100x8-sxm2-dgx1")
    data = {"qwen27b_instances": [{"name": "a", "gpus": [4, 5, 6, 7], "port": 8000}, {"name": "b", "gpus": 2, "port": 8001}]}
    d = decide_host("h", facts, load_stack(), settings_for("h", data))
    (a, _), (b, copy_b) = d.copies
    assert a.gpus == (4, 5, 6, 7) and b.gpus == (0, 3)  # from the free 0-3, all NVLink: the lowest NV2 pair
    assert any(n.startswith("copy 'b': GPU(s) 0,3: the best linked 2 of 0,1,2,3, every pair on NVLink, 2 NVLink(s)")
               for n in copy_b.serve.notes)
    too_many = {"qwen27b_instances": [{"name": "a", "gpus": 6, "port": 8000}, {"name": "b", "gpus": 4, "port": 8001}]}
    with pytest.raises(RefusedHost, match="asks for 10 GPU"):
        decide_host("h", facts, load_stack(), settings_for("h", too_many))
