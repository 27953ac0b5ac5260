"""Engine choices for `vllm serve` that owners of the hardware measured: the KV-cache dtype, the
speculative method and depth, the agent parsers. Pure functions of the stack file, the checkpoint's
shape and host data; each returns its value with the reason and the sources the plan prints.
Kept apart from planner.py (memory and sizing) so each decision reads on its own.
"""

from __future__ import annotations

from qwen27b.plan.checkpoint import ModelShape
from qwen27b.plan.stack import ResolvedStack


def kv_cache_dtype(stack: ResolvedStack, target: ModelShape, on_gpu: bool) -> tuple[str, str]:
    """--kv-cache-dtype and why. A profile with `serve.kv_cache_source` (sm70) sets its dtype
    explicitly: `auto` would follow a checkpoint's FP8-KV directive, slow on Volta."""
    serve = stack.profile["serve"]
    value = serve.get("kv_cache_dtype", "auto")
    sources = serve.get("kv_cache_source")
    asked = f"; this checkpoint asks for {target.kv_cache_quant} KV, overridden" if target.kv_cache_quant else ""
    if sources and value != "auto":
        return value, (f"{value} KV set explicitly, never 'auto': 'auto' follows a checkpoint's FP8-KV directive, and "
                       f"FP8 KV takes a slower scalar paged-attention path on sm_70{asked} {stack.cite(sources)}")
    if on_gpu and serve["dtype"] == "float16":
        return value, f"KV in the model dtype; fp8_e5m2 is experimental on V100 {stack.cite('kv-fp8-v100')}"
    follows = f" (auto: follows the checkpoint's {target.kv_cache_quant} KV directive)" if target.kv_cache_quant \
        and value == "auto" else ""
    return value, f"KV in the model dtype{follows}"
