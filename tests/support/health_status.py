"""The health check's status file as the exporter reads it (`status`, a recorded V100 host's GPUs) and every
metric family it can write: shared by the metrics, alert-rule, dashboard and Prometheus tests."""

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from qwen27b.onhost import gpu
from qwen27b.onhost import metrics
from tests.support.paths import ROOT


HOSTS = ROOT / "tests" / "fixtures" / "hosts"


def status(**change) -> dict:
    s = {"time": "2026-12-03T20:00:00+00:00", "code": 0, "consecutive_failures": 0, "restart_after": 3,
         "last_restart": None, "health_status": 200, "latency_ms": 12.5, "systemd": None,
         "unit": "qwen27b.service", "gpu": None, "xids": [], "xid_counts": metrics.accumulate_xids(None, [])}
    s.update(change)
    return s


def v100_gpus(host: str) -> list[dict]:
    """read_gpus' shape for a recorded V100 host: name, bus id and memory from its query-gpu CSV."""
    gpus = []
    for line in (HOSTS / host / "nvidia-smi-query-gpu.csv").read_text().splitlines():
        f = [v.strip() for v in line.split(",")]
        gpus.append({"index": int(f[0]), "name": f[1], "pci": f[3], "memory_used_mib": 0,
                     "memory_total_mib": int(f[4]), "temperature_c": 35, "ecc_uncorrected": 0,
                     "retired_pages_pending": False, "retired_pages": 0,
                     "throttle": {"mask": "0x1", "reasons": gpu.decode_throttle(0x1)}})
    return gpus


def full_status_families() -> dict[str, tuple[str, frozenset]]:
    """Every sample name the exporter can write (a status with every part present) -> its
    family's type and the label names its samples carry."""
    gpus = v100_gpus("v100x4-converged")
    s = status(gpu=gpus, last_restart={"time": "2026-12-03T19:00:00+00:00"}, xids=[], stalled=False,
               liveness={"running": 1.0, "waiting": 0.0, "tokens": 24.0, "busy_since": None,
                         "last_probe": {"time": 1.0, "ok": True, "latency_ms": 80.0}})
    text = prometheus_client.generate_latest(metrics.metrics_registry(
        s, release="r", model_ref="m", systemd={"NRestarts": "0", "Result": "success"})).decode()
    out: dict = {}
    for f in text_string_to_metric_families(text):
        for sample in f.samples:
            kind, labels = out.get(sample.name, (f.type, frozenset()))
            out[sample.name] = (kind, labels | set(sample.labels))
    return out


def full_status_names() -> set[str]:
    return set(full_status_families())
