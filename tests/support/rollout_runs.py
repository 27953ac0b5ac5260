"""A stand-in for a rollout batch's pyinfra run (tests/servers/test_regression.py,
tests/unit/test_loadpair.py): writes the run report verify would, with each host's comparison."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def deploys(reports: Path, comparisons: dict[str, dict], statuses: dict[str, str] | None = None):
    """Stands in for the batch's pyinfra run: writes the run report verify would, with its comparison."""
    argvs = []

    def run(argv):
        argvs.append(argv)
        hosts = [argv[i + 1] for i, a in enumerate(argv) if a == "--limit"]
        reports.mkdir(exist_ok=True)
        name = f"{len(argvs):04d}"
        summary = [{"host": h, "status": (statuses or {}).get(h, "ok"), "detail": ""} for h in hosts]
        (reports / f"deploy-{name}.json").write_text(json.dumps({"run": name, "summary": summary, "hosts": [
            {"host": h, "status": (statuses or {}).get(h, "ok"), "ttft_s": 0.2,
             **({"comparison": comparisons[h]} if h in comparisons else {})} for h in hosts]}))
        return subprocess.CompletedProcess(argv, 0)
    run.argvs = argvs
    return run
