"""The health check's readings as ``qwen27b_*`` Prometheus gauges in node_exporter's textfile
directory, written with prometheus_client (imported lazily: a venv without it still gets the
verdict)."""

from __future__ import annotations

import argparse
import os
import sys

from .contract import LEVELS, TEXTFILE_DIR, XID_ADVICE, XID_FATAL, crash_loop, textfile_name
from .gpu import THROTTLE_BITS
from .statusfile import epoch
from .unit import unit_properties

def accumulate_xids(previous: dict | None, xids: list[dict] | None) -> dict[str, int]:
    """Xid counts since the status file began, by Xid number (str keys: JSON).  A counter, not a
    per-run gauge: a 30 s gauge is missed by a 60 s scrape, a counter's increase() is not.  Every
    known Xid starts at 0 so that the first one is an increase, not a new series at 1."""
    counts = {str(x): 0 for x in sorted(set(XID_ADVICE) | XID_FATAL)}
    counts.update({str(k): int(v) for k, v in (previous or {}).items() if str(k).isdigit()})
    for x in xids or []:
        counts[str(x["xid"])] = counts.get(str(x["xid"]), 0) + 1
    return counts


class _Fixed:
    """A collector that yields metric families built beforehand."""

    def __init__(self, *families):
        self.families = families

    def collect(self):
        return iter(self.families)


class _Labelled:
    """Every series of a registry with one more label: a copy's check writes copy="NAME" on each, so
    two copies' series on one host (one node_exporter) stay apart."""

    def __init__(self, registry, name: str, value: str):
        self.registry, self.name, self.value = registry, name, value

    def collect(self):
        for family in self.registry.collect():
            family.samples = [sample._replace(labels={**sample.labels, self.name: self.value})
                              for sample in family.samples]
            yield family


def labelled(registry, copy: str | None):
    """The registry itself, or for a copy a registry whose series all carry copy="NAME"."""
    if not copy:
        return registry
    from prometheus_client import CollectorRegistry

    out = CollectorRegistry()
    out.register(_Labelled(registry, "copy", copy))
    return out


def metrics_registry(s: dict, *, release: str | None, model_ref: str | None, systemd: dict | None = None,
                     speculative: str | None = None):
    """A status dict (what :func:`check` returns, plus ``xid_counts``) -> a prometheus_client
    CollectorRegistry of ``qwen27b_*`` gauges.  Readings NVML calls Not Supported are left out
    rather than written as 0: an absent series is "unknown", a 0 would claim a healthy reading."""
    from prometheus_client import CollectorRegistry, Gauge, Info
    from prometheus_client.core import CounterMetricFamily

    reg = CollectorRegistry()

    def gauge(name, doc, labels=()):
        return Gauge(name, doc, labels, registry=reg)

    gauge("qwen27b_health_verdict", "Health check verdict as its nagios code: 0 OK, 1 WARNING, 2 CRITICAL, "
          "3 UNKNOWN").set(s["code"])
    state = gauge("qwen27b_health_state", "1 for the health check's current verdict, 0 for the others", ["state"])
    for code, name in LEVELS.items():
        state.labels(name).set(1 if code == s["code"] else 0)
    ran = epoch(s.get("time"))
    if ran is not None:
        gauge("qwen27b_health_last_run_timestamp_seconds", "When the health check last ran (Unix time)").set(ran)
    gauge("qwen27b_health_consecutive_failures", "Consecutive CRITICAL health checks").set(s["consecutive_failures"])
    gauge("qwen27b_health_restart_after", "The watchdog restarts the unit after this many consecutive "
          "CRITICAL checks").set(s["restart_after"])
    last = epoch((s.get("last_restart") or {}).get("time"))
    if last is not None:
        gauge("qwen27b_health_last_restart_timestamp_seconds", "When the health watchdog last restarted the "
              "unit (Unix time)").set(last)
    needs = gauge("qwen27b_health_needs", "1 for what a GPU fault needs that a restart cannot fix (reboot: "
                  "pending page retirement, uncorrected ECC; human: off the bus, unreadable); the watchdog does not "
                  "restart for it", ["what"])
    for what in ("reboot", "human"):
        needs.labels(what).set(1 if s.get("needs") == what else 0)
    gauge("qwen27b_service_up", "1 when vLLM's /health answered 200").set(1 if s.get("health_status") == 200 else 0)
    if s.get("latency_ms") is not None:
        gauge("qwen27b_health_latency_seconds", "Time /health took to answer").set(s["latency_ms"] / 1000)
    systemd = systemd if systemd is not None else s.get("systemd")
    if systemd and str(systemd.get("NRestarts", "")).isdigit():
        gauge("qwen27b_service_systemd_restarts", "systemd's automatic restarts of the unit (NRestarts) since "
              "it was last started by hand").set(int(systemd["NRestarts"]))
    if systemd:
        gauge("qwen27b_service_crash_loop", "1 when systemd keeps restarting the unit (crash loop or start "
              "limit hit)").set(1 if crash_loop(systemd) else 0)

    live = s.get("liveness")
    if live:
        gauge("qwen27b_engine_stalled", "1 when vLLM answers /health but its engine makes no progress (requests "
              "waiting on an unmoved token counter, or an idle 1-token completion that got no answer)").set(
            1 if s.get("stalled") else 0)
        requests = gauge("qwen27b_engine_requests", "vLLM's requests running and waiting, as the health check "
                         "read them", ["state"])
        for state_name in ("running", "waiting"):
            requests.labels(state_name).set(live[state_name])
        probe = live.get("last_probe")
        if probe and probe.get("ok") and probe.get("latency_ms") is not None:
            gauge("qwen27b_engine_idle_probe_seconds", "How long the last idle 1-token completion took").set(
                probe["latency_ms"] / 1000)

    if s.get("gpu") is not None:
        info = gauge("qwen27b_gpu_info", "A GPU the health check read through NVML (always 1)", ["gpu", "pci", "name"])
        up = gauge("qwen27b_gpu_up", "1 when NVML could read the GPU", ["gpu"])
        used = gauge("qwen27b_gpu_memory_used_bytes", "GPU memory in use", ["gpu"])
        total = gauge("qwen27b_gpu_memory_total_bytes", "GPU memory in all", ["gpu"])
        temp = gauge("qwen27b_gpu_temperature_celsius", "GPU core temperature", ["gpu"])
        ecc = gauge("qwen27b_gpu_ecc_uncorrected_errors", "Uncorrected (volatile) ECC errors since the driver "
                    "loaded", ["gpu"])
        retired = gauge("qwen27b_gpu_retired_pages", "Memory pages retired for ECC errors", ["gpu"])
        pending = gauge("qwen27b_gpu_retired_pages_pending", "1 when retired pages wait for a reboot/reset", ["gpu"])
        throttle = gauge("qwen27b_gpu_throttle_reason", "1 for each active clocks-event (throttle) reason",
                         ["gpu", "reason"])
        for g in s["gpu"]:
            i = str(g.get("index"))
            up.labels(i).set(0 if g.get("error") else 1)
            if g.get("error"):
                continue
            info.labels(i, g.get("pci") or "", g.get("name") or "").set(1)
            for metric, value in ((used, g.get("memory_used_mib")), (total, g.get("memory_total_mib"))):
                if value is not None:
                    metric.labels(i).set(value * 2**20)
            for metric, value in ((temp, g.get("temperature_c")), (ecc, g.get("ecc_uncorrected")),
                                  (retired, g.get("retired_pages")), (pending, g.get("retired_pages_pending"))):
                if value is not None:
                    metric.labels(i).set(int(value))
            if g.get("throttle") is not None:
                active = set(g["throttle"].get("reasons") or [])
                for reason in sorted(set(THROTTLE_BITS.values()) | active):
                    throttle.labels(i, reason).set(1 if reason in active else 0)

    if s.get("xids") is not None:
        gauge("qwen27b_health_xids_new", "Xid kernel lines this check found (since the previous one)").set(len(s["xids"]))
    # a counter family, not Counter(): its value comes from the status file, and Counter's
    # qwen27b_xid_created would claim the count began at this run
    xid_total = CounterMetricFamily("qwen27b_xid", "NVRM Xid kernel lines seen by the health check, by Xid",
                                    labels=["xid", "fatal"])
    for xid, n in sorted((s.get("xid_counts") or {}).items(), key=lambda kv: int(kv[0])):
        xid_total.add_metric([xid, "true" if int(xid) in XID_FATAL else "false"], n)
    reg.register(_Fixed(xid_total))

    Info("qwen27b_build", "The release venv and the model the host serves", registry=reg).info(
        {"release": release or "", "model": model_ref or "", "unit": s.get("unit") or "",
         "speculative": speculative or ""})
    return reg


def write_metrics(directory: str, registry, copy: str | None = None) -> str:
    """``<directory>/qwen27b.prom`` (a copy's: qwen27b@NAME.prom) via prometheus_client's write_to_textfile (a temp file in the
    same directory, renamed over: node_exporter never reads half a file), mode 0644 whatever the
    unit's UMask, so node_exporter's own user can read it."""
    from prometheus_client import write_to_textfile

    path = os.path.join(directory, textfile_name(copy))
    old = os.umask(0o022)
    try:
        write_to_textfile(path, registry)
    finally:
        os.umask(old)
    return path


def current_release() -> str:
    """The release this check runs from: <releases>/<name>/venv/bin/python -> <name>."""
    return os.path.basename(os.path.dirname(os.path.realpath(sys.prefix)))


def export_metrics(args: argparse.Namespace, status: dict) -> str | None:
    """Write the textfile; why not as one sentence (never raised: metrics must not break the check)."""
    if not args.textfile_dir:
        return None
    if not os.path.isdir(args.textfile_dir):
        if args.textfile_dir == TEXTFILE_DIR:
            return None  # no node_exporter on this host: nothing to say every 30 s
        return (f"no {args.textfile_dir}: node_exporter's textfile collector is not installed; metrics not "
                f"written (install prometheus-node-exporter or pass --textfile-dir)")
    try:
        systemd = status.get("systemd") or unit_properties(args.unit)
        copy = getattr(args, "copy", None)
        registry = metrics_registry(status, release=current_release(), model_ref=args.model_ref, systemd=systemd,
                                    speculative=getattr(args, "speculative", None))
        write_metrics(args.textfile_dir, labelled(registry, copy), copy)
    except ImportError:
        return "prometheus_client is not in this venv: metrics not written (redeploy to install it)"
    except OSError as e:
        return f"cannot write metrics to {args.textfile_dir} ({e.strerror})"
    return None
