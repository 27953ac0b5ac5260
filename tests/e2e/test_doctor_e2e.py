"""`qwen27b doctor` on a real systemd host over SSH: the CPU smoke deploy, then real faults.

One deployment (the fixtures and helpers of test_deploy.py: the same inventory, mirror and
`pyinfra ... deploy.py -y`), then the real CLI, `python -m qwen27b.cli doctor INVENTORY --json`:

    healthy                          -> every check ok, exit 0
    models/current -> a missing dir  -> step 2 (inputs) fails first: model path
    config.json truncated            -> step 2 (inputs) fails first: config.json
    drop-in --max-model-len 999999   -> step 4 (parameters) fails first
    restored                         -> exit 0 again (the earlier failures show as warnings)

Each fault is injected for real and the service restarted into it (`systemctl restart` returns
once the start fails: the unit's readiness probe sees vLLM die); after doctor ran the unit is
stopped so its crash loop does not eat the two CPUs, and the fault is undone. Only one healthy
restart, at the end. $QWEN27B_DOCTOR_SAVE=DIR keeps each run's snapshot (to refresh the
fixtures in tests/fixtures/journals/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen27b.doctor import exec_argv
from qwen27b.render import systemd_quote
from test_deploy import GOOD, ROOT, artifacts, deploy, lab, mirror, wait_healthy  # noqa: F401 (fixtures)

pytestmark = pytest.mark.e2e
MODELS = "/var/lib/qwen27b/models"
DROPIN = "/etc/systemd/system/qwen27b.service.d/doctor-e2e.conf"
TIMES: dict[str, float] = {}


def doctor(lab, label: str) -> tuple[int, dict]:
    """The real CLI against the lab inventory: (exit code, the host's JSON report)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "qwen27b.cli", "doctor", str(lab["inventory"]), "--json"]
    if os.environ.get("QWEN27B_DOCTOR_SAVE"):
        argv += ["--save", str(Path(os.environ["QWEN27B_DOCTOR_SAVE"]) / label)]
    started = time.monotonic()
    result = subprocess.run(argv, cwd=lab["work"], env=env, capture_output=True, text=True, timeout=300)
    TIMES[f"doctor {label}"] = time.monotonic() - started
    assert result.stdout.strip(), result.stderr[-3000:]
    report = json.loads(result.stdout)["hosts"][0]
    (lab["work"] / f"doctor-{label}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return result.returncode, report


def restart_into_fault(lab) -> None:
    """Restart the service into the injected fault; returns once systemd reports the failed start."""
    host = lab["host"]
    started = time.monotonic()
    result = host.run("systemctl reset-failed qwen27b.service; systemctl restart qwen27b.service", check=False,
                      timeout=240)
    assert result.returncode != 0, "the service started despite the fault"
    TIMES.setdefault("failing restarts", 0.0)
    TIMES["failing restarts"] += time.monotonic() - started


def stop(lab) -> None:
    lab["host"].run("systemctl stop qwen27b.service; systemctl reset-failed qwen27b.service", check=False, timeout=60)


def assert_first(report: dict, step: int, check: str) -> None:
    first = report["first_failure"]
    assert first is not None, report["headline"]
    assert (first["step"], first["check"]) == (step, check), report["headline"]
    assert report["headline"].startswith(f"doctor: step {step} ")
    assert report["symptom"]["state"] == "failing" and report["symptom"]["phase"] == "load", report["symptom"]


def test_deployed_host_is_healthy(lab):
    started = time.monotonic()
    rc, out = deploy(lab)
    TIMES["deploy"] = time.monotonic() - started
    assert rc == 0, out[-4000:]
    wait_healthy(lab["base"])
    rc, report = doctor(lab, "healthy")
    bad = [c for c in report["checks"] if c["verdict"] not in ("ok", "skip")]
    assert rc == 0 and report["status"] == "ok" and not bad, (report["headline"], bad)
    assert report["headline"].startswith("doctor: all ")
    verdicts = {c["check"]: c["verdict"] for c in report["checks"]}
    assert verdicts["flags vs plan"] == "ok" and verdicts["/health"] == "ok" and verdicts["vLLM build"] == "ok"


def test_broken_model_path_is_step_2(lab):
    host = lab["host"]
    host.run(f"ln -sfn {MODELS}/HuggingFaceTB--SmolLM2-135M-Instruct@gone {MODELS}/current.new && "
             f"mv -Tf {MODELS}/current.new {MODELS}/current")
    try:
        restart_into_fault(lab)
        rc, report = doctor(lab, "missing-model-path")
    finally:
        stop(lab)
        host.run(f"ln -sfn {MODELS}/{GOOD} {MODELS}/current.new && mv -Tf {MODELS}/current.new {MODELS}/current")
    assert rc == 1
    assert_first(report, 2, "model path")
    assert "@gone: missing" in report["first_failure"]["evidence"]
    assert f"ln -sfn {MODELS}/{GOOD}" in report["first_failure"]["fix"]


def test_corrupt_config_json_is_step_2(lab):
    host = lab["host"]
    config = f"{MODELS}/{GOOD}/config.json"
    host.run(f"cp -a {config} /root/doctor-e2e-config.json && "
             f"printf '%s' '{{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ' > {config}")
    try:
        restart_into_fault(lab)
        rc, report = doctor(lab, "corrupt-config")
    finally:
        stop(lab)
        host.run(f"cp -a /root/doctor-e2e-config.json {config} && rm -f /root/doctor-e2e-config.json")
    assert rc == 1
    assert_first(report, 2, "config.json")
    assert "is not valid JSON" in report["first_failure"]["evidence"]
    assert report["symptom"]["cause"] == "bad_config"  # the journal says so too


def test_bad_flag_drop_in_is_step_4_then_restored(lab):
    host = lab["host"]
    argv = exec_argv(host.run("systemctl show -p ExecStart --value qwen27b.service").stdout)
    assert "--max-model-len" in argv
    argv[argv.index("--max-model-len") + 1] = "999999"
    unit = "[Service]\nExecStart=\nExecStart=" + " ".join(systemd_quote(a) for a in argv) + "\n"
    host.run(f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && cat > {DROPIN} <<'EOF'\n{unit}EOF\nsystemctl daemon-reload")
    try:
        restart_into_fault(lab)
        rc, report = doctor(lab, "max-model-len-999999")
    finally:
        stop(lab)
        host.run(f"rm -f {DROPIN} && systemctl daemon-reload")
    assert rc == 1
    assert_first(report, 4, "running sizes fit")
    assert "999999" in report["first_failure"]["evidence"]
    verdicts = {c["check"]: c for c in report["checks"]}
    assert verdicts["running flags"]["verdict"] == "warn" and DROPIN in verdicts["running flags"]["evidence"]
    assert all(c["verdict"] in ("ok", "skip") for c in report["checks"] if c["step"] in (2, 3))

    # restored: one healthy start, doctor passes again; the failures above are history (warnings)
    started = time.monotonic()
    host.run("systemctl reset-failed qwen27b.service; systemctl start qwen27b.service", timeout=300)
    wait_healthy(lab["base"])
    TIMES["healthy restart"] = time.monotonic() - started
    rc, report = doctor(lab, "restored")
    assert rc == 0 and report["first_failure"] is None, report["headline"]
    assert report["symptom"]["state"] == "serving"
    print("\n" + "\n".join(f"  {what:28} {secs:6.1f} s" for what, secs in TIMES.items()))
