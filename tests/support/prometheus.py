"""A real Prometheus (Debian's ``prometheus`` binary) and node_exporter for tests, on loopback.

:class:`Prometheus` runs the server with a generated config (scrape and rule evaluation every
second by default), its own storage dir, and a copy of ``monitoring/qwen27b-alerts.yml`` whose
``for:`` holds are shortened (the file is parsed as YAML and each rule's ``for`` key replaced,
not rewritten by regex: the copy is the shipped rules with only that key changed); it is
stopped by PID. Its HTTP API (``/api/v1/query``, ``/api/v1/alerts``, ``/api/v1/rules``) is read
with httpx, and :meth:`Prometheus.wait_until` polls with a timeout whose failure message carries
the last value seen, the targets' scrape errors and the server's log tail.

:func:`node_exporter` runs ``prometheus-node-exporter`` with only the textfile collector (fast,
and the only one whose output the tests read). Both are used by the unit tier
(tests/servers/test_prometheus_pipeline.py, tests/unit/slow/test_health_metrics.py) and the e2e tier
(tests/e2e/test_prometheus_e2e.py); a missing binary is :func:`setupcheck.skip_or_fail_setup`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import yaml

from qwen27b.tools.cpu_smoke import free_port, stop_server

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "qwen27b-alerts.yml"


def binary(*names: str) -> str:
    """The first of ``names`` on PATH; skip (fail under ./run tests, which installs them) if none."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    from setupcheck import skip_or_fail_setup
    skip_or_fail_setup(f"no {' or '.join(names)} on this machine: `apt-get install prometheus "
                       "prometheus-node-exporter` (./run tests' setup installs both, services off)")
    raise AssertionError("unreachable")  # skip_or_fail_setup raises


def shortened_rules(hold: str = "2s", source: Path = RULES) -> dict:
    """The shipped rule file as a YAML document, every rule's ``for:`` set to ``hold`` (rules
    without one keep firing on the first true evaluation, as shipped). Parsed, not regex-edited:
    expressions, labels and annotations are the file's own."""
    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = hold
    return doc


def _wait_answering(url: str, proc: subprocess.Popen, log: Path | None, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise AssertionError(f"{what} exited with {proc.returncode} before answering:\n{tail}")
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not answer {url} within {timeout:.0f} s")
        time.sleep(0.1)


@contextlib.contextmanager
def node_exporter(textfile_dir: Path | str, log: Path | None = None, timeout: float = 20) -> Iterator[str]:
    """``prometheus-node-exporter`` on 127.0.0.1:<free port>, textfile collector only, reading
    ``textfile_dir``; yields its ``host:port``; stopped by PID."""
    exe = binary("prometheus-node-exporter", "node_exporter")
    address = f"127.0.0.1:{free_port()}"
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen([exe, f"--web.listen-address={address}", "--collector.disable-defaults",
                             "--collector.textfile", f"--collector.textfile.directory={textfile_dir}"],
                            stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_answering(f"http://{address}/metrics", proc, log, "node_exporter", timeout)
        yield address
    finally:
        stop_server(proc, grace=10)
        if log:
            out.close()


class Prometheus:
    """One Prometheus server for a test: ``jobs`` is {job name: [host:port, ...]} (or full
    scrape_config dicts), the rules :func:`shortened_rules` (``hold``). Use as a context manager."""

    def __init__(self, workdir: Path, jobs: dict[str, list[str] | dict], hold: str = "2s",
                 interval: str = "1s", listen: str = "127.0.0.1"):
        self.workdir = Path(workdir)
        self.jobs, self.hold, self.interval, self.listen = jobs, hold, interval, listen
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log = self.workdir / "prometheus.log"

    def config(self) -> dict:
        scrape = []
        for job, spec in self.jobs.items():
            scrape.append({"job_name": job, **spec} if isinstance(spec, dict)
                          else {"job_name": job, "static_configs": [{"targets": list(spec)}]})
        return {"global": {"scrape_interval": self.interval, "scrape_timeout": self.interval,
                           "evaluation_interval": self.interval},
                "rule_files": ["qwen27b-alerts.yml"], "scrape_configs": scrape}

    def start(self, timeout: float = 60) -> "Prometheus":
        exe = binary("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "qwen27b-alerts.yml").write_text(yaml.safe_dump(shortened_rules(self.hold), sort_keys=False))
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        address = f"{self.listen}:{free_port(self.listen)}"
        self.url = f"http://{address}"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                                          f"--web.listen-address={address}"],
                                         stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        _wait_answering(f"{self.url}/-/ready", self.proc, self.log, "prometheus", timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc, grace=15)
            self.proc = None

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------------------- the HTTP API

    def api(self, path: str, **params) -> Any:
        """GET /api/v1/<path> -> its ``data`` (an error status raises, with Prometheus's message)."""
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10, trust_env=False)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector: [{"metric": {labels}, "value": [t, "v"]}, ...]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def value(self, expr: str) -> float | None:
        """The one value of an instant query; None when it has none or several."""
        values = self.values(expr)
        return values[0] if len(values) == 1 else None

    def alerts(self) -> list[dict]:
        """Active alerts (pending or firing), as /api/v1/alerts lists them."""
        return self.api("alerts")["alerts"]

    def alert_states(self, prefix: str = "Qwen27b") -> dict[str, str]:
        """{alertname: state} of the active alerts whose name starts with ``prefix``."""
        return {a["labels"]["alertname"]: a["state"] for a in self.alerts()
                if a["labels"]["alertname"].startswith(prefix)}

    def rules(self) -> list[dict]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]

    def evaluated_rules(self) -> list[dict] | None:
        """The rules once every one has been evaluated (Go's zero time, year 0001, until then)."""
        rules = self.rules()
        return rules if rules and not any(r.get("lastEvaluation", "0001").startswith("0001") for r in rules) else None

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def diagnosis(self) -> str:
        """Targets' health and last scrape error, and the log's tail: what a timeout message needs."""
        lines = []
        with contextlib.suppress(Exception):
            lines += [f"target {t['scrapeUrl']}: {t['health']} {t.get('lastError') or ''}" for t in self.targets()]
        if self.log.exists():
            lines.append(self.log.read_text(errors="replace")[-2000:])
        return "\n".join(lines)

    def wait_until(self, probe: Callable[[], Any], what: str, timeout: float = 30, every: float = 0.25) -> Any:
        """Call ``probe`` until it returns something truthy (returned); AssertionError after
        ``timeout`` seconds naming ``what``, the last value and :meth:`diagnosis`."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = probe()
            except (httpx.HTTPError, AssertionError) as e:
                last = e
            else:
                if last:
                    return last
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f} s; last: {last!r}\n{self.diagnosis()}")
            time.sleep(every)
