"""The health check's Prometheus textfile (qwen27b/onhost/health.py, metrics part): the exposition text
parsed back with prometheus_client's own parser, fed from recorded GPUs (the genuine H200 NVML
reading in shared/fixtures through test_health's faked driver; the hand-written V100 hosts in
tests/fixtures/hosts, whose README says which machine each stands for), the atomic 0644 write,
and the docs' metric list against what is exported."""

import os
import re
import stat
from pathlib import Path

import pytest

from qwen27b.onhost import contract
from qwen27b.onhost import gpu
from qwen27b.onhost import metrics
from qwen27b.onhost import statusfile
from tests.support.health_status import HOSTS, full_status_families, full_status_names, status, v100_gpus
from tests.support.paths import ROOT

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def exposition(s: dict, **kw) -> dict:
    """-> {sample name: {frozenset(labels): value}} (counters keep their _total sample name)."""
    text = prometheus_client.generate_latest(
        metrics.metrics_registry(s, release=kw.get("release", "r-20261203"), model_ref="Qwen/x@abc",
                            systemd=kw.get("systemd"), speculative=kw.get("speculative"))).decode()
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def one(samples: dict, metric: str, /, **labels) -> float:
    return samples[metric][frozenset({k: str(v) for k, v in labels.items()}.items())]


def test_verdict_and_state_one_hot():
    for code, name in contract.LEVELS.items():
        m = exposition(status(code=code))
        assert one(m, "qwen27b_health_verdict") == code
        assert {dict(k)["state"]: v for k, v in m["qwen27b_health_state"].items()} == {
            n: (1.0 if n == name else 0.0) for n in contract.LEVELS.values()}
    m = exposition(status())
    assert one(m, "qwen27b_service_up") == 1 and one(m, "qwen27b_health_latency_seconds") == 0.0125
    assert one(m, "qwen27b_health_last_run_timestamp_seconds") == statusfile.epoch("2026-12-03T20:00:00+00:00")
    assert one(m, "qwen27b_build_info", release="r-20261203", model="Qwen/x@abc", unit="qwen27b.service",
               speculative="") == 1
    m = exposition(status(), speculative="mtp:7")  # the method in use, for the alert rules' join
    assert one(m, "qwen27b_build_info", release="r-20261203", model="Qwen/x@abc", unit="qwen27b.service",
               speculative="mtp:7") == 1
    assert "qwen27b_gpu_up" not in m  # a CPU-only host has no GPU series at all, not zeros


def test_recorded_h200_through_nvml(monkeypatch):
    from tests.support.health_check import _fake_driver, _h200_reading
    _fake_driver(monkeypatch)
    gpus, _ = gpu.read_gpus()
    m = exposition(status(gpu=gpus))
    total, used, _free = _h200_reading()["mem"]
    assert one(m, "qwen27b_gpu_memory_total_bytes", gpu=0) == total // 2**20 * 2**20  # MiB precision
    assert one(m, "qwen27b_gpu_memory_used_bytes", gpu=0) == used // 2**20 * 2**20
    assert one(m, "qwen27b_gpu_temperature_celsius", gpu=0) == 32
    assert one(m, "qwen27b_gpu_ecc_uncorrected_errors", gpu=0) == 0
    assert one(m, "qwen27b_gpu_info", gpu=0, pci="00000000:18:00.0", name="NVIDIA H200") == 1
    assert {dict(k)["reason"] for k, v in m["qwen27b_gpu_throttle_reason"].items() if v} == {"gpu_idle"}
    assert len(m["qwen27b_gpu_throttle_reason"]) == len(gpu.THROTTLE_BITS)  # every reason, 0 when inactive
    # Hopper remaps rows: NVML says Not Supported for retired pages, so no series (not a healthy 0)
    assert "qwen27b_gpu_retired_pages" not in m and "qwen27b_gpu_retired_pages_pending" not in m


def test_recorded_v100_degraded_lost_gpu_and_fatal_xid():
    """v100x4-degraded: GPU 2 fell off the bus (its kernel line in xid-errors.txt)."""
    gpus = v100_gpus("v100x4-degraded")
    gpus[2] = {"index": 2, "error": "GPU is lost"}
    xids = gpu.parse_xids((HOSTS / "v100x4-degraded" / "xid-errors.txt").read_text())
    assert [x["xid"] for x in xids] == [79]
    counts = metrics.accumulate_xids(None, xids)
    m = exposition(status(code=2, gpu=gpus, xids=xids, xid_counts=counts))
    assert [one(m, "qwen27b_gpu_up", gpu=i) for i in range(4)] == [1, 1, 0, 1]
    assert one(m, "qwen27b_gpu_memory_total_bytes", gpu=0) == 32510 * 2**20
    assert frozenset({("gpu", "2")}) not in m["qwen27b_gpu_memory_total_bytes"]
    assert one(m, "qwen27b_xid_total", xid=79, fatal="true") == 1
    assert one(m, "qwen27b_xid_total", xid=48, fatal="true") == 0
    assert one(m, "qwen27b_health_xids_new") == 1
    assert "qwen27b_xid_created" not in m  # the count is the status file's, not this run's


def test_xid_counts_accumulate_and_start_at_zero():
    first = metrics.accumulate_xids(None, [])
    assert set(first) == {str(x) for x in set(contract.XID_ADVICE) | contract.XID_FATAL} and set(first.values()) == {0}
    later = metrics.accumulate_xids(metrics.accumulate_xids(first, [{"xid": 79}]), [{"xid": 79}, {"xid": 119}])
    assert later["79"] == 2 and later["119"] == 1 and later["48"] == 0


def test_crash_loop_from_systemd_counters():
    looping = {"Result": "exit-code", "SubState": "auto-restart", "NRestarts": "4", "ActiveState": "activating"}
    m = exposition(status(code=2), systemd=looping)
    assert one(m, "qwen27b_service_crash_loop") == 1 and one(m, "qwen27b_service_systemd_restarts") == 4
    once = dict(looping, NRestarts="1")
    assert one(exposition(status(code=2), systemd=once), "qwen27b_service_crash_loop") == 0
    gave_up = dict(looping, Result="start-limit-hit", SubState="failed", NRestarts="5")
    assert one(exposition(status(code=2), systemd=gave_up), "qwen27b_service_crash_loop") == 1
    healthy = {"Result": "success", "SubState": "running", "NRestarts": "0", "ActiveState": "active"}
    assert one(exposition(status(), systemd=healthy), "qwen27b_service_crash_loop") == 0


def test_write_is_atomic_0644_whatever_the_umask(tmp_path):
    old = os.umask(0o077)  # the health unit could well run with UMask=0077
    try:
        path = metrics.write_metrics(str(tmp_path), metrics.metrics_registry(status(), release="r", model_ref=None))
    finally:
        os.umask(old)
    assert path == str(tmp_path / "qwen27b.prom")
    assert [p.name for p in tmp_path.iterdir()] == ["qwen27b.prom"]  # no temp file left behind
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.umask(old) == old  # restored
    names = {f.name for f in text_string_to_metric_families(Path(path).read_text())}
    assert "qwen27b_health_verdict" in names


def test_export_metrics_never_breaks_the_check(tmp_path):
    import argparse
    ns = argparse.Namespace(textfile_dir=contract.TEXTFILE_DIR + "-absent-for-test", unit="x.service", model_ref=None)
    assert "not installed" in metrics.export_metrics(ns, status())
    ns.textfile_dir = ""
    assert metrics.export_metrics(ns, status()) is None
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    ns.textfile_dir = str(ro)
    if os.geteuid() != 0:  # root writes anyway
        assert "cannot write metrics" in metrics.export_metrics(ns, status(systemd={"NRestarts": "0"}))


def docs_metrics_table() -> dict[str, tuple[str, frozenset]]:
    """docs/monitoring.md's metric table (between its <!-- metrics --> markers): name -> type, labels."""
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    table = doc.split("<!-- metrics -->")[1].split("<!-- /metrics -->")[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`(qwen27b_[a-z_]+)`", cells[0])
        if m:
            assert m.group(1) not in out, f"{m.group(1)} listed twice"
            out[m.group(1)] = (cells[1], frozenset(re.findall(r"`([a-z_]+)`", cells[2])))
    return out


def test_docs_list_exactly_the_exported_metrics():
    """Names, types and label names: the docs' table is what a dashboard or rule author reads."""
    listed, exported = docs_metrics_table(), full_status_families()
    assert set(listed) == set(exported)
    assert {n: listed[n] for n in listed if listed[n] != exported[n]} == {}, \
        {n: exported[n] for n in listed if listed[n] != exported[n]}


def test_node_exporter_reads_the_file(tmp_path):
    """Debian's prometheus-node-exporter (`./run` installs it) serves the written file with
    node_textfile_scrape_error 0, on a loopback port, then stopped (tests/support/prometheus.py)."""
    import httpx

    from tests.support.prometheus import node_exporter
    gpus = v100_gpus("v100x4-degraded")
    gpus[2] = {"index": 2, "error": "GPU is lost"}
    looping = {"Result": "exit-code", "SubState": "auto-restart", "NRestarts": "3"}
    stalled = {"running": 2.0, "waiting": 1.0, "tokens": 4096.0, "busy_since": 1.0,
               "last_probe": {"time": 1.0, "ok": True, "latency_ms": 80.0}}
    metrics.write_metrics(str(tmp_path), metrics.metrics_registry(
        status(code=2, gpu=gpus, liveness=stalled, stalled=True), release="r", model_ref="m@1", systemd=looping))
    with node_exporter(tmp_path) as address:
        text = httpx.get(f"http://{address}/metrics", timeout=5, trust_env=False).text
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for f in text_string_to_metric_families(text) for x in f.samples}
    assert samples[("node_textfile_scrape_error", ())] == 0
    assert samples[("qwen27b_service_crash_loop", ())] == 1
    assert samples[("qwen27b_gpu_up", (("gpu", "2"),))] == 0
    assert samples[("qwen27b_engine_stalled", ())] == 1
    assert samples[("qwen27b_engine_requests", (("state", "waiting"),))] == 1
    exported = {name for name, _ in samples if name.startswith("qwen27b_")}
    assert exported == full_status_names() - {"qwen27b_health_last_restart_timestamp_seconds"}


def test_a_copys_series_all_carry_its_label_in_its_own_file(tmp_path):
    """Two copies on one host write qwen27b@a.prom and qwen27b@b.prom, every series labelled by copy."""
    gpus = v100_gpus("v100x4-copies-converged")
    for name, own in (("a", gpus[:2]), ("b", gpus[2:])):
        reg = metrics.metrics_registry(status(gpu=own, unit=f"qwen27b@{name}.service"), release="r", model_ref=None)
        path = metrics.write_metrics(str(tmp_path), metrics.labelled(reg, name), name)
        assert os.path.basename(path) == f"qwen27b@{name}.prom"
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["qwen27b@a.prom", "qwen27b@b.prom"]
    seen = {}
    for name in ("a", "b"):
        for family in text_string_to_metric_families((tmp_path / f"qwen27b@{name}.prom").read_text()):
            for sample in family.samples:
                assert sample.labels.get("copy") == name, (name, sample)
                seen.setdefault(sample.name, set()).add((name, sample.labels.get("gpu")))
    assert seen["qwen27b_health_verdict"] == {("a", None), ("b", None)}
    assert {g for c, g in seen["qwen27b_gpu_up"] if c == "a"} == {"0", "1"}
    assert {g for c, g in seen["qwen27b_gpu_up"] if c == "b"} == {"2", "3"}
    assert metrics.labelled(reg, None) is reg  # the one-service host's series are unchanged


def test_export_metrics_of_a_copy_writes_its_file(tmp_path):
    import argparse
    ns = argparse.Namespace(textfile_dir=str(tmp_path), unit="qwen27b@b.service", model_ref=None, copy="b")
    assert metrics.export_metrics(ns, status(systemd={"NRestarts": "0"})) is None
    assert [p.name for p in tmp_path.iterdir()] == ["qwen27b@b.prom"]
