"""The monitoring pipeline, real from the textfile to the alert: the health check's own exporter
code (qwen27b.onhost.metrics) writes qwen27b.prom, Debian's prometheus-node-exporter serves it,
Debian's prometheus scrapes it every second and evaluates monitoring/qwen27b-alerts.yml (its
``for:`` holds shortened, tests/support/prometheus.py). Asserted through Prometheus's HTTP API:
the metrics arrive, a crash loop with a CRITICAL verdict fires the crash-loop, service-down and
health-critical alerts (and nothing else), a healthy status resolves them. promtool's rule tests
(tests/unit/slow/test_alert_rules.py) check the expressions on written series; this checks them on what the
exporter really writes, as a server really scrapes it. The e2e tier does the same on a test host."""

from __future__ import annotations

import time

import pytest

from qwen27b.onhost import metrics
from qwen27b.onhost.statusfile import iso
from tests.support.prometheus import Prometheus, node_exporter, shortened_rules

pytest.importorskip("prometheus_client")
from tests.support.health_status import status, v100_gpus  # noqa: E402

HEALTHY = {"Result": "success", "SubState": "running", "ActiveState": "active", "NRestarts": "0"}
# what `systemctl show` says of a unit whose process keeps exiting at start-up (a bad flag)
LOOPING = {"Result": "exit-code", "SubState": "auto-restart", "ActiveState": "activating", "NRestarts": "4"}
FAILING = {"Qwen27bCrashLoop", "Qwen27bServiceDown", "Qwen27bHealthCritical"}


def write(textfile_dir, systemd: dict, **change) -> None:
    """One health check's textfile, as export_metrics writes it (fresh timestamp, the GPUs of a
    recorded healthy V100 host)."""
    s = status(time=iso(time.time()), gpu=v100_gpus("v100x4-converged"), systemd=systemd, **change)
    metrics.write_metrics(str(textfile_dir), metrics.metrics_registry(s, release="r-test", model_ref="m@1"))


def test_crash_loop_and_critical_verdict_fire_and_recovery_resolves(tmp_path):
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    write(textfile, HEALTHY)
    with node_exporter(textfile, log=tmp_path / "node_exporter.log") as target, \
            Prometheus(tmp_path / "prometheus", {"node": [target]}, hold="2s") as prom:
        prom.wait_until(lambda: prom.value('qwen27b_health_verdict{job="node"}') == 0, "the OK verdict scraped")
        assert prom.value("node_textfile_scrape_error") == 0
        assert prom.value("qwen27b_service_crash_loop") == 0 and prom.value("qwen27b_service_up") == 1
        assert len(prom.values("qwen27b_gpu_up == 1")) == 4
        # every shipped rule evaluates without error on the real series, and none is active
        rules = prom.wait_until(prom.evaluated_rules, "every rule evaluated once")
        assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
        assert len(rules) == sum(len(g["rules"]) for g in shortened_rules()["groups"])  # every group's
        assert prom.alert_states() == {}

        write(textfile, LOOPING, code=2, health_status=None, latency_ms=None, consecutive_failures=3)
        prom.wait_until(lambda: prom.value("qwen27b_service_crash_loop") == 1, "the crash loop scraped")
        assert prom.value("qwen27b_service_systemd_restarts") == 4
        assert prom.value("qwen27b_health_verdict") == 2 and prom.value("qwen27b_service_up") == 0
        prom.wait_until(lambda: set(prom.alert_states().values()) == {"firing"}
                        and set(prom.alert_states()) == FAILING, f"{sorted(FAILING)} firing")
        alerts = {a["labels"]["alertname"]: a for a in prom.alerts()}
        assert all(a["labels"]["severity"] == "critical" for a in alerts.values())
        assert alerts["Qwen27bCrashLoop"]["annotations"]["summary"] == \
            f"qwen27b.service on {target} is in a crash loop"
        # the ALERTS series, stored by the same evaluation (committed just after the API's state)
        prom.wait_until(lambda: {r["metric"]["alertname"] for r in prom.query('ALERTS{alertstate="firing"}')} == FAILING,
                        "ALERTS{alertstate=firing} stored")

        write(textfile, HEALTHY)
        prom.wait_until(lambda: prom.value("qwen27b_service_crash_loop") == 0, "the recovery scraped")
        prom.wait_until(lambda: prom.alert_states() == {}, "every alert resolved")
        prom.wait_until(lambda: prom.values("ALERTS") == [], "ALERTS gone stale")


def test_the_rules_copy_differs_only_in_its_holds(tmp_path):
    """What the server above evaluates is the shipped file with ``for:`` shortened, nothing else."""
    import subprocess

    import yaml

    from tests.support.prometheus import RULES, binary
    shipped, short = yaml.safe_load(RULES.read_text()), shortened_rules("2s")
    held = [r for g in short["groups"] for r in g["rules"] if "for" in r]
    assert held and {r["for"] for r in held} == {"2s"}
    for rule in (r for doc in (shipped, short) for g in doc["groups"] for r in g["rules"]):
        rule.pop("for", None)
    assert short == shipped
    copy = tmp_path / "rules.yml"
    copy.write_text(yaml.safe_dump(shortened_rules("2s")))
    p = subprocess.run([binary("promtool"), "check", "rules", str(copy)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
