"""What the bench's parts share: the error, the result schema, the seed's fixed test and claims."""

from __future__ import annotations

SCHEMA = 1
NO_GPU = "n/a (no GPU)"

# FACTS.md, "Physics of the seed's claims (batch 1, one V100, 900 GB/s HBM2)".
SEED_DECODE_CLAIM = 3.0
SEED_PREFILL_CLAIM = 15.0
FP16_27B_GB_PER_TOKEN = 51.0   # fp16 27B: ~51 GB of weights read per decoded token
FP4_27B_GB_PER_TOKEN = 16.0    # 4.5 bit/weight incl. scales, lm_head fp16: ~16 GB per token

# The seed's matrix (section 4.2).
SEED_PROMPT_TOKENS = 512
SEED_OUTPUT_TOKENS = 256
SEED_CONCURRENCY = (1, 4, 8)
SEED_MAX_MODEL_LENS = (4096, 8192)


class BenchError(Exception):
    """The bench cannot run or cannot be trusted; str() says why and what to do."""


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den
