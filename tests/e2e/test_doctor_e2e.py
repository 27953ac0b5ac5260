"""`qwen27b doctor` on a real systemd host over SSH: the CPU smoke deploy, then five real faults.

One deployment (the fixtures and helpers of test_deploy.py: the same inventory, mirror and
`pyinfra ... deploy.py -y`; after test_deploy.py on the session host it changes nothing), then
the real CLI, `python -m qwen27b.tools.cli doctor INVENTORY --json`:

    healthy                                   -> no check warns or fails, exit 0 (failed runs that
                                                 earlier tests left in the journal: one info line)
    models/current -> a missing dir           -> step 2 (inputs): model path          [recorded*]
    config.json truncated                     -> step 2 (inputs): config.json         [recorded*]
    the vllm package gone from the release venv -> step 3 (environment): vLLM build
    drop-in --max-model-len 999999            -> step 4 (parameters): running sizes fit [recorded*]
    drop-in --dtype bfloat17 (a bad flag)     -> step 4 (parameters): journal: bad flag
    restored                                  -> exit 0 again; the faults are history (info)

    * judged in the unit tier on real snapshots this test recorded (LIVE below says why)

Each fault (FAULTS, one parametrized test) is injected for real and the service restarted into
it (`systemctl restart` returns once the start fails: the unit's readiness probe sees vLLM die);
after doctor ran the unit is stopped, so its crash loop does not eat the two CPUs, and the fault
is undone. One healthy restart, at the end. The health timer is paused meanwhile (its watchdog
would restart the unit between faults); the module fixture undoes every fault and leaves the
service healthy for the modules after this one, also when a test failed.
$QWEN27B_DOCTOR_SAVE=DIR keeps each run's snapshot (to refresh tests/fixtures/journals/).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from qwen27b.tools.doctor import exec_argv
from qwen27b.controller.unitwords import systemd_quote
from tests.support.e2e_deploy import GOOD, ROOT, deploy, lab, wait_healthy  # noqa: F401 (lab: a module fixture)

pytestmark = pytest.mark.e2e
MODELS = "/var/lib/qwen27b/models"
CONFIG = f"{MODELS}/{GOOD}/config.json"
CONFIG_COPY = "/root/doctor-e2e-config.json"
DROPIN = "/etc/systemd/system/qwen27b.service.d/doctor-e2e.conf"
SITE = "$(echo /opt/qwen27b/current/venv/lib/python3*/site-packages)"
TIMES: dict[str, float] = {}
RAN: list["Fault"] = []


def doctor(lab, label: str) -> tuple[int, dict]:
    """The real CLI against the lab inventory: (exit code, the host's JSON report)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "qwen27b.tools.cli", "doctor", str(lab["inventory"]), "--json"]
    if os.environ.get("QWEN27B_DOCTOR_SAVE"):
        argv += ["--save", str(Path(os.environ["QWEN27B_DOCTOR_SAVE"]) / label)]
    started = time.monotonic()
    result = subprocess.run(argv, cwd=lab["work"], env=env, capture_output=True, text=True, timeout=300)
    TIMES[f"doctor {label}"] = time.monotonic() - started
    assert result.stdout.strip(), result.stderr[-3000:]
    report = json.loads(result.stdout)["hosts"][0]
    (lab["work"] / f"doctor-{label}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return result.returncode, report


def dropin(change: Callable[[list[str]], None]) -> Callable[[object], str]:
    """A fault: a drop-in overriding ExecStart with the running argv, changed in place by `change`."""
    def inject(host) -> str:
        argv = exec_argv(host.run("systemctl show -p ExecStart --value qwen27b.service").stdout)
        assert "--max-model-len" in argv and "--dtype" in argv, argv
        change(argv)
        unit = "[Service]\nExecStart=\nExecStart=" + " ".join(systemd_quote(a) for a in argv) + "\n"
        return f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && cat > {DROPIN} <<'EOF'\n{unit}EOF\nsystemctl daemon-reload"
    return inject


def set_flag(name: str, value: str) -> Callable[[list[str]], None]:
    def change(argv: list[str]) -> None:
        argv[argv.index(name) + 1] = value
    return change


def point_current_at(revision: str) -> str:
    return f"ln -sfn {MODELS}/{revision} {MODELS}/current.new && mv -Tf {MODELS}/current.new {MODELS}/current"


@dataclass(frozen=True)
class Fault:
    label: str
    inject: Callable[[object], str]  # host -> shell command that breaks it
    restore: str  # shell command that undoes it; harmless when the fault is not there
    step: int  # the first failing step doctor must name
    check: str  # ... and its check
    evidence: str  # a piece of that check's evidence
    cause: str | None  # the journal cause doctor reads in the failed run (symptom.cause)
    fix: str = ""  # a piece of the fix doctor gives


FAULTS = [
    Fault("missing-model-path", lambda host: point_current_at("HuggingFaceTB--SmolLM2-135M-Instruct@gone"),
          point_current_at(GOOD), 2, "model path", "@gone: missing", "model_path", fix=f"ln -sfn {MODELS}/{GOOD}"),
    Fault("corrupt-config",
          lambda host: (f"cp -a {CONFIG} {CONFIG_COPY} && "
                        f"printf '%s' '{{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ' > {CONFIG}"),
          f"if [ -e {CONFIG_COPY} ]; then cp -a {CONFIG_COPY} {CONFIG} && rm -f {CONFIG_COPY}; fi",
          2, "config.json", "is not valid JSON", "bad_config"),
    # a half-done pip uninstall / broken upgrade: the dist-info is there, the package is not
    Fault("vllm-missing", lambda host: f"d={SITE} && mv $d/vllm $d/vllm.doctor-e2e",
          f"d={SITE}; if [ -d $d/vllm.doctor-e2e ]; then mv $d/vllm.doctor-e2e $d/vllm; fi",
          3, "vLLM build", "module(s) vllm not importable", "module_missing", fix="re-run the deploy"),
    Fault("max-model-len-999999", dropin(set_flag("--max-model-len", "999999")),
          f"rm -f {DROPIN} && systemctl daemon-reload", 4, "running sizes fit", "999999", "max_len_beyond_model"),
    Fault("bad-flag", dropin(set_flag("--dtype", "bfloat17")),
          f"rm -f {DROPIN} && systemctl daemon-reload", 4, "journal: bad flag", "invalid choice: 'bfloat17'",
          "bad_flag"),
]
# Live here: the two faults no real recording covers as well (issue 31: the e2e tier keeps what only a
# live host shows). vllm-missing: step 3's probe of the release venv over SSH+sudo, recorded nowhere;
# bad-flag: the journal and a drop-in's running flags read through sudo. The other three were
# recorded from this very test on a real test host and are judged in the unit tier on those
# snapshots (tests/unit/slow/test_doctor.py on tests/fixtures/journals/real-cpu-missing-model-path,
# real-cpu-corrupt-config, real-cpu-max-model-len-999999). QWEN27B_DOCTOR_ALL_FAULTS=1 runs all five
# (with $QWEN27B_DOCTOR_SAVE, to record them again).
LIVE = {"vllm-missing", "bad-flag"}
if not os.environ.get("QWEN27B_DOCTOR_ALL_FAULTS"):
    FAULTS = [f for f in FAULTS if f.label in LIVE]


def stop(host) -> None:
    host.run("systemctl stop qwen27b.service; systemctl reset-failed qwen27b.service", check=False, timeout=60)


def start_healthy(lab) -> None:
    lab["host"].run("systemctl reset-failed qwen27b.service; systemctl start qwen27b.service", timeout=300)
    wait_healthy(lab["base"])


@contextlib.contextmanager
def injected(lab, fault: Fault):
    """The fault in place and the service restarted into it (returns once systemd reports the failed
    start); on the way out the unit is stopped and the fault undone, whatever happened inside."""
    host = lab["host"]
    host.run(fault.inject(host))
    try:
        started = time.monotonic()
        result = host.run("systemctl reset-failed qwen27b.service; systemctl restart qwen27b.service",
                          check=False, timeout=240)
        TIMES[f"restart into {fault.label}"] = time.monotonic() - started
        assert result.returncode != 0, f"the service started despite the fault {fault.label}"
        yield
    finally:
        stop(host)
        host.run(fault.restore)


@pytest.fixture(scope="module")
def deployed(lab):
    """The deployed, healthy host for the whole module; afterwards every fault undone and the service
    serving again (also after a failure: the modules after this one share the session host)."""
    host = lab["host"]
    started = time.monotonic()
    rc, out = deploy(lab)  # fresh when run alone; a no-change run after test_deploy.py
    TIMES["deploy"] = time.monotonic() - started
    assert rc == 0, out[-4000:]
    wait_healthy(lab["base"])
    # one health check run to its end (a oneshot: start returns when it is done) before the timer is
    # paused: a fresh deploy can finish before the timer's first check (status then has no verdict)
    host.run("systemctl start qwen27b-health.service; systemctl stop qwen27b-health.timer", timeout=120)
    try:
        yield lab
    finally:
        try:
            host.run(" ; ".join(f"( {f.restore} )" for f in FAULTS), check=False)
            if host.run("systemctl is-active qwen27b.service", check=False).stdout.strip() != "active":
                start_healthy(lab)
        finally:
            host.run("systemctl start qwen27b-health.timer", check=False)
            print("\n" + "\n".join(f"  {what:32} {secs:6.1f} s" for what, secs in TIMES.items()))


def test_deployed_host_is_healthy(deployed):
    rc, report = doctor(deployed, "healthy")
    bad = [c for c in report["checks"] if c["verdict"] not in ("ok", "skip", "info")]
    assert rc == 0 and report["status"] == "ok" and not bad, (report["headline"], bad)
    assert report["headline"].startswith("doctor: all ")
    verdicts = {c["check"]: c["verdict"] for c in report["checks"]}
    assert verdicts["flags vs plan"] == "ok" and verdicts["/health"] == "ok" and verdicts["vLLM build"] == "ok"
    # runs that failed before the current start (test_deploy.py's crash and rollback) are history only
    assert {c["check"] for c in report["checks"] if c["verdict"] == "info"} <= {"journal: history"}


def test_fleet_status_reads_the_real_host(deployed):
    """`qwen27b status INVENTORY --json` over pyinfra's SSH connector, on the healthy host: the
    row doctor and the deploy agree on (running unit, a health verdict, release, model)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "qwen27b.tools.cli", "status", str(deployed["inventory"]), "--json"],
                            cwd=deployed["work"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    (row,) = json.loads(result.stdout)["hosts"]
    assert row["reach"] == "ok" and (row["active"], row["sub"]) == ("active", "running"), row
    assert row["health"] in ("OK", "WARNING") and row["health_age_s"] is not None, row
    assert row["release"] != "none" and "@" in row["model"] and row["gpu_count"] == 0, row


@pytest.mark.parametrize("fault", FAULTS, ids=[f.label for f in FAULTS])
def test_injected_fault_names_its_step(deployed, fault):
    with injected(deployed, fault):
        rc, report = doctor(deployed, fault.label)
    RAN.append(fault)
    first = report["first_failure"]
    assert rc == 1 and first is not None, report["headline"]
    assert (first["step"], first["check"]) == (fault.step, fault.check), report["headline"]
    assert report["headline"].startswith(f"doctor: step {fault.step} ")
    assert fault.evidence in first["evidence"] and fault.fix in first["fix"], first
    symptom = report["symptom"]
    assert symptom["state"] == "failing" and symptom["phase"] == "load", symptom
    assert symptom["cause"] == fault.cause, symptom
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["service"]["verdict"] == "fail"
    # the steps before the named one pass: the chain names the first cause, not just any
    assert all(c["verdict"] in ("ok", "skip", "info") for c in report["checks"] if 1 < c["step"] < fault.step)
    if DROPIN in fault.restore:
        assert checks["running flags"]["verdict"] == "warn" and DROPIN in checks["running flags"]["evidence"]


def test_restored_host_is_healthy_again(deployed):
    started = time.monotonic()
    start_healthy(deployed)
    TIMES["healthy restart"] = time.monotonic() - started
    rc, report = doctor(deployed, "restored")
    bad = [c for c in report["checks"] if c["verdict"] not in ("ok", "skip", "info")]
    assert rc == 0 and report["status"] == "ok" and not bad, (report["headline"], bad)
    assert report["symptom"]["state"] == "serving"
    if RAN:  # the faults before this deliberate start: one line of history, naming the last one's step
        history = next(c for c in report["checks"] if c["check"] == "journal: history")
        assert history["verdict"] == "info" and f"-> step {RAN[-1].step} " in history["evidence"], history
