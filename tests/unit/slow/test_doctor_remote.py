"""`qwen27b doctor INVENTORY` reads hosts through pyinfra's own connectors (qwen27b.controller.remote),
every host at once, and never builds an ssh command line of its own.

Two inventories, each run by the real CLI in its own process (pyinfra's CLI module monkey-patches
gevent into whatever imports it), the nonce pinned to "recorded" by the shim, which also wraps
`remote.run_command` (what each host was asked, with its ssh_port / ssh_user data, and when) and
reports every process started (an audit hook):

- @fake hosts answering both scripts with recorded snapshots (tests/fixtures/journals/): each read
  through run_command, all at once, and diagnosed exactly as the snapshot itself is;
- a real pyinfra SSH connection (paramiko) to a loopback SSH server on an ephemeral port that
  accepts one user and password only: the inventory's ssh_port, ssh_user and ssh_password reach
  the connector; a wrong password is the host's "host reachable" failure, the others still read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from qwen27b.controller import remote
from qwen27b.plan.stack import load_stack
from qwen27b.tools.doctor import HostSnapshot, diagnose
from tests.support.paths import ROOT
from tests.support.doctor_shim import HTTP, JOURNALS, SHIM, phases

STACK = load_stack()
HTTP_STEMS = ("health@", "metrics@")  # a copy's (health@a.txt)


def expected(name: str, host: str, **data) -> dict:
    """The report of the recorded snapshot itself, as that inventory host."""
    snap = HostSnapshot.load(JOURNALS / name)
    snap.host, snap.data = host, {**snap.data, **data}
    return diagnose(snap, STACK).as_dict()


def doctor(tmp_path: Path, inventory: str, *args: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    (tmp_path / "inventory.py").write_text(inventory)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path))  # no ~/.ssh of this machine
    result = subprocess.run([sys.executable, "-c", SHIM, "inventory.py", "--json", *args], cwd=tmp_path,
                            capture_output=True, text=True, env=env, timeout=300)
    runs = [line.split()[1:] for line in result.stderr.splitlines() if line.startswith("RUN ")]
    spawned = [line for line in result.stderr.splitlines() if line.startswith("SPAWN")]
    assert not spawned, spawned  # no ssh (nor anything else) started: the connectors did it all
    return result, runs


FAKE_INVENTORY = """
import json
from pathlib import Path
def replay(name, **data):
    main, http, recorded = json.loads(Path("phases.json").read_text())[name]
    return {**recorded, **data, "fake_delay": 0.3, "fake_delay_jitter": 0,
            "fake_responses": {"@@recorded@@ BEGIN health.txt": http.splitlines(),
                               "@@recorded@@ BEGIN systemctl-show.txt": main.splitlines()}}
hosts = [
    ("@fake/healthy", replay("cpu-healthy", ssh_port=2201, ssh_user="doc1")),
    ("@fake/bad-flag", replay("real-cpu-bad-flag", ssh_port=2202, ssh_user="doc2")),
    ("@fake/corrupt", replay("cpu-corrupt-config", ssh_port=2203, ssh_user="doc3")),
    ("@fake/v100", replay("v100x4-xid79", ssh_port=2204, ssh_user="doc4")),
]
"""
FAKES = {"@fake/healthy": "cpu-healthy", "@fake/bad-flag": "real-cpu-bad-flag", "@fake/corrupt": "cpu-corrupt-config",
         "@fake/v100": "v100x4-xid79"}


def test_fake_hosts_are_read_through_run_command_all_at_once(tmp_path):
    (tmp_path / "phases.json").write_text(json.dumps({name: phases(name) for name in FAKES.values()}))
    result, runs = doctor(tmp_path, FAKE_INVENTORY)
    assert result.returncode == 1, result.stderr[-3000:]
    reports = {r["host"]: r for r in json.loads(result.stdout)["hosts"]}
    assert list(reports) == list(FAKES)  # inventory order
    for n, (host, name) in enumerate(FAKES.items(), 1):
        data = {"ssh_port": 2200 + n, "ssh_user": f"doc{n}"}
        assert reports[host] == expected(name, host, **data), host
        # each host's data reached run_command: the main script, then /health + /metrics (the unit has a --port)
        assert [r[1:4] for r in runs if r[0] == host] == [[str(2200 + n), f"doc{n}", "main"],
                                                          [str(2200 + n), f"doc{n}", "http"]]
    mains = [(float(r[4]), float(r[5])) for r in runs if r[3] == "main"]
    assert max(start for start, _ in mains) < min(end for _, end in mains)  # every host in flight at once
    assert reports["@fake/bad-flag"]["first_failure"]["check"] == "journal: bad flag"


def test_save_and_limit_through_the_connectors(tmp_path):
    (tmp_path / "phases.json").write_text(json.dumps({name: phases(name) for name in FAKES.values()}))
    result, runs = doctor(tmp_path, FAKE_INVENTORY, "--limit", "@fake/h*",
                          "--save", str(tmp_path / "snap"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert [h["host"] for h in json.loads(result.stdout)["hosts"]] == ["@fake/healthy"]
    assert {r[0] for r in runs} == {"@fake/healthy"}
    saved = HostSnapshot.load(tmp_path / "snap" / "@fake" / "healthy")
    assert saved.outputs == HostSnapshot.load(JOURNALS / "cpu-healthy").outputs
    bad, _ = doctor(tmp_path, FAKE_INVENTORY, "--limit", "nosuch")
    assert bad.returncode == 2 and "no host matches --limit nosuch" in bad.stderr


COPIES_INVENTORY = """
import json
from pathlib import Path
main, copies, http, recorded = json.loads(Path("phases.json").read_text())
hosts = [("@fake/copies", {**recorded, "ssh_port": 2210, "ssh_user": "doc", "fake_delay": 0, "fake_delay_jitter": 0,
                           "fake_responses": {"@@recorded@@ BEGIN systemctl-show.txt": main.splitlines(),
                                              "@@recorded@@ BEGIN systemctl-show@a.txt": copies.splitlines(),
                                              "@@recorded@@ BEGIN health@a.txt": http.splitlines()}})]
"""


def test_a_host_serving_copies_is_read_copy_by_copy(tmp_path):
    """The copies host (issue 26): the main script lists the enabled copies, a second reads each
    copy's unit, journal and env file, a third each copy's /health and /metrics on the port its env
    file gives; the report is the recorded snapshot's, copy by copy."""
    snap = HostSnapshot.load(JOURNALS / "v100x4-copies-b-oom")
    own = {k: v for k, v in snap.outputs.items() if "@" in k}
    http = {k: v for k, v in own.items() if k.startswith(HTTP_STEMS)}
    copies = {k: v for k, v in own.items() if k not in http}
    main = {k: v for k, v in snap.outputs.items() if k not in own and k not in HTTP}
    (tmp_path / "phases.json").write_text(json.dumps([remote.render_output(part, "recorded", snap.codes)
                                                      for part in (main, copies, http)] + [snap.data]))
    result, runs = doctor(tmp_path, COPIES_INVENTORY)
    assert result.returncode == 1, result.stderr[-3000:]
    report = json.loads(result.stdout)["hosts"][0]
    assert report == expected("v100x4-copies-b-oom", "@fake/copies", ssh_port=2210, ssh_user="doc")
    assert report["first_failure"]["copy"] == "b" and report["copies"]["a"]["status"] == "ok"
    assert len(runs) == 3  # main (copies listed), the copies' units, their /health and /metrics


# ------------------------------------------------------------------ a real SSH connection, on loopback

class _Server(paramiko.ServerInterface):
    """Accepts USER/PASSWORD only; answers doctor's two scripts with a recorded snapshot."""

    def __init__(self, answers: tuple[str, str], log: list):
        self.answers, self.log = answers, log

    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        ok = (username, password) == (USER, PASSWORD)
        self.log.append(("auth", username, ok))
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        text = command.decode()
        self.log.append(("exec", "http" if "BEGIN health.txt" in text else "main"))
        answer = self.answers[1] if "BEGIN health.txt" in text else self.answers[0]

        def reply():  # EOF, not close: a close could overtake paramiko's reply to this request
            channel.sendall(answer.encode())
            channel.send_exit_status(0)
            channel.shutdown_write()
        threading.Thread(target=reply, daemon=True).start()
        return True


USER, PASSWORD = "doctor-e2e", "s3cret pass"


@pytest.fixture
def ssh_server():
    """(port, log) of an SSH server on 127.0.0.1 for the test's duration."""
    key = paramiko.RSAKey.generate(2048)
    log: list = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    transports = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            transport.start_server(server=_Server(phases("real-cpu-bad-flag")[:2], log))
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], log
    listener.close()
    for transport in transports:
        transport.close()


def test_ssh_port_user_and_password_reach_pyinfras_ssh_connector(tmp_path, ssh_server):
    port, log = ssh_server
    common = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_user": USER, "ssh_strict_host_key_checking": "off",
              "ssh_known_hosts_file": str(tmp_path / "known_hosts"), "ssh_connect_timeout": 10}
    snap = phases("real-cpu-bad-flag")[2]
    inventory = (f"common = {common!r}\nsnap = {snap!r}\n"
                 f"hosts = [('q27t2', {{**snap, **common, 'ssh_password': {PASSWORD!r}}}),\n"
                 f"         ('wrong-password', {{**snap, **common, 'ssh_password': 'nope'}})]\n")
    result, runs = doctor(tmp_path, inventory)
    assert result.returncode == 1, result.stderr[-3000:]
    reports = {r["host"]: r for r in json.loads(result.stdout)["hosts"]}
    assert reports["q27t2"] == expected("real-cpu-bad-flag", "q27t2", **common, ssh_password=PASSWORD)
    assert ("auth", USER, True) in log and ("exec", "main") in log and ("exec", "http") in log
    assert ("auth", USER, False) in log  # the other host offered its own (wrong) password
    down = reports["wrong-password"]["first_failure"]
    assert down["check"] == "host reachable" and "uthentication" in down["evidence"], down
    assert [r[1:4] for r in runs if r[0] == "q27t2"] == [[str(port), USER, "main"], [str(port), USER, "http"]]
