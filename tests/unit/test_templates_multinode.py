"""Rendered files of a serving group's members (qwen27b/plan/multinode.py): the Ray head and worker
units and the head's qwen27b.service pass `systemd-analyze verify` with empty stderr, carry the
plan's ports and addresses and the same hardening as qwen27b.service; the env file sets the link's
interface and addresses; the nftables rule opens Ray, vLLM and NCCL ports to the other members only
(checked with `nft -c`). Decided from the recorded 2x V100 16 GB facts (no GPUs here).
"""

import os
import shutil
import subprocess

import pytest

from qwen27b.controller.render import render, render_all
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.controller.render_group import ray_context
from qwen27b.controller.sandbox import COMMON_HARDENING, GPU_DEVICES
from qwen27b.onhost.contract import FIREWALL_UNIT, RAY_UNIT
from qwen27b.plan.inventory import validate_inventory
from qwen27b.plan.multinode import Member, decide_group
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
GROUP = {"qwen27b_node_group": "pair-a", "qwen27b_node_interface": "enp65s0f0", "qwen27b_interconnect_gbps": 10,
         "qwen27b_serve_flags": {"--max-model-len": 65536}}


@pytest.fixture(scope="module")
def pair():
    hosts = [("head", {**GROUP, "qwen27b_node_role": "head", "qwen27b_node_address": "10.10.0.1",
                       "qwen27b_bind_address": "192.168.10.31"}),
             ("worker", {**GROUP, "qwen27b_node_role": "worker", "qwen27b_node_address": "10.10.0.2"})]
    settings = validate_inventory(hosts)
    out = decide_group("pair-a", [Member(n, recorded_facts("v100x2-16gb"), settings[n], settings[n].node_address)
                                  for n, _ in hosts], load_stack())
    assert all(d.group is not None for d in out.values()), out
    return out


def argv(unit: str) -> list[str]:
    return unit.split("ExecStart=", 1)[1].split("\nTimeoutStopSec=", 1)[0].replace("\\\n", " ").split()


def test_head_runs_the_ray_head_with_fixed_ports_and_no_dashboard(pair):
    unit = render("qwen27b-ray.service.j2", ray_context(pair["head"]))
    args = argv(unit)
    assert args[:9] == ["/opt/qwen27b/current/venv/bin/ray", "start", "--block", "--disable-usage-stats",
                        "--node-ip-address", "10.10.0.1", "--num-gpus", "2", "--head"]
    for flag, value in (("--port", "6379"), ("--node-manager-port", "6380"), ("--object-manager-port", "6381"),
                        ("--min-worker-port", "10002"), ("--max-worker-port", "10101"),
                        ("--temp-dir", "/var/lib/qwen27b/ray")):
        assert args[args.index(flag) + 1] == value
    assert "--include-dashboard=false" in args and "--address" not in args
    assert "PartOf=qwen27b.service" in unit and "Restart=on-failure" in unit


def test_worker_joins_the_head_and_retries_until_it_answers(pair):
    unit = render("qwen27b-ray.service.j2", ray_context(pair["worker"]))
    args = argv(unit)
    assert args[args.index("--address") + 1] == "10.10.0.1:6379"
    assert args[args.index("--node-ip-address") + 1] == "10.10.0.2"
    assert "--head" not in args and "--temp-dir" not in args  # Ray takes it from the head
    assert "PartOf=" not in unit and "Restart=always" in unit and "StartLimitIntervalSec=0" in unit


@pytest.mark.parametrize("role", ["head", "worker"])
def test_ray_unit_is_hardened_like_the_service_with_the_gpus(pair, role):
    lines = render("qwen27b-ray.service.j2", ray_context(pair[role])).splitlines()
    for directive, value in COMMON_HARDENING + GPU_DEVICES:
        assert f"{directive}={value}" in lines
    assert "User=qwen27b" in lines and "EnvironmentFile=/etc/qwen27b/qwen27b.env" in lines


def test_head_engine_requires_the_ray_head_and_finds_it_by_address(pair):
    files = render_all(pair["head"])
    unit = files["qwen27b.service.j2"]
    assert f"Requires={RAY_UNIT}" in unit and f"After=network-online.target nvidia-persistenced.service {RAY_UNIT}" in unit
    assert "Environment=RAY_ADDRESS=10.10.0.1:6379" in unit
    assert "--pipeline-parallel-size 2" in unit and "--distributed-executor-backend ray" in unit
    single = render_all(pair["head"].__class__(**{**pair["head"].__dict__, "group": None}))["qwen27b.service.j2"]
    assert "Requires=" not in single and "RAY_ADDRESS" not in single  # nothing changes for a host alone


@pytest.mark.parametrize("role, address", [("head", "10.10.0.1"), ("worker", "10.10.0.2")])
def test_env_names_the_link_for_nccl_gloo_and_vllm(pair, role, address):
    env = render_all(pair[role])["qwen27b.env.j2"].splitlines()
    for line in (f"VLLM_HOST_IP={address}", "NCCL_SOCKET_IFNAME=enp65s0f0", "GLOO_SOCKET_IFNAME=enp65s0f0",
                 "VLLM_PORT=29500", "RAY_USAGE_STATS_ENABLED=0", "CUDA_VISIBLE_DEVICES=0,1", "HF_HUB_OFFLINE=1"):
        assert line in env


@needs_systemd
def test_units_pass_systemd_analyze_verify(tmp_path, pair):
    for role in ("head", "worker"):
        root = tmp_path / role
        ray = root / "opt/qwen27b/current/venv/bin"
        ray.mkdir(parents=True)
        for exe in ("ray", "python", "qwen27b-health"):
            (ray / exe).write_text("#!/bin/sh\n")
            (ray / exe).chmod(0o755)
        units = root / "units"
        units.mkdir()
        (units / RAY_UNIT).write_text(render("qwen27b-ray.service.j2", ray_context(pair[role], prefix=str(root))))
        names = [RAY_UNIT]
        firewall = firewall_contexts(pair[role])  # a member always has one: its units Requires= it
        (units / FIREWALL_UNIT).write_text(render("qwen27b-firewall.service.j2", firewall["qwen27b-firewall.service.j2"]))
        names.append(FIREWALL_UNIT)
        if role == "head":
            (units / "qwen27b.service").write_text(render_all(pair[role], prefix=str(root))["qwen27b.service.j2"])
            names.append("qwen27b.service")
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", *[str(units / n) for n in names]],
                                capture_output=True, text=True, cwd=units, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
        assert result.returncode == 0 and result.stderr == "", (role, result.stderr)


@pytest.mark.parametrize("role, peer", [("head", "10.10.0.2"), ("worker", "10.10.0.1")])
def test_firewall_opens_the_group_ports_to_the_other_member_only(tmp_path, pair, role, peer):
    context = firewall_contexts(pair[role])["qwen27b-firewall.nft.j2"]
    rule = render("qwen27b-firewall.nft.j2", context)
    lines = [line.strip() for line in rule.splitlines()]
    assert lines.index("ct state established,related accept") < lines.index("# Ray gcs (serving group pair-a)")
    for port in ("6379", "6380", "10002-10101", "29500-29509", "32768-60999"):
        assert [line for line in lines if f"dport {port} " in line] == [
            f'iifname "lo" tcp dport {port} accept', f"ip saddr {peer}/32 tcp dport {port} accept",
            f"tcp dport {port} reject with tcp reset"]
    if role == "head":  # Ray's client server runs code for whoever connects: no one
        assert [line for line in lines if "dport 10001 " in line] == [
            'iifname "lo" tcp dport 10001 accept', "tcp dport 10001 reject with tcp reset"]
    assert RAY_UNIT in render("qwen27b-firewall.service.j2", context).split("Before=", 1)[1].splitlines()[0]
    if shutil.which("nft"):
        (tmp_path / "firewall.nft").write_text(rule)
        check = subprocess.run(["nft", "-c", "-f", str(tmp_path / "firewall.nft")], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
