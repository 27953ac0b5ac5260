"""A real Prometheus on the controller watching a real deployed test host (issue 15's e2e test).

The deploy (test_deploy.py's fixtures: CPU smoke profile, loopback mirror, API key) with
``qwen27b_node_exporter: True`` (the host's prometheus-node-exporter on :9100 reads the health
check's qwen27b.prom), ``qwen27b_metrics_allow`` = the controller's address on the test network
(vLLM's /metrics without the key) and a 5 s health timer. Debian's ``prometheus`` on the controller
(tests/support/prometheus.py: loopback API, the shipped alert rules with shortened ``for:``)
scrapes host:9100 and host:8000/metrics. Then a real crash loop: a runtime drop-in makes the unit's
process exit at once (``ExecStart=/bin/false``, left in place so the loop lasts: a deploy would roll
back), systemd restarts it again and again. What Prometheus sees is systemd's counters and the health
check's verdict, whatever the process: /bin/false spares the loop's vLLM imports (~8 CPU-s a start on
the tier's shared 2 cores, issue 31); vLLM's own death at start-up (a bad flag) is the lifecycle
module's failing rollout and the copies module's failed upgrade. Asserted through
Prometheus's HTTP API: qwen27b_service_crash_loop went to 1, the crash-loop, service-down and
health-critical alerts reached ``firing``; the host's health endpoint (:9120) answers 503 meanwhile.
The drop-in removed and the unit restarted: the metrics return, the alerts resolve, 9120 answers 200.
"""

from __future__ import annotations

import shlex

import httpx
import pytest

from tests.support.e2e_deploy import PORT, deploy, lab, show, wait_healthy  # noqa: F401 (lab: a module fixture)
from tests.support.prometheus import Prometheus

pytestmark = pytest.mark.e2e
DROP_IN = "/run/systemd/system/qwen27b.service.d/90-e2e-crash.conf"  # /run: gone with a reboot too
NODE_EXPORTER_PORT = 9100  # Debian's prometheus-node-exporter default
HEALTH_PORT = 9120  # qwen27b_health_port's default
FAILING = {"Qwen27bCrashLoop", "Qwen27bServiceDown", "Qwen27bHealthCritical"}
HOLD = "4s"  # every alert's for: (two scrapes at 2 s)


def health_endpoint(address: str) -> tuple[int | None, dict | None]:
    """(status, JSON body) of the host's verdict endpoint; (None, None) when it does not answer."""
    try:
        r = httpx.get(f"http://{address}:{HEALTH_PORT}/", timeout=5, trust_env=False)
    except httpx.HTTPError:
        return None, None
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, None


def answered(address: str, status: int) -> dict | None:
    """The endpoint's JSON body once it answers ``status`` with one; None until then."""
    code, body = health_endpoint(address)
    return body if code == status and body is not None else None


def firing_alerts(prom: Prometheus) -> dict[str, dict]:
    return {a["labels"]["alertname"]: a for a in prom.alerts() if a["state"] == "firing"}


@pytest.fixture(scope="module")
def monitored(lab):
    """Deployed with node_exporter, the controller in metrics_allow and a 10 s health timer."""
    host = lab["host"]
    controller = host.lab.host(host.name)["gateway"]  # the controller's end of the host's veth
    extra = {"qwen27b_node_exporter": True, "qwen27b_metrics_allow": [f"{controller}/32"],
             "qwen27b_health_interval_s": 10}  # the endpoint calls a verdict STALE after 3x
    rc, out = deploy(lab, extra)
    assert rc == 0, out[-4000:]
    wait_healthy(lab["base"])
    return {**lab, "extra": extra, "controller": controller}


@pytest.fixture(scope="module")
def prom(monitored, tmp_path_factory):
    address = monitored["host"].address
    with Prometheus(tmp_path_factory.mktemp("prometheus"),
                    {"node": [f"{address}:{NODE_EXPORTER_PORT}"], "vllm": [f"{address}:{PORT}"]},
                    hold=HOLD, interval="2s") as server:
        yield server


def test_prometheus_scrapes_the_hosts_node_exporter_and_vllm(monitored, prom):
    prom.wait_until(lambda: prom.value('up{job="node"}') == 1 and prom.value('up{job="vllm"}') == 1,
                    "both targets up (vllm: /metrics without the key, the controller in metrics_allow)", timeout=60)
    prom.wait_until(lambda: prom.value('qwen27b_health_verdict{job="node"}') == 0, "the host's OK verdict", timeout=60)
    assert prom.value("qwen27b_service_up") == 1 and prom.value("qwen27b_service_crash_loop") == 0
    assert prom.value("node_textfile_scrape_error") == 0
    assert prom.value('count({job="vllm", __name__=~"vllm:.+"})') > 0  # vLLM's own series, scraped
    rules = prom.wait_until(prom.evaluated_rules, "every rule evaluated once")
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    assert prom.alert_states() == {}
    body = answered(monitored["host"].address, 200)
    assert body and body["verdict"] == "OK", health_endpoint(monitored["host"].address)


def test_a_crash_loop_fires_the_alerts_and_the_restored_service_resolves_them(monitored, prom):
    host = monitored["host"]
    drop_in = "[Service]\nExecStart=\nExecStart=/bin/false\n"
    host.run(f"mkdir -p {shlex.quote(DROP_IN.rsplit('/', 1)[0])} && printf %s {shlex.quote(drop_in)} > {DROP_IN} "
             "&& systemctl daemon-reload && systemctl restart --no-block qwen27b.service")
    try:
        # systemd's NRestarts reaches 2 after the third failed start (RestartSec=10 between)
        prom.wait_until(lambda: prom.value('qwen27b_service_crash_loop{job="node"}') == 1,
                        "qwen27b_service_crash_loop 1", timeout=300, every=2)
        assert (prom.value("qwen27b_service_systemd_restarts") or 0) >= 2
        assert prom.value("qwen27b_health_verdict") == 2 and prom.value("qwen27b_service_up") == 0
        # systemd resets Result at every start; the rule (onhost.contract.restart_state) counts
        # NRestarts >= 2 while the unit starts again, so the gauge holds through the retries
        firing = prom.wait_until(lambda: firing_alerts(prom) if FAILING <= set(firing_alerts(prom)) else None,
                                 f"{sorted(FAILING)} firing", timeout=300, every=1)
        assert firing["Qwen27bCrashLoop"]["annotations"]["summary"] == \
            f"qwen27b.service on {host.address}:{NODE_EXPORTER_PORT} is in a crash loop"
        body = prom.wait_until(lambda: answered(host.address, 503), "the health endpoint's 503", timeout=60)
        assert body["verdict"] == "CRITICAL", body
        assert int(show(monitored, "NRestarts")) >= 2
    finally:
        host.run(f"rm -f {DROP_IN} && systemctl daemon-reload && systemctl reset-failed qwen27b.service; "
                 "systemctl restart --no-block qwen27b.service", check=False)
    wait_healthy(monitored["base"])
    prom.wait_until(lambda: prom.value('qwen27b_health_verdict{job="node"}') == 0
                    and prom.value("qwen27b_service_crash_loop") == 0, "the recovered verdict", timeout=120)
    prom.wait_until(lambda: not set(prom.alert_states()) & FAILING, "the alerts resolved", timeout=60)
    # vLLM answers again: Prometheus's next scrape of it succeeds (the recovered verdict can come
    # from a health check that ran between two vLLM scrapes: CI saw up 0 read right after it)
    prom.wait_until(lambda: prom.value('up{job="vllm"}') == 1, "vLLM scraped again", timeout=60)
    # the whole episode, from the stored series: the gauge went 0 -> 1 -> 0, the alert fired and ended
    assert prom.value('max_over_time(qwen27b_service_crash_loop{job="node"}[30m])') == 1
    assert prom.value('max_over_time(ALERTS{alertname="Qwen27bCrashLoop",alertstate="firing"}[30m])') == 1
    body = prom.wait_until(lambda: answered(host.address, 200), "the health endpoint's 200", timeout=60)
    assert body["verdict"] in ("OK", "WARNING"), body
