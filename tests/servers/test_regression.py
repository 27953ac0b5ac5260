"""Slower or worse than the previous release (issue 26 part 3): the pure comparison
(qwen27b/plan/regression.py), the figures verify keeps, the limits as stack data (checked, settable
per host), and what `qwen27b rollout` and `qwen27b status` make of a verify report's comparison.
The real measurement and the real regression: tests/e2e/test_lifecycle_e2e.py."""

from __future__ import annotations

import json

import pytest

from tests.support.rollout_runs import deploys as _deploys
from qwen27b.plan import regression as G
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.lifecycle import Record, parse_record, record_text
from qwen27b.plan.stack import StackError, load_stack, resolve_stack
from qwen27b.tools import rollout as R
from qwen27b.tools import status

LIMITS = {"max_decode_drop": 0.15, "max_ttft_rise": 0.30, "max_acceptance_drop": 0.10, "repeats": 2, "max_tokens": 8,
          "prompts": ["p"]}
BEFORE = {"decode_tok_s": 40.0, "ttft_ms": 200.0, "acceptance": 0.5, "runs": 4}


def test_figures_are_the_best_of_the_runs():
    runs = [{"ttft_s": 0.2, "decode_tok_s": 30.0}, {"ttft_s": 0.9, "decode_tok_s": 10.0}, {"ttft_s": 0.25, "decode_tok_s": 31.0}]
    assert G.figures(runs, 0.61234) == {"ttft_ms": 200.0, "decode_tok_s": 31.0, "acceptance": 0.6123, "runs": 3}
    assert G.figures([], None) == {"ttft_ms": None, "decode_tok_s": None, "acceptance": None, "runs": 0}


def test_a_run_slowed_by_the_neighbours_does_not_move_the_figures():
    """One release measured twice, the second time with half its runs slowed 5x by other work on the
    machine (as the CPU test hosts' equal-release rollout saw: decode 18.6 -> 3.31 on medians): the best
    runs are the same, so the comparison passes even at the GPU profile's tight limits."""
    quiet = [{"ttft_s": 0.20, "decode_tok_s": 30.0}, {"ttft_s": 0.21, "decode_tok_s": 29.5}] * 2
    loaded = quiet[:2] + [{"ttft_s": 1.0, "decode_tok_s": 6.0}, {"ttft_s": 1.1, "decode_tok_s": 5.9}]
    assert G.compare(G.figures(quiet), G.figures(loaded), LIMITS).verdict == G.PASSED


def test_an_equal_release_passes_with_its_figures_named():
    result = G.compare(BEFORE, {"decode_tok_s": 38.0, "ttft_ms": 230.0, "acceptance": 0.48}, LIMITS)
    assert result.verdict == G.PASSED and not result.regressed
    assert result.text() == ("within limits: decode tok/s 40 -> 38 (-5%, limit -15%); TTFT ms 200 -> 230 (+15%, limit "
                             "+30%); acceptance 0.5 -> 0.48 (-4%, limit -10%)")
    better = G.compare(BEFORE, {"decode_tok_s": 80.0, "ttft_ms": 50.0, "acceptance": 0.9}, LIMITS)
    assert better.verdict == G.PASSED and all(c.change < 0 for c in better.changes)


@pytest.mark.parametrize("new, worse", [
    ({"decode_tok_s": 33.0, "ttft_ms": 200.0, "acceptance": 0.5}, ["decode_tok_s"]),  # 17.5% slower decode
    ({"decode_tok_s": 40.0, "ttft_ms": 270.0, "acceptance": 0.5}, ["ttft_ms"]),  # 35% longer TTFT
    ({"decode_tok_s": 40.0, "ttft_ms": 200.0, "acceptance": 0.42}, ["acceptance"]),  # 16% less acceptance (syv-ai #73)
    ({"decode_tok_s": 20.0, "ttft_ms": 500.0, "acceptance": 0.5}, ["decode_tok_s", "ttft_ms"]),
])
def test_each_figure_worse_past_its_limit_is_a_regression_named(new, worse):
    result = G.compare(BEFORE, new, LIMITS)
    assert result.regressed and [c.figure for c in result.changes if c.worse] == worse
    assert result.text().startswith("REGRESSED: ")
    for figure in worse:
        assert G.LABELS[figure] in result.text()
    assert result.as_json()["verdict"] == "regressed" and [f["figure"] for f in result.as_json()["figures"] if f["worse"]] == worse


def test_at_the_limit_is_not_worse_and_a_zero_limit_is_strict():
    assert G.compare(BEFORE, {**BEFORE, "decode_tok_s": 34.0}, LIMITS).verdict == G.PASSED  # exactly -15%
    strict = {**LIMITS, "max_decode_drop": 0}
    assert G.compare(BEFORE, {**BEFORE, "decode_tok_s": 39.9}, strict).regressed


def test_no_baseline_and_figures_measured_on_one_side_only():
    assert G.compare(None, BEFORE, LIMITS).verdict == G.NO_BASELINE
    assert G.compare({}, BEFORE, LIMITS).text().startswith("no previous release with verify figures")
    # speculation off in the new release: acceptance is not compared, and said so
    result = G.compare(BEFORE, {"decode_tok_s": 40.0, "ttft_ms": 200.0, "acceptance": None}, LIMITS)
    assert result.verdict == G.PASSED and result.unmeasured == ("acceptance",)
    assert result.as_json()["unmeasured"] == ["acceptance"]


def test_figures_of_another_prompt_set_are_not_compared():
    """The stack's measuring set changed between two releases (the CPU profile's did, 2026-12-05):
    the old figures say nothing about the new prompts, so there is no baseline, said why; a record
    written before the set was kept (no prompt_set) is still compared."""
    old_set, new_set = G.prompt_set(LIMITS), G.prompt_set({**LIMITS, "prompts": ["a longer prompt"]})
    assert old_set != new_set and len(new_set) == 12 and G.prompt_set(dict(LIMITS)) == old_set
    assert G.prompt_set({**LIMITS, "max_tokens": 9}) != old_set and G.prompt_set({**LIMITS, "repeats": 5}) == old_set
    slower = {"decode_tok_s": 10.0, "ttft_ms": 900.0}
    result = G.compare({**BEFORE, "prompt_set": old_set}, {**slower, "prompt_set": new_set}, LIMITS)
    assert result.verdict == G.NO_BASELINE and not result.regressed
    assert "measured on another prompt set" in result.text() and new_set in result.text()
    assert G.compare(BEFORE, {**slower, "prompt_set": new_set}, LIMITS).regressed
    assert G.compare({**BEFORE, "prompt_set": new_set}, {**slower, "prompt_set": new_set}, LIMITS).regressed
    assert G.figures([{"ttft_s": 0.2, "decode_tok_s": 9.0}], None, measured_on=new_set)["prompt_set"] == new_set


@pytest.mark.parametrize("change, message", [
    ({"max_decode_drop": 1.0}, "max_decode_drop must be a fraction from 0 to below 1"),
    ({"max_ttft_rise": -0.1}, "max_ttft_rise must be a fraction from 0 to below 10"),
    ({"max_acceptance_drop": True}, "max_acceptance_drop must be a fraction"),
    ({"repeats": 0}, "repeats must be a whole number of 1 or more"),
    ({"prompts": []}, "prompts must be a list of one or more non-empty strings"),
])
def test_bad_limits_are_refused_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        G.check_limits({**LIMITS, **change})


def test_every_profile_has_limits_with_a_source_and_a_host_may_change_them():
    stack = load_stack()
    for name, profile in stack["profiles"].items():
        limits = profile["serve"]["regression"]
        G.check_limits(limits)
        sources = limits["source"] if isinstance(limits["source"], list) else [limits["source"]]
        assert all(s in stack["sources"] for s in sources), name
    resolved = resolve_stack(stack, "cpu-smoke", {"serve": {"regression": {"max_decode_drop": 0.5}}})
    assert resolved.profile["serve"]["regression"]["max_decode_drop"] == 0.5
    with pytest.raises(StackError, match="serve.regression: max_decode_drop must be a fraction"):
        resolve_stack(stack, "cpu-smoke", {"serve": {"regression": {"max_decode_drop": 2}}})
    with pytest.raises(BadHostData, match="qwen27b_stack_overrides.serve.regression.max_decode_dorp: unknown stack key"):
        settings_for("h", {"qwen27b_stack_overrides": {"serve": {"regression": {"max_decode_dorp": 0.5}}}})
    assert settings_for("h", {"qwen27b_rollback_on_regression": True}).rollback_on_regression is True
    with pytest.raises(BadHostData, match="qwen27b_rollback_on_regression"):
        settings_for("h", {"qwen27b_rollback_on_regression": "yes"})


def test_the_record_keeps_the_figures_and_the_baseline():
    record = Record({"/opt/qwen27b/current": "/opt/qwen27b/releases/abc"}, verify=dict(BEFORE),
                    baseline={"decode_tok_s": 41.0, "ttft_ms": 190.0})
    again = parse_record(json.loads(record_text(record)))
    assert again == record and again.verify == BEFORE
    # a record without figures (an older one) has none; junk in them is dropped, not trusted
    assert parse_record({"links": record.links}).verify == {}
    assert parse_record({"links": record.links, "verify": {"decode_tok_s": "fast", "ttft_ms": 5, "x": 1}}).verify == {"ttft_ms": 5}
    assert "verify" not in record_text(Record(record.links))
    # the figures as measured (acceptance None with speculation off) are written as they read back:
    # a null in the file made the next deploy's record differ (found by the e2e run)
    measured = Record(record.links, verify=G.figures([{"ttft_s": 0.2, "decode_tok_s": 9.0}], None))
    assert json.loads(record_text(measured))["verify"] == {"decode_tok_s": 9.0, "runs": 1, "ttft_ms": 200.0}
    assert record_text(parse_record(json.loads(record_text(measured)))) == record_text(measured)
    # the prompt set is kept beside them; anything else in its place is dropped
    kept = Record(record.links, verify={**BEFORE, "prompt_set": G.prompt_set(LIMITS)})
    assert parse_record(json.loads(record_text(kept))) == kept
    assert parse_record({"links": record.links, "verify": {"ttft_ms": 5, "prompt_set": "$(reboot)"}}).verify == {"ttft_ms": 5}


# ---------------------------------------------------------------------------------- rollout and status

def test_a_regressed_host_stops_the_rollout_named_with_its_figures(tmp_path):
    slow = G.compare(BEFORE, {"decode_tok_s": 20.0, "ttft_ms": 210.0, "acceptance": 0.5}, LIMITS).as_json()
    equal = G.compare(BEFORE, BEFORE, LIMITS).as_json()
    run = _deploys(tmp_path / "reports", {"a": equal, "b": slow})
    result = R.rollout("inv.py", [["a"], ["b"], ["c"]], [], tmp_path / "reports", run=run, say=lambda text: None)
    assert result.stopped_at == "b" and len(run.argvs) == 2  # c never deployed
    assert [(r.host, r.outcome) for r in result.rows] == [("a", "ok"), ("b", "regressed"), ("c", "not started")]
    text = R.summary(result)
    assert text.startswith("--> rollout STOPPED at b (regressed: REGRESSED: decode tok/s 40 -> 20 (-50%, limit -15%))")
    assert "vs previous release: a: within limits: decode tok/s 40 -> 40 (+0%, limit -15%)" in text
    assert "roll it back with `qwen27b rollback INVENTORY --limit b` (or run with --rollback-on-regression)" in text


def test_an_equal_release_rolls_on_and_the_summary_shows_each_comparison(tmp_path):
    equal = G.compare(BEFORE, {**BEFORE, "decode_tok_s": 39.0}, LIMITS).as_json()
    run = _deploys(tmp_path / "reports", {"a": equal, "b": equal})
    result = R.rollout("inv.py", [["a"], ["b"]], [], tmp_path / "reports", run=run, say=lambda text: None)
    assert result.ok
    text = R.summary(result)
    assert text.count("within limits: decode tok/s 40 -> 39 (-2%, limit -15%)") == 2


def test_rollback_on_regression_reaches_every_batch_as_host_data(tmp_path, monkeypatch):
    inventory = tmp_path / "inv.py"
    inventory.write_text("lab = [('@fake/a', {}), ('@fake/b', {})]\n")
    seen = []
    monkeypatch.setattr(R, "rollout", lambda inv, batches, extra, *a, **k: seen.append(extra) or R.Rollout(batches))
    assert R.main([str(inventory), "--rollback-on-regression", "--", "--data", "k=v"]) == 0
    assert seen == [["--data", "k=v", "--data", "qwen27b_rollback_on_regression=true"]]
    assert R.parse_args([str(inventory)])[0].rollback_on_regression is False


def test_status_shows_the_last_comparison(tmp_path, capsys):
    slow = G.compare(BEFORE, {**BEFORE, "ttft_ms": 900.0}, LIMITS).as_json()
    (tmp_path / "deploy-0001.json").write_text(json.dumps({"run": "0001", "summary": [], "hosts": [
        {"host": "a", "status": "rolled back", "reason": "rolled back: regressed", "comparison": slow},
        {"host": "b", "status": "ok"}]}))
    found = status.last_verifies(tmp_path, ["a", "b"])
    assert found["a"]["comparison"] == {"verdict": "regressed", "text": slow["text"]} and "comparison" not in found["b"]
    rows = [status.HostStatus("a", last_verify=found["a"]), status.HostStatus("b", last_verify=found["b"])]
    assert status.cells(rows[0])[6].endswith("; vs previous release: regressed")
    assert status.comparisons(rows) == "vs previous release: a: REGRESSED: TTFT ms 200 -> 900 (+350%, limit +30%)\n"


# ---------------------------------------------------------------------------------- the real measurement

def _prefix_cache(server) -> tuple[float, float]:
    """vLLM's own prefix-cache counters (tokens queried, tokens found cached), from its /metrics."""
    import re
    import urllib.request
    request = urllib.request.Request(f"{server['url']}/metrics", headers={"Authorization": f"Bearer {server['api_key']}"})
    text = urllib.request.urlopen(request, timeout=30).read().decode()

    def total(name):
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return total("vllm:prefix_cache_queries_total"), total("vllm:prefix_cache_hits_total")


def test_each_measuring_run_prefills_its_whole_prompt_on_a_real_vllm(vllm_server):
    """The CPU profile's measuring set on the session's real vllm serve (its prefix cache on, as in
    production): every run queries the cache for its whole prompt and finds none of it, though the
    set repeats each prompt (verify's chat_stream gives each run its own cache_salt). Without the
    salt the repeats were served from the cache: TTFT 50 ms for a 400-token prompt instead of ~500."""
    from qwen27b.controller import postdeploy as V
    limits = load_stack()["profiles"]["cpu-smoke"]["serve"]["regression"]
    queried, hits = _prefix_cache(vllm_server)
    runs = V.measure(vllm_server["url"], vllm_server["name"], vllm_server["api_key"], {**limits, "repeats": 2, "max_tokens": 4})
    queried_after, hits_after = _prefix_cache(vllm_server)
    assert len(runs) == 2 * len(limits["prompts"]) and all(r["completion_tokens"] == 4 for r in runs)
    assert queried_after - queried >= 2 * 150 * len(limits["prompts"])  # ~190 tokens a prompt, each run asked
    assert hits_after == hits, f"{hits_after - hits:.0f} prompt tokens came from the prefix cache"
