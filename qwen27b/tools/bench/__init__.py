"""`qwen27b bench`: the seed's bench matrix (section 4.2) against a deployed endpoint.

cli (the command and its --help), measure (one run against a live server), loadgen (the
streamed requests), prompts (exact token counts), metrics (/metrics deltas), matrix (the
statistics and A/B ratios), physics (the ceilings), output (table, CSV, JSON, chart). The names
below are the package's API, as the single module had them.
"""

from qwen27b.tools.bench.cli import build_parser, main
from qwen27b.tools.bench.common import (FP4_27B_GB_PER_TOKEN, FP16_27B_GB_PER_TOKEN, NO_GPU, SCHEMA,
                                       SEED_CONCURRENCY, SEED_DECODE_CLAIM, SEED_MAX_MODEL_LENS,
                                       SEED_OUTPUT_TOKENS, SEED_PREFILL_CLAIM, SEED_PROMPT_TOKENS,
                                       BenchError, ratio)
from qwen27b.tools.bench.loadgen import one_request, request_body, run_level
from qwen27b.tools.bench.matrix import ab_compare, percentile, request_figures, summarize_level, token_check
from qwen27b.tools.bench.measure import auth_headers, measure, read_key_file, server_info
from qwen27b.tools.bench.metrics import (COUNTERS, HISTOGRAMS, counter, histogram_mean, metric_deltas,
                                        parse_metrics, scrape, spec_exported)
from qwen27b.tools.bench.output import (CSV_FIELDS, csv_text, format_ab, format_table, hint_text, load_run,
                                       write_chart, write_outputs)
from qwen27b.tools.bench.physics import (ceilings, gpu_row, params_from_config, resolve_physics,
                                        stack_model_facts, stack_model_for_served)
from qwen27b.tools.bench.prompts import PAD, WORDS, TokenCounter, filler_words, fit_prompt

__all__ = [
    "build_parser", "main",
    "FP4_27B_GB_PER_TOKEN", "FP16_27B_GB_PER_TOKEN", "NO_GPU", "SCHEMA", "SEED_CONCURRENCY",
    "SEED_DECODE_CLAIM", "SEED_MAX_MODEL_LENS", "SEED_OUTPUT_TOKENS", "SEED_PREFILL_CLAIM",
    "SEED_PROMPT_TOKENS", "BenchError", "ratio",
    "one_request", "request_body", "run_level",
    "ab_compare", "percentile", "request_figures", "summarize_level", "token_check",
    "auth_headers", "measure", "read_key_file", "server_info",
    "COUNTERS", "HISTOGRAMS", "counter", "histogram_mean", "metric_deltas", "parse_metrics", "scrape",
    "spec_exported",
    "CSV_FIELDS", "csv_text", "format_ab", "format_table", "hint_text", "load_run", "write_chart",
    "write_outputs",
    "ceilings", "gpu_row", "params_from_config", "resolve_physics", "stack_model_facts",
    "stack_model_for_served",
    "PAD", "WORDS", "TokenCounter", "filler_words", "fit_prompt",
]
