"""Something else already serves on the port or holds the GPUs (issue 24): the Occupants parser on
real `ss -Hltnp` lines, the gate's refusal on the recorded host and its neighbours."""

from __future__ import annotations

import subprocess

import pytest

from qwen27b.controller import facts as F
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.occupants import occupied, parse_occupants
from qwen27b.plan.planner import Gpu
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

GPUS = [Gpu(0, "Tesla V100-PCIE-32GB", 32510, "7.0"), Gpu(1, "Tesla V100-PCIE-32GB", 32510, "7.0")]
BUS = {0: "00000000:3B:00.0", 1: "00000000:5E:00.0"}


def occ(*listen, gpu=(), units=None):
    return parse_occupants(["== listen", *listen, "== gpu", *gpu, "== units", *(units or [])])


def test_the_fact_command_runs_here_and_its_output_parses():
    """The real command on this controller: its ss lines (whatever listens here) parse."""
    result = subprocess.run(["bash", "-c", F.Occupants().command()], capture_output=True, text=True, timeout=60)
    found = parse_occupants(result.stdout.splitlines())
    assert found is not None and set(found) == {"listen", "gpu", "units"}


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
