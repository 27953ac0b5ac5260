"""The e2e tier's shared steps on a lab of test hosts (tests/e2e/conftest.py): an inventory for the
CPU smoke profile (`make_lab`, the module fixture `lab`), the README's real deploy command (`deploy`),
and what the modules read back from a host (its release record, report, unit properties, health).
Moved out of tests/e2e/test_deploy.py (issue 50): no test module imports another."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.paths import ROOT
from tests.support.revisions import GOOD, GOOD_B, REV_B  # noqa: F401 (the mirror's two revisions, for the modules)
from tests.support.terminal import plain, run_on_a_terminal
from tests.support.testhosts.ssh import ADMIN_USER

API_KEY = "q27-e2e-" + os.urandom(8).hex()
PORT = 8000
SUDO = {"ssh_user": ADMIN_USER, "_sudo": True}  # README's "Using it on your lab": a sudo user, not root
# the kept release a deploy set aside (roles/service.py) until the new one verified or was rolled back
ROLLBACK_PREV = "/etc/qwen27b/rollback.prev"


# The figures verify measures when a deploy replaces the release (roles/verify.judge_release), on one
# run of 16 tokens per prompt rather than the CPU profile's 3 x 32: ~3 CPU-s a deploy instead of ~9 on
# the shared 2 cores (issue 31). The measuring and the comparison still run on every such deploy; the
# lifecycle module, whose tests judge regressions and the noise figures, keeps the stack's limits.
QUICK_FIGURES = {"serve": {"regression": {"max_tokens": 16, "repeats": 1}}}


def make_lab(testhost, hosts_inventory, mirror, work, data: dict | None = None, sudo: bool = True,
             names: list[str] | None = None, figures: dict | None = QUICK_FIGURES) -> dict:
    """An inventory of the test hosts `names` (default: `testhost` alone, `lab["host"]`) out of
    `hosts_inventory` (the session lab's): the CPU smoke profile, the mirror, an API key file (0600),
    plus `data` for every host. `sudo`: deployed the way README tells labs to, as the non-root `admin`
    with `_sudo = True` (issue 32); else as root. `figures`: stack overrides every run of it merges
    under a test's own `qwen27b_stack_overrides` (QUICK_FIGURES; None: the stack's)."""
    key_file = work / "api.key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o600)
    host_data = {"qwen27b_profile": "cpu-smoke", "qwen27b_model_source": "mirror",
                 "qwen27b_model_mirror": f"http://127.0.0.1:{mirror.server_address[1]}",
                 "qwen27b_http_proxy": "http://127.0.0.1:3128", "qwen27b_api_key_file": str(key_file),
                 "qwen27b_port": PORT, **(SUDO if sudo else {}), **(data or {})}
    inventory = work / "lab.py"
    # QWEN27B_E2E_EXTRA lets a test add host data for one run (an upgrade, say)
    inventory.write_text(
        "import json, os, runpy\n"
        f"_hosts = runpy.run_path({str(hosts_inventory)!r})['testhosts']\n"
        f"DATA = {host_data!r}\n"
        "EXTRA = json.loads(os.environ.get('QWEN27B_E2E_EXTRA', '{}'))\n"
        f"FIGURES = {figures or {}!r}\n"
        "if FIGURES:  # under the test's own overrides, which win\n"
        "    over = EXTRA.get('qwen27b_stack_overrides') or {}\n"
        "    EXTRA['qwen27b_stack_overrides'] = {**FIGURES, **over, 'serve': {**FIGURES['serve'], **over.get('serve', {})}}\n"
        f"NAMES = {list(names or [testhost.name])!r}\n"
        "lab = [(name, {**{k: v for k, v in data.items() if k != 'testhost_root'}, **DATA, **EXTRA})\n"
        "       for name, data in _hosts if name in NAMES]\n")
    return {"inventory": inventory, "work": work, "host": testhost, "base": f"http://{testhost.address}:{PORT}",
            "logs": []}


@pytest.fixture(scope="module")
def lab(testhost, mirror, tmp_path_factory):
    """An inventory for the test host: the CPU smoke profile, the mirror, an API key file (0600)."""
    return make_lab(testhost, testhost.lab.inventory, mirror, tmp_path_factory.mktemp("lab"))


def deploy(lab, extra: dict | None = None, background: bool = False, argv: list[str] | None = None,
           tty: bool = False, module: str = "pyinfra"):
    """The README's real command: `pyinfra <inventory> deploy.py -y` (or `pyinfra ARGV...`, or
    `python -m MODULE ARGV...`: the qwen27b CLI), with a clean environment; (exit code, output), or
    the Popen when in the background. `tty`: on a pseudo-terminal, as a person runs it (the output
    is then the transcript as text; the log keeps it as the terminal received it)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_REPORTS=str(lab["work"] / "reports"), PYTHONUNBUFFERED="1",
               QWEN27B_E2E_EXTRA=json.dumps(extra or {}))
    log = lab["work"] / f"deploy-{len(lab['logs'])}.log"
    lab["logs"].append(log)
    argv = [sys.executable, "-m", module, *(argv or [str(lab["inventory"]), "deploy.py", "-y"])]
    if tty:
        rc, transcript = run_on_a_terminal(argv, {**env, "TERM": "xterm"}, ROOT, log=log)
        return rc, plain(transcript)
    if background:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    result = subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, timeout=1500)
    return result.returncode, log.read_text()


def serving_record(lab, times: dict, label: str = "fresh deploy (module alone)") -> dict:
    """The release record of a lab host left serving by the module before; a module run alone
    deploys it fresh first (timed in `times` under `label`)."""
    host = lab["host"]
    if host.run("systemctl is-active qwen27b.service", check=False).stdout.strip() != "active":
        t0 = time.monotonic()
        rc, out = deploy(lab)
        assert rc == 0, out[-4000:]
        times[label] = time.monotonic() - t0
    return json.loads(host.run("cat /etc/qwen27b/release.json").stdout)


def latest_report(lab) -> dict:
    return json.loads((lab["work"] / "reports" / "latest.json").read_text())["hosts"][0]


def show(lab, prop: str, unit: str = "qwen27b.service") -> str:
    return lab["host"].run(f"systemctl show -p {prop} --value {unit}").stdout.strip()


def wait_healthy(base: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise AssertionError(f"{base}/health not 200 within {timeout} s")


def health_run(lab) -> dict:
    """One run of the health check exactly as its timer runs it; returns the status file.

    Exit 219/CGROUP: systemd in the nspawn test host could not attach the run to its unit's cgroup,
    which the run before had just left (the test hosts' cgroup v1; seen on loaded machines, also in
    docs/scale-out.md). The check never ran and the status file is the previous run's: run it again."""
    for _ in range(3):
        lab["host"].run("systemctl start qwen27b-health.service", check=False, timeout=120)
        if show(lab, "ExecMainStatus", "qwen27b-health.service") != "219":
            break
        time.sleep(1)
    return json.loads(lab["host"].run("cat /var/lib/qwen27b/health.json").stdout)


@contextlib.contextmanager
def timer_paused(lab):
    """Our health runs only: the 30 s timer's own runs would interleave with the counted ones."""
    lab["host"].run("systemctl stop qwen27b-health.timer")
    try:
        yield
    finally:
        lab["host"].run("systemctl start qwen27b-health.timer", check=False)


def assert_key_guards_v1_and_never_leaks(lab) -> None:
    """/v1 answers 401 without the API key and 200 with it; the key is in none of the places a host or
    a run could leak it: the unit, systemctl show, the env file, the journal, the health status, every
    deploy output and report of the lab so far."""
    base = lab["base"]
    assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).status_code == 200
    host = lab["host"]
    places = {
        "unit file": host.run("cat /etc/systemd/system/qwen27b.service").stdout,
        "systemctl show": host.run("systemctl show qwen27b.service").stdout,
        "env file": host.run("cat /etc/qwen27b/qwen27b.env").stdout,
        "journal": host.run("journalctl --no-pager -u qwen27b -u qwen27b-health", timeout=60).stdout,
        "health status": host.run("cat /var/lib/qwen27b/health.json").stdout,
        "deploy output": "".join(log.read_text() for log in lab["logs"]),
        "reports": "".join(p.read_text() for p in (lab["work"] / "reports").glob("*.json")),
    }
    assert all(len(text) > 0 for text in places.values())
    leaked = [where for where, text in places.items() if API_KEY in text]
    assert leaked == []


def assert_key_not_in_runs(fleet) -> None:
    """Every deploy log and report of a lab's runs (`fleet["logs"]`, its reports dir): the key never."""
    texts = [log.read_text() for log in fleet["logs"]] + [p.read_text() for p in (fleet["work"] / "reports").glob("*.json")]
    assert texts and not [t for t in texts if API_KEY in t]


# The progress lines a person sees on a terminal (qwen27b/controller/progress.py), one per host
PROGRESS = {
    "wheels": r"wheels +[\d.]+ (?:KiB|MiB|GiB) of [\d.]+ (?:MiB|GiB) \(\d+%\)",
    "install": r"install +[\d.]+ (?:MiB|GiB) of \d\.\d GiB \(\d+%\), [\d.]+ (?:KiB|MiB|GiB)/s, "
               r"(?:ETA \d+(?:s|m\d\ds)|compiling bytecode)",
    "weights": r"weights +[\d.]+ (?:B|KiB|MiB) of 2\d\d\.\d MiB \(\d+%\), [\d.]+ (?:KiB|MiB)/s, ETA \d+s",
    "load": r"load +loading weights: shards (?:\d+|-)/(?:\d+|-)(?: \(warming up\))?, \d+ s \(unit \w+/[\w-]+\)",
}
