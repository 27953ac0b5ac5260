"""The fan-out simulator's core (benchmarks/fanout_sim.py): one host is one WAN copy, the WAN is
crossed once at any N, the 4-host bench is reproduced from the measured link speeds, and the
staged tree grows by one LAN copy per doubling."""

import importlib.util
import sys
from dataclasses import replace

import pytest

from qwen27b.plan.fanout import ideal_waves, plan_waves
from tests.support.paths import ROOT

_spec = importlib.util.spec_from_file_location(
    "fanout_sim", ROOT / "benchmarks" / "fanout_sim.py")
sim = sys.modules["fanout_sim"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(sim)

HOSTS = (1, 2, 4, 8, 16, 32)


def test_one_host_is_one_wan_copy():
    links = sim.Links()
    # the bench's own figure: setup + the measured one-host mirror copy
    assert sim.one_host_s(sim.BENCH_BYTES, links) == pytest.approx(links.setup_s + links.wan_copy_s)
    # any size: setup + overhead + bytes at the WAN rate times its efficiency
    n = 10 * 2**30
    want = links.setup_s + links.copy_overhead_s + n / (links.wan_mbs * 1e6 * links.wan_eff)
    assert sim.one_host_s(n, links) == pytest.approx(want)
    assert sim.simulate(1, n, links).x_one == pytest.approx(1.0)


@pytest.mark.parametrize("how", ["staged", "pipelined", "chain"])
def test_wan_crossed_once(how):
    for n in HOSTS:
        row = sim.simulate(n, sim.BENCH_BYTES, sim.Links(), how)
        assert row.wan_copies == 1
        assert row.x_one >= 1.0 - 1e-9


def test_calibration_reproduces_the_4_host_bench():
    cal = sim.calibration()
    assert cal["one_wall_s"] == pytest.approx(sim.MEASURED["one_wall_s"], abs=0.05)
    assert cal["tree4_x"] == pytest.approx(sim.MEASURED["tree4_x"], rel=0.05)
    assert cal["tree4_x_lo"] <= sim.MEASURED["tree4_x"] <= cal["tree4_x_hi"]
    assert cal["each4_x"] == pytest.approx(sim.MEASURED["each4_x"], rel=0.05)


def test_staged_tree_adds_one_lan_copy_per_wave():
    links = sim.Links()
    lan = sim.wave_times(plan_waves(sim.group(2)), sim.BENCH_BYTES, links)[1]
    # measured mean ratio at the measured LAN: the peer copy takes rsync's time over the ratio
    assert lan == pytest.approx(sim.BENCH_BYTES / (sim.MEASURED["lan_mbs"] * 1e6) / links.peer_ratio)
    for n in HOSTS:
        waves = sim.wave_times(plan_waves(sim.group(n)), sim.BENCH_BYTES, links)
        assert len(waves) == ideal_waves(n)
        assert waves[1:] == pytest.approx([lan] * (len(waves) - 1))  # "nic": no NIC shared in a wave


def test_shared_fabric_and_goal_ratio_move_the_result_the_right_way():
    links = sim.Links()
    shared = replace(links, fabric="shared")
    goal = replace(links, peer_ratio=sim.GOAL_PEER_RATIO)
    x = lambda lk: sim.simulate(16, sim.BENCH_BYTES, lk).x_one  # noqa: E731
    assert x(shared) > x(links) > x(goal)


def test_chain_plan_relays_by_name():
    plan = sim.plan_chain(sim.group(4))
    assert [(c.host, c.source) for c in plan.copies] == [
        ("h01", sim.MIRROR), ("h02", "h01"), ("h03", "h02"), ("h04", "h03")]
    with pytest.raises(ValueError):
        sim.plan_chain(sim.group(2, addressed=False))


def test_kary_plan_at_k1_times_like_plan_waves_and_shares_the_seed_nic():
    links = sim.Links()
    for n in HOSTS:
        assert sim.simulate(n, sim.BENCH_BYTES, links, "k1").x_one == pytest.approx(
            sim.simulate(n, sim.BENCH_BYTES, links).x_one)
    plan = sim.plan_kary(sim.group(9), 2)
    assert [sum(c.wave == w for c in plan.copies) for w in range(plan.waves)] == [1, 2, 6]
    assert plan.mirror_copies == 1
    # without a per-stream cap, two streams from one seed halve each other's rate
    one = sim.wave_times(plan_waves(sim.group(2)), sim.BENCH_BYTES, links)[1] - links.copy_overhead_s
    assert sim.wave_times(plan, sim.BENCH_BYTES, links)[1] == pytest.approx(2 * one + links.copy_overhead_s)
