"""Each SSH connection without Nagle's algorithm (controller/remote.no_delay, hooked in by config.py
through controller/runlife.watch_connections, and by load_inventory for the tools): paramiko and pyinfra set no socket option, and each
remote command waited up to 40 ms for a delayed acknowledgement (52-64 ms a command on a test host,
10-18 ms with TCP_NODELAY; the figures are in docs/deploy-bench.md, not asserted here).

The option is read back from a real TCP socket under a real paramiko Transport, and the hook runs in
a real pyinfra State as its host connects (@local: no TCP socket, so the call is recorded)."""

from __future__ import annotations

import socket
import sys
from types import SimpleNamespace

import paramiko
import pytest

from qwen27b.controller import remote
from qwen27b.controller.remote import no_delay


def _connector(transport):
    return SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))


def test_the_ssh_transports_tcp_socket_is_set_no_delay():
    listener = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(listener.getsockname())
    try:
        transport = paramiko.Transport(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # what paramiko leaves
        assert no_delay(_connector(transport)) is True
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        sock.close()
        listener.close()


def test_connections_without_a_tcp_socket_are_left_alone():
    ours, theirs = socket.socketpair()  # a ProxyCommand's pipe is no TCP socket either
    try:
        assert no_delay(_connector(paramiko.Transport(ours))) is False
    finally:
        ours.close()
        theirs.close()
    assert no_delay(SimpleNamespace()) is False  # @local, @fake
    assert no_delay(_connector(None)) is False  # not connected


@pytest.mark.parametrize("deploy_file", ["deploy.py", "rollback.py", "uninstall.py"])
def test_every_run_sets_each_host_no_delay_as_it_connects(monkeypatch, deploy_file):
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_state

    from qwen27b.controller import runlife

    seen = []
    monkeypatch.setattr(remote, "no_delay", seen.append)
    monkeypatch.setattr(runlife, "check_inventory_file", lambda: None)
    monkeypatch.setattr(runlife, "_run", {})
    monkeypatch.setattr(runlife.atexit, "register", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory.py", str(runlife.DEPLOY_FILE.parent / deploy_file)])
    state = State()
    with ctx_state.use(state):
        runlife.watch_connections()
        inventory = Inventory((["@local"], {}))
        state.init(inventory, Config())
        local = inventory.get_host("@local")
        local.connect()
    assert seen == [local.connector]


def test_the_tools_set_each_host_no_delay_as_it_connects(monkeypatch, tmp_path):
    """`qwen27b status`, doctor, the gateway's drain...: their State comes from load_inventory, and a
    command run there connects the host through pyinfra (run_command)."""
    seen = []
    monkeypatch.setattr(remote, "no_delay", seen.append)
    (tmp_path / "inventory.py").write_text('hosts = ["@local"]\n')
    state, hosts = remote.load_inventory(str(tmp_path / "inventory.py"), cwd=str(tmp_path))
    answer = remote.run_command(state, hosts[0], "true")
    assert answer.ok and seen == [hosts[0].connector]
