"""Something else already serves on the port or holds the GPUs (issue 24): the Occupants parser on
real `ss -Hltnp` lines, the gate's refusal on the recorded host and its neighbours."""

from __future__ import annotations

import subprocess

import pytest

from qwen27b.controller import facts as F
from qwen27b.plan.gate import RefusedHost, bound_ports, decide
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.occupants import occupied, parse_occupants
from qwen27b.plan.planner import Gpu
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

GPUS = [Gpu(0, "Tesla V100-PCIE-32GB", 32510, "7.0"), Gpu(1, "Tesla V100-PCIE-32GB", 32510, "7.0")]
BUS = {0: "00000000:3B:00.0", 1: "00000000:5E:00.0"}


def occ(*listen, gpu=(), units=None, sockets=None):
    return parse_occupants(["== listen", *listen, "== gpu", *gpu, "== units", *(units or [])]
                           + (["== sockets", *sockets] if sockets is not None else []))


def test_the_fact_command_runs_here_and_its_output_parses():
    """The real command on this controller: its ss lines (whatever listens here) parse."""
    result = subprocess.run(["bash", "-c", F.Occupants().command()], capture_output=True, text=True, timeout=60)
    found = parse_occupants(result.stdout.splitlines())
    assert found is not None and set(found) == {"listen", "gpu", "units", "sockets"}


def test_recorded_old_vllm_container_is_refused_naming_port_gpus_and_container():
    with pytest.raises(RefusedHost) as refused:
        decide("v100x2-old-vllm", recorded_facts("v100x2-old-vllm"), load_stack(), Settings())
    text = str(refused.value)
    assert "port 8000 is already served by docker-proxy (pid 2345, docker.service) on 0.0.0.0:8000" in text
    assert "[::]:8000" in text and "GPU 0: /usr/bin/python3 (pid 3871" in text and "holds 29870 MiB" in text
    assert "sudo docker stop 8f2c41d9a7b3" in text and "qwen27b_port" in text and "qwen27b_gpu_indices" in text


def test_neighbours():
    base = recorded_facts("v100x2-old-vllm").occupants
    # the same host on another port, the container's GPUs left out: nothing in the way
    assert occupied(base, 8001, "127.0.0.1", GPUS, BUS)[0][0].startswith("other processes hold the GPUs")
    assert occupied(base, 8001, "127.0.0.1", [], BUS) == []
    # qwen27b's own service on the port and the GPUs (a converged host re-deployed) is no occupant
    ours = occ('LISTEN 0 4096 10.0.0.7:8000 0.0.0.0:* users:(("python3",pid=900,fd=20))',
               gpu=["901, VLLM::Worker_TP0, 28000, 00000000:3B:00.0"],
               units=["900 qwen27b.service python3", "901 qwen27b.service VLLM::Worker_TP0"])
    assert occupied(ours, 8000, "10.0.0.7", GPUS, BUS) == []
    # an Ollama service on its own port holding GPU 1 only: GPU 1 named, the unit to disable
    ollama = occ('LISTEN 0 4096 127.0.0.1:11434 0.0.0.0:* users:(("ollama",pid=700,fd=3))',
                 gpu=["700, /usr/local/bin/ollama, 17852, 00000000:5E:00.0"], units=["700 ollama.service ollama"])
    (cause, fix), = occupied(ollama, 8000, "127.0.0.1", GPUS, BUS)
    assert "GPU 1: /usr/local/bin/ollama (pid 700, ollama.service) holds 17852 MiB" in cause
    assert "sudo systemctl disable --now ollama.service" in fix
    # another address on the same port does not clash; a wildcard one does
    other = occ('LISTEN 0 4096 127.0.0.1:8000 0.0.0.0:* users:(("python3",pid=5,fd=3))', units=["5 - python3"])
    assert occupied(other, 8000, "10.0.0.7", GPUS, BUS) == []
    assert occupied(other, 8000, "0.0.0.0", GPUS, BUS)[0][0].startswith("port 8000 is already served by python3 (pid 5)")
    # ss without root shows no owner: still refused, saying so
    anon = occ("LISTEN 0 4096 *:8000 *:*")
    assert "ss shows no owner" in occupied(anon, 8000, "10.0.0.7", GPUS, BUS)[0][0]
    # no driver: nvidia-smi's failure line is no GPU process; not read at all: nothing to say
    assert occ(gpu=["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."])["gpu"] == []
    assert occupied(None, 8000, "0.0.0.0", GPUS, BUS) == []


# systemctl list-sockets --no-legend --full as systemd 252 printed it on a deployed e2e test host (the
# socket activated per connection shows no unit it activates; the netlink line is the udev socket's
# shape); paths and netlink sockets bind no port
SOCKETS = ["/run/dbus/system_bus_socket  dbus.socket                     dbus.service",
           "kobject-uevent 1             systemd-udevd-kernel.socket     systemd-udevd.service",
           "10.0.0.7:9120                qwen27b-health-http.socket      -"]
HEALTH_OURS = 'LISTEN 0 4096 10.0.0.7:9120 0.0.0.0:* users:(("systemd",pid=1,fd=51))'


def test_the_other_ports_the_deploy_binds():
    """The health endpoint's port (a socket unit: systemd's listener, named by list-sockets),
    node_exporter's and the fan-out seed's, each with the units that are its own there."""
    assert parse_occupants(["== listen", "== sockets", *SOCKETS])["sockets"] == {9120: ["qwen27b-health-http.socket"]}
    plain = bound_ports(Settings(), "10.0.0.7")
    assert [(b.port, b.address) for b in plain] == [(9120, "10.0.0.7")]
    every = bound_ports(Settings(node_exporter=True, weights_fanout="tree"), "fd00::7")
    assert [(b.port, b.address) for b in every] == [(9120, "fd00::7"), (9100, "0.0.0.0"), (8801, "fd00::7")]
    # qwen27b's own health socket, re-deployed on another address (IPv4 to IPv6): no occupant
    assert occupied(occ(HEALTH_OURS, sockets=SOCKETS), 8000, "fd00::7", [], BUS, every) == []
    assert occupied(occ(HEALTH_OURS, sockets=SOCKETS), 8000, "10.0.0.7", [], BUS, every) == []
    # another socket unit on the port (cockpit moved to 9120): named, with the unit to disable
    cockpit = occ('LISTEN 0 4096 *:9120 *:* users:(("systemd",pid=1,fd=60))',
                  sockets=["[::]:9120 cockpit.socket cockpit.service"])
    (cause, fix), = occupied(cockpit, 8000, "10.0.0.7", [], BUS, plain)
    assert cause == ("port 9120 is already served by systemd's cockpit.socket (pid 1) on *:9120: the health endpoint "
                     "(qwen27b-health-http.socket) could not bind it")
    assert fix == ("stop it first (`sudo systemctl disable --now cockpit.socket`), or move the endpoint with "
                   "qwen27b_health_port")
    # PID 1's child forked for a socket-activated connection, before its exec: still our socket
    forked = occ('LISTEN 0 4096 10.0.0.7:9120 0.0.0.0:* users:(("systemd",pid=1,fd=60),("systemd",pid=6019,fd=60))',
                 sockets=SOCKETS)
    assert occupied(forked, 8000, "10.0.0.7", [], BUS, plain) == []
    # a recording without list-sockets: systemd's listener cannot be told, so it is not refused
    assert occupied(occ('LISTEN 0 4096 *:9120 *:* users:(("systemd",pid=1,fd=60))'), 8000, "10.0.0.7", [], BUS, plain) == []
    # node_exporter: Debian's service is the deploy's own; a container's exporter is not, on any address
    debian = occ('LISTEN 0 4096 *:9100 *:* users:(("prometheus-node",pid=640,fd=3))',
                 units=["640 prometheus-node-exporter.service prometheus-node"])
    assert occupied(debian, 8000, "10.0.0.7", [], BUS, every) == []
    container = occ('LISTEN 0 4096 127.0.0.1:9100 0.0.0.0:* users:(("node_exporter",pid=810,fd=3))',
                    units=["810 docker-" + "ab" * 32 + ".scope node_exporter"])
    (cause, fix), = occupied(container, 8000, "10.0.0.7", [], BUS, every)
    assert cause.startswith("port 9100 is already served by node_exporter (pid 810, docker-abab") and \
        cause.endswith("on 127.0.0.1:9100: node_exporter (prometheus-node-exporter.service) could not bind it")
    assert "sudo docker stop abababababab" in fix and fix.endswith("or leave qwen27b_node_exporter out")
    assert occupied(container, 8000, "10.0.0.7", [], BUS, plain) == []  # no node_exporter planned: no clash
    # the seed's port: a stray HTTP server there, only when the fan-out is on
    stray = occ('LISTEN 0 5 0.0.0.0:8801 0.0.0.0:* users:(("python3",pid=77,fd=3))', units=["77 session-3.scope python3"])
    (cause, fix), = occupied(stray, 8000, "fd00::7", [], BUS, every)
    assert "port 8801 is already served by python3 (pid 77, session-3.scope) on 0.0.0.0:8801" in cause
    assert "qwen27b_weights_fanout: none" in fix
    assert occupied(stray, 8000, "fd00::7", [], BUS, plain) == []
