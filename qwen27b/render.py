"""Render the service's files from a Decision: the systemd unit, its env file, the health timer.

Templates hold no logic beyond loops; every value (and every hardening line with its reason)
is computed here, so tests can check the values and `systemd-analyze verify` the result.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import jinja2

from .gate import Decision
from .health import TEXTFILE_DIR
from .stack import api_key_env_file

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
SERVICE_UNIT = "qwen27b.service"
HEALTH_UNIT = "qwen27b-health.service"
HEALTH_TIMER = "qwen27b-health.timer"
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")

# Every line removes a privilege vLLM does not use; GPU access is kept through DeviceAllow.
COMMON_HARDENING = [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("PrivateTmp", "yes"),
    ("ProtectHome", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
    ("CapabilityBoundingSet", ""),
    # NCCL and the API server need inet sockets; netlink lists interfaces.
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    ("UMask", "0027"),
]
# The NVIDIA device nodes: control, UVM, and every /dev/nvidiaN (major "nvidia-frontend").
GPU_DEVICES = [
    ("DevicePolicy", "closed"),
    ("DeviceAllow", "/dev/nvidiactl rw"),
    ("DeviceAllow", "/dev/nvidia-uvm rw"),
    ("DeviceAllow", "/dev/nvidia-uvm-tools rw"),
    ("DeviceAllow", "char-nvidia-frontend rw"),
    ("DeviceAllow", "char-nvidia-caps r"),
]


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: single-quoted when needed; % and $ escaped for systemd."""
    arg = str(arg).replace("%", "%%").replace("$", "$$")
    if _SAFE.match(arg):
        return arg
    return "'" + arg.replace("\\", "\\\\").replace("'", "\\'") + "'"


def layout(decision: Decision, prefix: str = "") -> dict:
    """Host paths (prefix lets tests render into a scratch root)."""
    paths = decision.stack.paths
    return {
        "root": prefix + paths["root"],
        "venv": prefix + paths["current_release"] + "/venv",
        "state_dir": prefix + paths["state"],
        "cache_dir": prefix + paths["cache"],
        "config_dir": prefix + paths["config"],
        "env_file": prefix + paths["config"] + "/qwen27b.env",
        "secrets_file": prefix + api_key_env_file(paths),
        "health_status": prefix + paths["state"] + "/health.json",
    }


def hardening(decision: Decision, where: dict) -> list[tuple[str, str]]:
    lines = list(COMMON_HARDENING) + [("ReadWritePaths", where["state_dir"])]
    if decision.gpus:
        lines += GPU_DEVICES
    else:
        lines.append(("PrivateDevices", "yes"))
    return lines


def service_env(decision: Decision, where: dict) -> list[tuple[str, str]]:
    env = {
        "HOME": where["state_dir"],
        "XDG_CACHE_HOME": where["cache_dir"],
        "VLLM_CACHE_ROOT": where["cache_dir"] + "/vllm",
        "HF_HOME": where["cache_dir"] + "/huggingface",
        # weights are placed by the weights role; the service never reaches a hub
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if decision.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in decision.gpus)
    if decision.serve.has("--middleware"):
        # the route guard (route_auth.py) lives in <venv>/lib next to qwen27b_health.py, outside
        # site-packages, where --middleware qwen27b_auth.RequireKey imports it
        env["PYTHONPATH"] = where["venv"] + "/lib"
        if decision.settings.metrics_allow:
            env["QWEN27B_METRICS_ALLOW"] = ",".join(decision.settings.metrics_allow)
    env.update(decision.serve.env)
    return sorted(env.items())


def contexts(decision: Decision, prefix: str = "") -> dict[str, dict]:
    """Template name -> context, for every file the service role writes."""
    where = layout(decision, prefix)
    serve = decision.serve
    address = serve.value("--host")
    port = serve.value("--port")
    base_url = f"http://{address}:{port}"
    exec_start = [f"{where['venv']}/bin/python -m vllm.entrypoints.openai.api_server"]
    for flag in serve.flags:
        exec_start.append(flag.name if flag.value is None else f"{flag.name} {systemd_quote(flag.value)}")
    model = decision.stack.model
    service = {
        **where,
        "served_name": serve.value("--served-model-name"),
        "model_ref": f"{model['id']}@{model['revision']}",
        "profile": decision.profile,
        "after": ["network-online.target"] + (["nvidia-persistenced.service"] if decision.gpus else []),
        "user": decision.stack.paths["service_user"],
        "exec_start": exec_start,
        # `systemctl start` returns once /health answers, so start-up failures show in the unit state
        # and fails as soon as the main process dies ($MAINPID: systemd's), instead of at the timeout
        "ready_check": (f"/bin/sh -c 'until curl -fs -o /dev/null {base_url}/health; "
                        "do kill -0 $MAINPID || exit 1; sleep 2; done'"),
        "start_timeout_s": decision.stack.profile["serve"]["start_timeout_s"],
        "start_limit_interval_s": 1800,
        "start_limit_burst": 5,
        "hardening": hardening(decision, where),
    }
    s = decision.settings
    health = {
        "service_unit": SERVICE_UNIT,
        "interval_s": s.health_interval_s,
        "first_check_s": 120,
        "timeout_s": 60,
        "health_exec": [f"{where['venv']}/bin/qwen27b-health", "--url", base_url, "--unit", SERVICE_UNIT,
                        "--status-file", where["health_status"], "--served-name", serve.value("--served-model-name"),
                        "--restart-after", str(s.health_failures_before_restart),
                        "--model-ref", systemd_quote(service["model_ref"]),
                        "--quiet"]  # the journal: one line a check, the table when the verdict changes
        + (["--api-key-file", where["secrets_file"]] if s.api_key_file else []),
        # the check must get CPU when the service takes it all (a CPU build under load starved it
        # for tens of seconds, close to timeout_s): CPUWeight where systemd runs the cpu controller
        # (default 100), Nice where both share one cpu cgroup (cgroup v1 without it, containers)
        "hardening": [("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                      ("NoNewPrivileges", "yes"), ("ReadWritePaths", where["state_dir"]), ("CPUWeight", "1000"),
                      ("Nice", "-5"),
                      # node_exporter's textfile dir; "-": no error where node_exporter is not installed
                      ("ReadWritePaths", f"-{TEXTFILE_DIR}")],
    }
    return {
        "qwen27b.service.j2": service,
        "qwen27b.env.j2": {"env": service_env(decision, where), "secrets_file": where["secrets_file"]},
        "qwen27b-health.service.j2": health,
        "qwen27b-health.timer.j2": health,
    }


FIREWALL_UNIT = "qwen27b-firewall.service"
# Stop first (blocking, TimeoutStopSec bounds it): a unit caught in a crash loop would otherwise
# still show its old auto-restart state to the readiness wait; then start without waiting for the
# weights to load (the verify role waits, with progress).
RESTART_COMMAND = (f"systemctl stop {SERVICE_UNIT}; systemctl reset-failed {SERVICE_UNIT}; "
                   f"systemctl start --no-block {SERVICE_UNIT}")


def firewall_contexts(decision: Decision) -> dict[str, dict]:
    """The nftables rule and its unit when qwen27b_firewall_allow is set ({} when it is not)."""
    networks = decision.settings.firewall_allow
    if not networks:
        return {}
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks]
    context = {
        "port": decision.serve.value("--port"),
        "service_unit": SERVICE_UNIT,
        "firewall_unit": FIREWALL_UNIT,
        "rules_file": decision.stack.paths["config"] + "/firewall.nft",
        "allowed": [("ip" if n.version == 4 else "ip6", str(n)) for n in parsed],
    }
    return {"qwen27b-firewall.nft.j2": context, "qwen27b-firewall.service.j2": context}


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)


def render(template: str, context: dict) -> str:
    return _ENV.get_template(template).render(**context)


def render_all(decision: Decision, prefix: str = "") -> dict[str, str]:
    """Template name -> rendered text."""
    return {name: render(name, ctx) for name, ctx in contexts(decision, prefix).items()}
