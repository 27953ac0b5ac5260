"""Every host unreachable: the real `pyinfra INVENTORY deploy.py -y`, its hosts on loopback ports
that are no SSH server. pyinfra stops ("No hosts remaining!") before deploy.py runs; the run must
still end with the qwen27b summary, each host `unreachable` with its SSH error in one line, exit 1,
and no paramiko traceback (a port that accepts TCP but speaks no SSH made paramiko print two).

Real parts: the CLI, paramiko, real sockets on 127.0.0.1 (one closed port, one listener that
closes each connection at once). The e2e twin with one reachable host among them is
tests/e2e/test_faults.py::test_many_hosts_one_unreachable_the_others_finish_and_limit_reruns_only_it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from tests.support.paths import ROOT



def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the socket is closed


def _hang_up_listener():
    """A TCP listener that accepts and closes at once: paramiko's "Error reading SSH protocol banner"."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_no_host_reachable_still_ends_with_the_summary_naming_each_ssh_error(tmp_path):
    listener = _hang_up_listener()
    closed = _closed_port()
    inventory = tmp_path / "lab.py"
    inventory.write_text(
        "hosts = [\n"
        f"    ('gpu-a', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {closed}, 'qwen27b_profile': 'cpu-smoke'}}),\n"
        f"    ('gpu-b', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {listener.getsockname()[1]}, "
        "'qwen27b_profile': 'cpu-smoke'}),\n"
        "]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_REPORTS=str(tmp_path / "reports"), HOME=str(tmp_path))
    try:
        result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "-y"], cwd=ROOT,
                                env=env, capture_output=True, text=True, timeout=120)
    finally:
        listener.close()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out, out
    summary = out.split("--> qwen27b run summary: ", 1)[1]
    assert summary.startswith("0 of 2 host(s) ok"), summary
    rows = {line.split()[0]: line for line in summary.splitlines() if line.startswith("gpu-")}
    assert re.match(rf"gpu-a\s+unreachable\s+Could not connect \(.*port {closed} on 127\.0\.0\.1\): check the address",
                    rows["gpu-a"]), rows
    assert re.match(r"gpu-b\s+unreachable\s+SSH error \(Error reading SSH protocol banner.*\): check the address",
                    rows["gpu-b"]), rows
    assert "--limit gpu-a --limit gpu-b" in summary
    report = next((tmp_path / "reports").glob("deploy-*.json")).read_text()
    assert '"status": "unreachable"' in report


def test_a_run_of_another_deploy_file_is_left_alone(tmp_path):
    """config.py is read by every pyinfra run in this directory: only deploy.py gets the summary."""
    inventory = tmp_path / "lab.py"
    inventory.write_text(f"hosts = [('gpu-a', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {_closed_port()}}})]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_REPORTS=str(tmp_path / "reports"), HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "exec", "--", "true"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "qwen27b run summary" not in result.stderr, result.stderr
