"""Issue 27: the health check tells a fault a restart fixes from one that needs a reboot or a human
(pending page retirement, uncorrected ECC, a GPU off the bus), says so in its verdict and metrics,
and never restarts the service for the latter, however many CRITICAL runs pile up."""

from __future__ import annotations

import argparse

import pytest

from qwen27b.onhost import health as hc
from qwen27b.onhost import metrics

UNIT = "qwen27b.service"
DOWN = {"status": None, "latency_ms": None, "error": "ConnectError: refused"}
UP = {"status": 200, "latency_ms": 3.0, "error": None}


def _gpu(**kw):
    return {"index": 1, "name": "Tesla V100-SXM2-32GB", "pci": "00000000:3B:00.0", "memory_used_mib": 0,
            "memory_total_mib": 32768, "temperature_c": 40, "ecc_uncorrected": 0, "retired_pages_pending": False,
            "throttle": {"mask": "0x1", "reasons": ["gpu_idle"]}, **kw}


def _readings(gpu=None, xids=(), health=UP):
    return {"url": "http://127.0.0.1:8000", "unit": UNIT, "served_name": "m", "key_error": None, "health": health,
            "models": {"status": 200 if health is UP else None, "ids": ["m"] if health is UP else None,
                       "error": None if health is UP else health["error"]},
            "gpu": gpu, "xids": list(xids)}


@pytest.mark.parametrize("gpu, xids, needs", [
    (_gpu(ecc_uncorrected=3, retired_pages_pending=True), [], "reboot"),
    (_gpu(retired_pages_pending=True), [], "reboot"),
    ({"index": 1, "error": "GPU is lost"}, [], "human"),
    (_gpu(), [{"time": None, "pci": "0000:3b:00", "xid": 79, "pid": None, "name": None, "message": ""}], "human"),
    (_gpu(), [{"time": None, "pci": "0000:3b:00", "xid": 48, "pid": None, "name": None, "message": ""}], "reboot"),
    (_gpu(), [{"time": None, "pci": "0000:3b:00", "xid": 13, "pid": None, "name": None, "message": ""}], None),
    (_gpu(temperature_c=90), [], None),
], ids=["uncorrected+pending", "pending", "lost", "xid79", "xid48", "xid13-restartable", "hot"])
def test_findings_say_what_a_gpu_fault_needs(gpu, xids, needs):
    code, findings = hc.verdict(_readings([gpu], xids))
    assert hc.needs_attention(findings) == needs
    if needs:
        marked = [f for f in findings if f.get("kind")]
        assert marked and all("cannot help" in f["text"] for f in marked)


def test_the_watchdog_does_not_restart_for_a_fault_that_needs_a_reboot():
    base = dict(code=2, failures=9, restart_after=3, last_restart=None, now=10_000.0, min_interval_s=600,
                unit_state="failed", enabled=True, unit=UNIT)
    assert hc.restart_decision(**base)[0] == "restart"  # the same run without the GPU fault restarts
    action, why = hc.restart_decision(**base, needs="reboot")
    assert action == "skip" and "needs a reboot" in why and "would only loop" in why


def _args(tmp_path):
    return argparse.Namespace(status_file=str(tmp_path / "status.json"), api_key_file=None, url="http://127.0.0.1:8000",
                              timeout=1.0, unit=UNIT, stall_after_s=300, served_name="m", idle_probe_every_s=300,
                              idle_probe_deadline_s=30, slow_ms=1000.0, restart_after=3, restart_min_interval_s=0.0,
                              no_restart=False, restart_request=None)


def test_check_never_restarts_on_a_pending_retirement_and_says_so(tmp_path, monkeypatch):
    """Ten CRITICAL runs (vLLM died on the uncorrected error): no restart, the verdict and the gauge
    say a reboot is needed. Without the GPU fault the third run restarts (the fake is called)."""
    restarts = []
    monkeypatch.setattr(hc, "check_owner", lambda url, pid: {"ours": False, "listening": False, "holders": [],
                                                             "text": "nothing listens there", "main_pid": pid})
    monkeypatch.setattr(hc, "probe", lambda url, key, timeout, **kw: (dict(DOWN), {"status": None, "ids": None,
                                                                             "error": DOWN["error"]}))
    monkeypatch.setattr(hc, "unit_properties", lambda unit: {})
    monkeypatch.setattr(hc, "read_xids", lambda since: ([], "journal"))
    monkeypatch.setattr(hc, "restart_unit", lambda unit: restarts.append(unit) or (True, "restarted"))
    monkeypatch.setattr(hc, "read_gpus", lambda **kw: ([_gpu(ecc_uncorrected=2, retired_pages_pending=True)], None))
    args = _args(tmp_path)
    for n in range(10):
        s = hc.check(args, now=1_000_000.0 + 60 * n)
        hc.write_status(args.status_file, s)
    assert restarts == []
    assert s["verdict"] == "CRITICAL" and s["needs"] == "reboot" and s["consecutive_failures"] == 10
    assert "not restarting qwen27b.service" in s["restart"]["reason"] and s["restart"]["action"] == "skip"
    assert "NEEDS A REBOOT" in hc.one_line(s) and "needs" in hc.table(s)
    registry = metrics.metrics_registry({**s, "xid_counts": {}}, release=None, model_ref=None)
    assert registry.get_sample_value("qwen27b_health_needs", {"what": "reboot"}) == 1
    assert registry.get_sample_value("qwen27b_health_needs", {"what": "human"}) == 0

    monkeypatch.setattr(hc, "read_gpus", lambda **kw: ([_gpu()], None))
    fresh = _args(tmp_path / "b")
    (tmp_path / "b").mkdir()
    for n in range(3):
        s = hc.check(fresh, now=2_000_000.0 + 60 * n)
        hc.write_status(fresh.status_file, s)
    assert restarts == [UNIT] and s["needs"] is None
