"""What `qwen27b reach` last found, kept on the controller for the gate (issue 30): a host that has
shown it cannot reach GitHub gets the gate's warning when uv would download Python from there.

reports/reach.json ($QWEN27B_REPORTS): {"hosts": {host: {"at": ISO time, "failed": [URL, ...]}}},
each host's entry replaced by its latest check; URLs stored without their logins.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from qwen27b.onhost.statusfile import write_text_atomic
from qwen27b.plan.urlsecret import redact_url
from qwen27b.controller.report import reports_dir


def record_path() -> Path:
    return reports_dir() / "reach.json"


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("hosts", {}) if isinstance(data, dict) and isinstance(data.get("hosts"), dict) else {}


def save(failed: dict[str, list[str]], path: Path | None = None) -> Path:
    """Each checked host's failed URLs (empty: all reached), merged into the record."""
    path = path or record_path()
    hosts = _load(path)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    hosts.update({host: {"at": at, "failed": [redact_url(u) for u in urls]} for host, urls in failed.items()})
    write_text_atomic(str(path), json.dumps({"hosts": hosts}, indent=2, sort_keys=True) + "\n")
    return path


def failed_urls(host: str, path: Path | None = None) -> list[str]:
    entry = _load(path or record_path()).get(host) or {}
    return [u for u in entry.get("failed", []) if isinstance(u, str)]
