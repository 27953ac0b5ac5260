"""A serving group's member (multi-node, qwen27b_node_group): its additions to the env file, its Ray
unit, and its firewall rules. Cut from controller/render.py (issue 50).
"""

from __future__ import annotations

from qwen27b.controller.sandbox import hardening, left_off
from qwen27b.controller.unitwords import layout, nft_networks, systemd_quote, unit_text
from qwen27b.onhost.contract import SERVICE_UNIT
from qwen27b.plan.gate import Decision


def ray_address(decision: Decision) -> str:
    g = decision.group
    return f"{g.head_address}:{g.multinode['ray_ports']['gcs']}"


def group_env(decision: Decision) -> dict[str, str]:
    """A member's additions to the env file (the Ray unit and, on the head, vLLM read it): its address
    on the link, the link's interface for NCCL and Gloo, vLLM's fixed rendezvous port. The head's
    NCCL_* reach every Ray worker [vllm-ray-env], so hostdata holds the interface name equal."""
    g = decision.group
    return {"VLLM_HOST_IP": g.address, "NCCL_SOCKET_IFNAME": g.interface, "GLOO_SOCKET_IFNAME": g.interface,
            "VLLM_PORT": str(g.multinode["vllm_port"]["first"]), "RAY_USAGE_STATS_ENABLED": "0"}


RAY_LEFT_OFF = [
    ("PrivateNetwork= and IPAddressDeny= are off", "Ray, vLLM and NCCL talk to the other members; the firewall role's "
                                                   "nftables table opens their ports to the members only"),
    ("MemoryDenyWriteExecute= is off", "the vLLM workers Ray starts JIT-compile kernels (torch, Triton, CUDA)"),
    ("PrivateUsers= is off", "no capability left to confine; a user namespace under the nspawn test hosts is untested"),
]


def ray_context(decision: Decision, prefix: str = "") -> dict:
    """The Ray node of a serving group's member: the head (GCS, dashboard off) started with, and stopped
    with, qwen27b.service (PartOf=); a worker joining the head, restarted until the head answers."""
    g, where = decision.group, layout(decision, prefix)
    ports = g.multinode["ray_ports"]
    head = g.role == "head"
    argv = [f"{where['venv']}/bin/ray", "start", "--block", "--disable-usage-stats", "--node-ip-address", g.address,
            "--num-gpus", str(len(decision.gpus))]
    if head:
        # the temp dir (sockets, logs) under the state dir: PrivateTmp= gives every unit its own /tmp, and the
        # engine in qwen27b.service reaches this node's raylet through these sockets; workers take it from the head
        argv += ["--head", "--port", str(ports["gcs"]), "--include-dashboard=false", "--temp-dir", where["state_dir"] + "/ray"]
    else:
        argv += ["--address", ray_address(decision)]
    argv += ["--node-manager-port", str(ports["node_manager"]), "--object-manager-port", str(ports["object_manager"]),
             "--runtime-env-agent-port", str(ports["runtime_env_agent"]),
             "--dashboard-agent-grpc-port", str(ports["dashboard_agent_grpc"]),
             "--dashboard-agent-listen-port", str(ports["dashboard_agent_listen"]),
             "--metrics-export-port", str(ports["metrics_export"]),
             "--min-worker-port", str(g.multinode["ray_worker_ports"]["min"]),
             "--max-worker-port", str(g.multinode["ray_worker_ports"]["max"])]
    return {
        **where,
        "role": g.role,
        "group": unit_text(g.name),
        "address": g.address,
        "after": ["network-online.target"] + (["nvidia-persistenced.service"] if decision.gpus else []),
        "part_of": [SERVICE_UNIT] if head else [],
        "requires": [],
        "user": decision.stack.layout.service_user,
        "exec_start": [systemd_quote(arg) for arg in argv],
        # a worker waits for its head (down, restarting, not deployed yet) as long as it takes
        "restart": "on-failure" if head else "always",
        "start_limit_interval_s": 1800 if head else 0,
        "start_limit_burst": 5,
        "hardening": hardening(decision, where),
        "left_off": left_off(decision, RAY_LEFT_OFF),
    }


def group_rules(decision: Decision) -> list[dict]:
    """The firewall's rules of a member: every port of the group open to the other members and the host
    itself, reset for everyone else (vLLM warns its traffic is unencrypted and can run code
    [vllm-multinode]); Ray's client server (the head's port 10001, code from anyone) to no one."""
    from qwen27b.plan.inventory import group_ports

    g = decision.group
    peers = nft_networks([f"{address}/{32 if ':' not in address else 128}" for address in g.peers])
    rules = [{"port": str(low) if low == high else f"{low}-{high}", "what": f"{what} (serving group {g.name})",
              "allowed": peers} for what, low, high in group_ports({"multinode": g.multinode})]
    if g.role == "head":
        rules.append({"port": str(RAY_CLIENT_PORT), "what": "Ray client server (not used: closed)", "allowed": []})
    return rules


RAY_CLIENT_PORT = 10001  # `ray start --head` always listens here (Ray docs, ports configurations)
