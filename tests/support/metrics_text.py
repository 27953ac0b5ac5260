"""Recorded vLLM /metrics texts (tests/fixtures/vllm) and the speculative counters summed independently of
the engine's own parser."""

from tests.support.paths import TESTS

METRICS = TESTS / "fixtures" / "vllm"


def _text(name):
    return (METRICS / name).read_text()


def _counters(text):
    """Independent of engine's regex: the two counters summed over label sets, line by line."""
    drafted = accepted = 0.0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("vllm:spec_decode_num_draft_tokens_total"):
            drafted += float(value)
        elif name.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            accepted += float(value)
    return drafted, accepted
