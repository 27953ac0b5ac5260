"""plan/gpusizes.py (issue 52 item 7): a 32 GB + 16 GB pair is served as two 16 GB cards, and the plan
says so with what is left unused. The recorded host v100x2-mixed (one 16 GB and one 32 GB V100, sizes
from their PCI ids) shows it in its golden plan; here the decision itself, on the gate's real path."""

from __future__ import annotations

from qwen27b.plan.gpusizes import unequal_sizes
from qwen27b.plan.planner import Gpu
from tests.support.gate_run import run


def gpu(index: int, name: str, mib: int) -> Gpu:
    return Gpu(index=index, name=name, memory_mib=mib, compute_capability="7.0")


def test_a_32_and_a_16_gb_card_are_served_as_two_16_gb_cards_and_the_rest_is_named():
    said = unequal_sizes([gpu(0, "Tesla V100-SXM2-16GB", 16160), gpu(1, "Tesla V100-SXM2-32GB", 32510)])
    assert said.startswith("GPUs of unequal memory: served as 2x 16160 MiB (15.8 GiB)")
    assert "GPU 1 (Tesla V100-SXM2-32GB, 32510 MiB) leaves 16350 MiB (16.0 GiB) unused" in said
    assert "in all" not in said and "qwen27b_gpu_indices: [1]" in said
    assert "GPU 0" not in said  # the smallest card is used whole


def test_several_larger_cards_are_each_named_and_summed():
    said = unequal_sizes([gpu(0, "Tesla V100-SXM2-32GB", 32510), gpu(1, "Tesla V100-SXM2-16GB", 16160),
                          gpu(2, "Tesla V100-SXM2-32GB", 32510), gpu(3, "Tesla V100-SXM2-16GB", 16160)])
    assert "served as 4x 16160 MiB" in said and "GPU 0 (" in said and "GPU 2 (" in said
    assert "31.9 GiB in all" in said and "qwen27b_gpu_indices: [0, 2]" in said


def test_cards_of_one_size_say_nothing():
    assert unequal_sizes([gpu(i, "Tesla V100-SXM2-32GB", 32510) for i in range(4)]) is None
    assert unequal_sizes([gpu(0, "Tesla V100-SXM2-32GB", 32510)]) is None


def test_the_gate_says_it_for_the_recorded_mixed_pair_and_not_for_the_32_gb_card_alone():
    """v100x2-mixed's recorded facts through the real gate: the warning is in the plan's warnings."""
    mixed = [w for w in run("v100x2-mixed").warnings if w.startswith("GPUs of unequal memory")]
    assert len(mixed) == 1 and "GPU 1 (Tesla V100-SXM2-32GB, 32510 MiB) leaves 16350 MiB" in mixed[0]
    assert not [w for w in run("v100x2-mixed", {"qwen27b_gpu_indices": [1]}).warnings if "unequal" in w]
