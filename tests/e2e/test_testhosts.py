"""The test hosts themselves, checked for real: SSH, systemd, pyinfra over SSH (idempotent),
reboots, registries through the proxy, reset, and a teardown that leaves nothing behind.

    python3 -m pytest tests/e2e -m e2e -q -x        (as root)
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.testhosts import NspawnHosts, pid_alive

pytestmark = pytest.mark.e2e
SMOKE_GONE = ("systemctl disable --now q27t-smoke.service 2>/dev/null; "
              "rm -rf /opt/q27t-smoke /etc/systemd/system/q27t-smoke.service; systemctl daemon-reload")

E2E_DIR = Path(__file__).resolve().parent
ROOT = E2E_DIR.parents[1]
SUPPORT = ROOT / "tests" / "support"
DEPLOY = SUPPORT / "deploy_smoke.py"


def _run(argv, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], text=True, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def _pyinfra(inventory, *args, env, timeout=300):
    # cwd=tests/e2e: pyinfra also loads ./group_data and ./config.py from its cwd
    cp = _run([sys.executable, "-m", "pyinfra", "-y", inventory, *args], timeout=timeout,
              env=env, cwd=E2E_DIR)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, f"pyinfra failed (rc={cp.returncode}):\n{out[-4000:]}"
    return out


def _grand_total(output: str) -> dict[str, int]:
    """Parse pyinfra 3.10's results table: 'Grand total  HOSTS  SUCCESS  ERROR  NO_CHANGE'
    where SUCCESS counts operations that changed something; '-' means 0."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", output)
    rows = [ln for ln in clean.splitlines() if ln.strip().startswith("Grand total")]
    assert rows, f"no 'Grand total' row in pyinfra output:\n{clean[-3000:]}"
    cells = rows[-1].split()[2:]
    assert len(cells) == 4, rows[-1]
    hosts, changed, error, no_change = (0 if c == "-" else int(c) for c in cells)
    return {"ops": hosts, "changed": changed, "error": error, "no_change": no_change}


def _start_time(pid: int):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _boot_state(host):
    out = host.run("cat /proc/sys/kernel/random/boot_id /proc/uptime").stdout.split()
    return out[0], float(out[1])


def test_sshd_answers(testhost):
    with socket.create_connection((testhost.address, 22), timeout=5) as s:
        banner = s.recv(256)
    assert banner.startswith(b"SSH-2.0-OpenSSH"), banner
    cp = _run(["ssh-keyscan", "-T", "5", "-t", "ed25519", testhost.address], timeout=30)
    assert "ssh-ed25519" in cp.stdout, cp.stderr
    # strict host key checking against the known_hosts file written by `up`
    cp = _run(testhost.ssh_argv("hostname"), timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == testhost.name


def test_every_host_answers_over_ipv6_too(testhosts):
    """Each namespace also has a unique-local IPv6 address (issue 24's IPv6-only labs): sshd answers
    there with the host's own key, checked strictly against known_hosts, and the name is the host's."""
    for h in testhosts:
        assert h.address6 and h.address6.startswith("fd00:231:"), h
        with socket.create_connection((h.address6, 22), timeout=5) as s:
            assert s.recv(256).startswith(b"SSH-2.0-OpenSSH")
        cp = _run(h.lab.ssh_argv(h.address6, "hostname"), timeout=30)  # ssh_config's stanza for the address
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.strip() == h.name
        # and the host's view: the address is on its eth0, the IPv4 one unchanged beside it
        addrs = h.run("ip -o addr show dev eth0").stdout
        assert f"inet6 {h.address6}/64" in addrs and f"inet {h.address}/24" in addrs, addrs


def test_real_systemd_is_running(testhost):
    assert testhost.run("ps -o comm= -p 1").stdout.strip() == "systemd"
    cp = testhost.run("systemctl is-system-running", check=False)
    state = cp.stdout.strip()
    failed = testhost.run("systemctl list-units --failed --plain --no-legend").stdout.strip()
    assert state in ("running", "degraded"), f"state={state!r}, failed units: {failed}"
    assert state == "running", f"degraded; failed units: {failed}"


def test_testinfra_sees_the_host(testhost):
    host = testhost.testinfra("ssh")
    assert host.service("ssh").is_running
    assert host.service("ssh").is_enabled
    assert host.system_info.distribution == "debian"
    assert host.system_info.release.startswith("12")
    assert host.file("/etc/hostname").content_string.strip() == testhost.name
    assert host.check_output("id -u") == "0"
    # the paramiko backend works too (the one pyinfra itself uses)
    assert testhost.testinfra("paramiko").service("dbus").is_running


@pytest.fixture(scope="module", autouse=True)
def leave_the_lab_as_found(testhosts):
    """This module runs first on the tier's one lab (conftest LAB_ORDER): what it deploys goes again,
    so the next module's deploy meets the hosts as booted."""
    yield
    for h in testhosts:
        h.run(SMOKE_GONE, check=False)


def test_pyinfra_deploy_over_ssh_then_no_changes(testhosts, clean_env):
    for h in testhosts:  # start from nothing, whatever ran before in this session
        h.run(SMOKE_GONE)

    first = _grand_total(_pyinfra(testhosts.inventory, DEPLOY, env=clean_env))
    assert first["error"] == 0, first
    assert first["changed"] >= 4 * len(testhosts), first  # dir, file, unit, reload, service

    for h in testhosts:
        assert h.run("cat /opt/q27t-smoke/marker").stdout == "deployed by pyinfra over ssh\n"
        assert h.run("systemctl is-enabled q27t-smoke.service").stdout.strip() == "enabled"
        assert h.run("systemctl is-active q27t-smoke.service").stdout.strip() == "active"
        log = h.run("journalctl -u q27t-smoke.service --no-pager -o cat").stdout
        assert "deployed by pyinfra over ssh" in log

    t0 = time.monotonic()
    second = _grand_total(_pyinfra(testhosts.inventory, DEPLOY, env=clean_env))
    took = time.monotonic() - t0
    assert second["changed"] == 0, f"second run changed something: {second}"
    assert second["error"] == 0, second
    assert second["no_change"] >= 4 * len(testhosts), second
    print(f"pyinfra no-change run over ssh: {took:.1f}s")


def test_an_upload_survives_key_exchanges_while_the_progress_probe_polls(testhosts, tmp_path, clean_env):
    """The real CLI on a terminal pushes 96 MiB (push_files) while the progress probe runs `du` every
    50 ms, with paramiko's rekey every 4 MiB (tests/support/deploy_push_probe.py): ~24 key exchanges.
    On pyinfra's own connection, a probe channel closing during one deadlocked paramiko's reader
    (paramiko#822) and the upload died with EOFError after 30 s, in CI at the default 512 MiB too;
    on the probe's own connection (remote.side_connection) every file arrives."""
    from qwen27b.controller.artifacts import dir_manifest
    from tests.support.terminal import plain, run_on_a_terminal

    src = tmp_path / "push"
    src.mkdir()
    for i in range(3):
        (src / f"part{i}.bin").write_bytes(os.urandom(32 << 20))
    manifest = dir_manifest(src)
    for h in testhosts:
        h.run("rm -rf /tmp/q27t-push")
    env = {**clean_env, "PYTHONPATH": str(ROOT), "PUSH_SRC": str(src), "TERM": "xterm",
           "QWEN27B_REPORTS": str(tmp_path / "reports")}
    rc, transcript = run_on_a_terminal([sys.executable, "-m", "pyinfra", "-y", str(testhosts.inventory),
                                        str(SUPPORT / "deploy_push_probe.py")], env, E2E_DIR, timeout=300)
    text = plain(transcript)
    assert rc == 0, text[-3000:]
    assert re.search(r"push +\d+\.\d MiB of 96\.0 MiB", text), text[-3000:]  # the probe did draw
    for h in testhosts:
        sums = h.run("cd /tmp/q27t-push && sha256sum part*.bin").stdout.split()
        assert dict(zip(sums[1::2], sums[0::2])) == manifest
        h.run("rm -rf /tmp/q27t-push")


def test_reboot_over_ssh_gives_fresh_boot(testhosts, testhost):
    lab = testhosts.lab
    h0 = lab.host(testhost.name)
    old_boot, _ = _boot_state(testhost)
    old_nspawn = lab._nspawn_pid(h0)
    t0 = time.monotonic()
    testhost.run("systemctl reboot", check=False, timeout=30)  # the session may just drop
    # sshd may answer briefly while shutting down: wait for a new boot id
    deadline = time.monotonic() + 120
    while True:
        time.sleep(0.5)
        cp = testhost.run("cat /proc/sys/kernel/random/boot_id", check=False, timeout=15)
        if cp.returncode == 0 and cp.stdout.strip() and cp.stdout.strip() != old_boot:
            break
        assert time.monotonic() < deadline, "host did not come back from reboot in 120s"
    lab.wait_ssh(testhost.name, timeout=60)
    assert lab.wait_system(testhost.name, timeout=60) in ("running", "degraded")
    elapsed = time.monotonic() - t0
    new_boot, uptime = _boot_state(testhost)
    assert new_boot != old_boot
    assert uptime <= elapsed + 2, f"uptime {uptime}s but rebooted {elapsed:.1f}s ago"
    # same supervisor, new nspawn process
    assert pid_alive(h0["supervisor_pid"], h0["supervisor_marker"])
    assert lab._nspawn_pid(h0) not in (None, old_nspawn)
    # units enabled before the reboot come back (if the pyinfra test ran first)
    if testhost.run("test -e /etc/systemd/system/q27t-smoke.service", check=False).returncode == 0:
        assert testhost.run("systemctl is-active q27t-smoke.service").stdout.strip() == "active"


def test_pyinfra_server_reboot_detects_the_reboot(testhosts, testhost, clean_env):
    """pyinfra's server.reboot waits until uptime is lower than before: needs the per-boot
    time namespace (otherwise the container reports the machine's uptime)."""
    old_boot, _ = _boot_state(testhost)
    t0 = time.monotonic()
    _pyinfra(testhosts.inventory, "--limit", testhost.name, "server.reboot", "delay=2",
             "interval=1", "reboot_timeout=90", env=clean_env, timeout=180)
    new_boot, uptime = _boot_state(testhost)
    assert new_boot != old_boot
    assert uptime < time.monotonic() - t0 + 2
    testhosts.lab.wait_system(testhost.name, timeout=60)


def test_registries_through_the_proxy(testhost):
    # no route out of the namespace: direct egress must fail...
    cp = testhost.run("curl -sS --noproxy '*' -m 5 -o /dev/null http://deb.debian.org/debian/",
                      check=False)
    assert cp.returncode != 0, "direct egress from a test host should be impossible"
    # ...while apt and pip work through 127.0.0.1:3128 (tinyproxy on the controller)
    cp = testhost.run("apt-get update 2>&1", timeout=300)
    assert re.search(r"(Get|Hit):\d+ http://deb\.debian\.org/debian bookworm", cp.stdout), cp.stdout
    assert "Err:" not in cp.stdout, cp.stdout
    cp = testhost.run("set -e; rm -rf /tmp/pipchk /tmp/pipdl; python3 -m venv /tmp/pipchk; "
                      "/tmp/pipchk/bin/pip download -q --no-deps -d /tmp/pipdl six; "
                      "ls /tmp/pipdl; rm -rf /tmp/pipchk /tmp/pipdl", timeout=300)
    assert re.search(r"six-[\d.]+-py2\.py3-none-any\.whl", cp.stdout), cp.stdout
    # https through the proxy with the machine's CA bundle (curl gets it from /etc/environment)
    cp = testhost.run("curl -fsS -m 30 -o /dev/null -w '%{http_code}' https://pypi.org/simple/six/")
    assert cp.stdout == "200"


def test_reset_up_down_leave_nothing(testhosts):
    """A second, separate set: up, reset (fresh root, same identity), down twice; then no PID
    from its state file runs and none of its namespaces, links or roots remain."""
    lab = NspawnHosts(profile=testhosts.lab.profile + "-updown")
    try:
        (h,) = lab.up(1)
        assert h["name"] not in [x.name for x in testhosts]  # separate name and subnet
        name = h["name"]
        assert lab.ssh(name, "hostname").stdout.strip() == name
        assert len(list(lab.mux_dir.iterdir())) == 1  # the tests' commands share one connection (ssh.mux_options)
        lab.ssh(name, "touch /root/leftover")
        t0 = time.monotonic()
        lab.reset(name)
        reset_s = time.monotonic() - t0
        assert lab.ssh(name, "test -e /root/leftover", check=False).returncode == 1
        assert lab.ssh(name, "systemctl is-system-running").stdout.strip() == "running"
        print(f"reset {name}: {reset_s:.1f}s")
        pids = lab.pids()
        assert {"proxy.tinyproxy_pid", "proxy.socat_pid", f"{name}.supervisor_pid",
                f"{name}.bridge_pid", f"{name}.nspawn_pid"} <= set(pids), pids
        fixed = {k: p for k, p in pids.items() if ".container." not in k}
        assert all(pid_alive(p) for p in fixed.values()), fixed
        # container processes may come and go: identify each by (pid, start time)
        started = {k: (p, _start_time(p)) for k, p in pids.items()}
        root, state_dir = Path(h["root"]), lab.state_dir
    finally:
        lab.down()
    left = {k: p for k, (p, t0) in started.items()
            if t0 is not None and pid_alive(p) and _start_time(p) == t0}
    assert not left, f"still running after down: {left}"
    assert name not in _run(["ip", "netns", "list"]).stdout.split()
    assert _run(["ip", "link", "show", "dev", f"v{name}"]).returncode != 0
    assert not root.exists() and not state_dir.exists() and not lab.mux_dir.exists()
    lab.down()  # idempotent
    # the session's own hosts were not touched
    assert testhosts[0].run("true", check=False).returncode == 0
