"""The shipped alert rules (monitoring/qwen27b-alerts.yml): checked and unit-tested by promtool on
hand-written series (tests/monitoring/), and held to the health check's own lists and names so
the two cannot drift: the fatal Xids, the bad throttle reasons, the exported metric names, the
vLLM counter names verify reads."""

import re
import subprocess

import pytest
import yaml

from qwen27b.onhost import contract
from qwen27b.onhost import gpu
from qwen27b.controller import postdeploy as verify
from tests.support.paths import ROOT
from tests.support.promtool import _promtool, gateway_usage_names

RULES = ROOT / "monitoring" / "qwen27b-alerts.yml"
RULE_TESTS = sorted((ROOT / "tests" / "monitoring").glob("*.yml"))


def rules() -> dict:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def _alternatives(expr: str, label: str) -> set[str]:
    m = re.search(label + r'=~"([^"]+)"', expr)
    assert m, f"no {label}=~ matcher in {expr!r}"
    return set(m.group(1).split("|"))


def test_fatal_xid_rule_is_the_health_checks_list():
    assert _alternatives(rules()["Qwen27bFatalXid"]["expr"], "xid") == {str(x) for x in contract.XID_FATAL}


def test_throttle_rule_is_the_health_checks_bad_reasons():
    assert _alternatives(rules()["Qwen27bGpuThrottled"]["expr"], "reason") == gpu.THROTTLE_BAD


def test_every_metric_a_rule_reads_exists():
    """qwen27b_* names against what the exporter writes; vllm:* against the names verify parses."""
    from tests.support.health_status import full_status_names
    exported = full_status_names()
    vllm = {p.pattern.split("(")[0].lstrip("^") for p in (verify.SPEC_DRAFT, verify.SPEC_ACCEPTED)}
    vllm.add("vllm:kv_cache_usage_perc")  # doctor's step 4 reads it (docs/doctor.md)
    exported |= gateway_usage_names()
    for name, rule in rules().items():
        used = set(re.findall(r"\b(qwen27b_[a-z_]+|vllm:[a-z_]+)", rule["expr"]))
        assert used, name
        assert used - exported - vllm == set(), name
        assert {"severity"} <= set(rule["labels"]) and {"summary", "doctor"} <= set(rule["annotations"]), name


def test_promtool_check_rules():
    p = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(rules())} rules found" in p.stdout


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(test_file):
    p = subprocess.run([_promtool(), "test", "rules", test_file.name], capture_output=True, text=True,
                       timeout=120, cwd=test_file.parent)
    assert p.returncode == 0, p.stdout + p.stderr


def test_rule_tests_cover_every_alert():
    tested = {t["alertname"] for f in RULE_TESTS for case in yaml.safe_load(f.read_text())["tests"]
              for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert tested == set(rules())


def test_docs_describe_every_alert():
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    assert set(re.findall(r"^\| `(Qwen27b[A-Za-z]+)`", doc, re.M)) == set(rules())
