"""GPUs of unequal memory in one serving (issue 52 item 7): a 32 GB + 16 GB V100 pair is served as
two 16 GB cards. vLLM shards the model evenly over a tensor-parallel group, so every GPU of the
group gets the smallest card's memory (planner.gpus_text sizes it so); the rest of a larger card
is left unused. Pure: the plan says it, with what is left unused and the setting that uses it.
"""

from __future__ import annotations

from qwen27b.plan.planner import Gpu


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def unequal_sizes(gpus: list[Gpu]) -> str | None:
    """The warning for `gpus` (one serving's GPUs) when their memory differs, else None: how they
    are served, each larger card's memory left unused, and how to use it whole."""
    sizes = {g.memory_mib for g in gpus}
    if len(sizes) < 2:
        return None
    smallest = min(sizes)
    larger = [g for g in gpus if g.memory_mib > smallest]
    unused = sum(g.memory_mib - smallest for g in larger)
    each = "; ".join(f"GPU {g.index} ({g.name}, {g.memory_mib} MiB) leaves {g.memory_mib - smallest} MiB "
                     f"({_gib(g.memory_mib - smallest)}) unused" for g in larger)
    indices = ", ".join(str(g.index) for g in larger)
    return (f"GPUs of unequal memory: served as {len(gpus)}x {smallest} MiB ({_gib(smallest)}), the smallest card's "
            f"size on every GPU (vLLM splits the model evenly over a tensor-parallel group): {each}"
            + (f", {_gib(unused)} in all" if len(larger) > 1 else "") + ". To use the larger card(s) whole, serve on them alone "
            f"(qwen27b_gpu_indices: [{indices}]) or pair them with cards of their size")
