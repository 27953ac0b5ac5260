"""Render the service's files from a Decision: the systemd unit, its env file, the health timer and
endpoint, the GPUs' power unit.

Templates hold no logic beyond loops; every value (and every hardening line with its reason)
is computed here, so tests can check the values and `systemd-analyze verify` the result. Cut at its
seams (issue 50): the sandbox's lines in sandbox, the quoting and the host's places in unitwords, a
serving group's member in render_group, copies on one machine in render_copies, the firewall in
render_firewall.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import jinja2

from qwen27b.controller.render_group import group_env, ray_address
from qwen27b.controller.sandbox import (ENDPOINT_HARDENING, ENDPOINT_LEFT_OFF, ENDPOINT_MAX_CONNECTIONS,
                                       ENDPOINT_MAX_PER_SOURCE, ENDPOINT_RUNTIME_MAX_S, HEALTH_HARDENING, HEALTH_LEFT_OFF,
                                       JOURNAL_GROUP, SERVICE_LEFT_OFF, hardening, left_off)
from qwen27b.controller.unitwords import env_value, layout, restart_exec, systemd_quote, unit_text
from qwen27b.onhost.contract import (HEALTH_HTTP_TEMPLATE, HEALTH_UNIT, IDLE_PROBE_DEADLINE_ENV, IDLE_PROBE_EVERY_ENV,
                                     MODEL_REF_ENV, QUIET_ENV, RAY_UNIT, RELEASE_RECORD_ENV, SERVICE_UNIT, SPECULATIVE_ENV,
                                     STALL_AFTER_ENV, TEXTFILE_DIR, lib_dir, module_argv)
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostdata import http_base
from qwen27b.plan.hostlayout import HostLayout

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
HEALTH_HTTP_SERVICE = HEALTH_HTTP_TEMPLATE

API_KEY_CREDENTIAL = "api-key"


def serving_gpus(decision: Decision) -> list:
    """The GPUs vLLM uses: the planner's TP group (the best linked, qwen27b/plan/topology.py), or the
    first TP x PP of the selected ones. A TP below the GPU count would otherwise see them all and
    leave the rest idle without a word (the plan notes them)."""
    if decision.group is not None or not decision.serve.has("--tensor-parallel-size"):
        return decision.gpus
    used = int(decision.serve.value("--tensor-parallel-size"))
    if decision.serve.has("--pipeline-parallel-size"):
        used *= int(decision.serve.value("--pipeline-parallel-size"))
    elif len(decision.serve.tp_group) == used:
        return [g for g in decision.gpus if g.index in decision.serve.tp_group]
    return decision.gpus[:used]


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def jit_cache_env(cache_dir: str) -> dict[str, str]:
    """Every cache the engine compiles into at first use, under the cache dir: ProtectSystem=strict
    leaves only the state dir writable, and each tool's default (~/.cache, /tmp/torchinductor_<user>,
    ~/.triton) would be lost with PrivateTmp or refused. vLLM's own (VLLM_CACHE_ROOT) is set beside."""
    return {
        "XDG_CACHE_HOME": cache_dir,
        "TORCH_EXTENSIONS_DIR": cache_dir + "/torch_extensions",  # torch.utils.cpp_extension (ninja builds)
        "TORCHINDUCTOR_CACHE_DIR": cache_dir + "/torchinductor",  # torch.compile's generated kernels
        "TRITON_CACHE_DIR": cache_dir + "/triton",
        "FLASHINFER_WORKSPACE_BASE": cache_dir,  # flashinfer's JIT: <base>/.cache/flashinfer
        "CUDA_CACHE_PATH": cache_dir + "/nv-compute",  # the driver's PTX JIT cache (~/.nv/ComputeCache)
    }


def service_env(decision: Decision, where: dict) -> list[tuple[str, str]]:
    env = {
        "HOME": where["state_dir"],
        # the venv's bin first: torch's JIT extension builds run `ninja` from PATH ("Ninja is required",
        # v100-skinny#3); the rest is systemd's default PATH
        "PATH": where["venv"] + "/bin:" + SYSTEM_PATH,
        **jit_cache_env(where["cache_dir"]),
        "VLLM_CACHE_ROOT": where["cache_dir"] + "/vllm",
        "HF_HOME": where["cache_dir"] + "/huggingface",
        # weights are placed by the weights role; the service never reaches a hub
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if decision.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in serving_gpus(decision))
    if decision.serve.has("--middleware"):
        # the route guard is qwen27b_onhost.route_auth, shipped into <venv>/lib outside site-packages
        env["PYTHONPATH"] = lib_dir(where["venv"])
        if decision.settings.metrics_allow:
            env["QWEN27B_METRICS_ALLOW"] = ",".join(decision.settings.metrics_allow)
    if decision.group is not None:
        env.update(group_env(decision))
    env.update(decision.serve.env)
    return sorted((name, env_value(value)) for name, value in env.items())


def warmup_argv(decision: Decision, where: dict, url: str, served_name: str | None) -> list[str]:
    """The unit's ExecStartPost: qwen27b_onhost.warmup waits for /health, then sends one short
    completion (the first request compiles: profile serve.warmup). The key reaches it through the
    unit's EnvironmentFile=, never argv; PYTHONPATH through env(1), for this command only."""
    warm = decision.stack.profile["serve"]["warmup"]
    return (["/usr/bin/env", f"PYTHONPATH={lib_dir(where['venv'])}"] + module_argv(where["venv"], "warmup")
            + ["--url", url] + (["--served-name", served_name] if served_name else [])
            + ["--timeout-s", str(warm["timeout_s"]), "--max-tokens", str(warm["max_tokens"])])


def contexts(decision: Decision, prefix: str = "") -> dict[str, dict]:
    """Template name -> context, for every file the service role writes."""
    where = layout(decision, prefix)
    serve = decision.serve
    address = serve.value("--host")
    port = serve.value("--port")
    base_url = http_base(address, port)
    exec_start = [f"{where['venv']}/bin/python -m vllm.entrypoints.openai.api_server"]
    for flag in serve.flags:
        exec_start.append(flag.name if flag.value is None else f"{flag.name} {systemd_quote(flag.value)}")
    model = decision.stack.model
    service = {
        **where,
        "served_name": unit_text(serve.value("--served-model-name")),
        "model_ref": unit_text(f"{model['id']}@{model['revision']}"),
        "profile": unit_text(decision.profile),
        "after": ["network-online.target"] + (["nvidia-persistenced.service"] if decision.gpus else []),
        "user": decision.stack.layout.service_user,
        "exec_start": exec_start,
        # `systemctl start` returns once /health answers and a warm-up completion came back, so start-up
        # failures show in the unit state, and fails as soon as the main process dies, not at the timeout
        "ready_check": " ".join(systemd_quote(arg) for arg in warmup_argv(decision, where, base_url,
                                                                            serve.value("--served-model-name"))),
        "start_timeout_s": decision.stack.profile["serve"]["start_timeout_s"],
        "start_limit_interval_s": 1800,
        "start_limit_burst": 5,
        "hardening": hardening(decision, where),
        "left_off": left_off(decision, SERVICE_LEFT_OFF),
        # a serving group's head: the engine drives the group's Ray cluster, reached through the head's
        # GCS (its /tmp is private, so ray.init finds no local cluster file); none elsewhere
        "requires": [RAY_UNIT] if decision.group is not None else [],
        "environment": [("RAY_ADDRESS", ray_address(decision))] if decision.group is not None else [],
    }
    if decision.group is not None:
        service["after"] = service["after"] + [RAY_UNIT]
    # what the engine runs at once (/health's slots, the gateway's fair share): from the release record
    health = health_context(decision, where, SERVICE_UNIT, HEALTH_UNIT, base_url,
                            serve.value("--served-model-name"), service["model_ref"],
                            ((RELEASE_RECORD_ENV, HostLayout.of(decision.stack.paths).release_record),))
    endpoint = endpoint_context(decision, where, address)
    return {
        "qwen27b.service.j2": service,
        "qwen27b.env.j2": {"env": service_env(decision, where), "secrets_file": where["secrets_file"]},
        "qwen27b-health.service.j2": health,
        "qwen27b-health.timer.j2": health,
        "qwen27b-health-http.socket.j2": endpoint,
        "qwen27b-health-http@.service.j2": endpoint,
    }


def health_context(decision: Decision, where: dict, service_unit: str, health_unit: str, base_url: str,
                   served_name: str, model_ref: str, health_env: tuple = ()) -> dict:
    """The health unit's and its timer's context: the check of `service_unit` at `base_url`, its status
    file and restart request from `where`. A copy's (instance_health_contexts) differs in those and
    in `health_env` (its name and GPUs)."""
    serve = decision.serve
    s = decision.settings
    # root's 0600 key file reaches the unprivileged check as a systemd credential: a copy readable
    # by the unit's user only, under /run/credentials/<unit>/, for the run's lifetime
    credential = f"/run/credentials/{health_unit}/{API_KEY_CREDENTIAL}"
    health = {
        "service_unit": service_unit,
        "interval_s": s.health_interval_s,
        "first_check_s": 120,
        "timeout_s": 60,
        "user": decision.stack.layout.service_user,
        "journal_group": JOURNAL_GROUP,
        "load_credential": f"{API_KEY_CREDENTIAL}:{where['secrets_file']}" if s.api_key_file else None,
        "restart_request": where["restart_request"],
        "restart_exec": restart_exec(where["restart_request"], service_unit),
        "health_exec": [f"{where['venv']}/bin/qwen27b-health", "--url", base_url, "--unit", service_unit,
                        "--status-file", where["health_status"], "--served-name", served_name,
                        "--restart-after", str(s.health_failures_before_restart)]
        + (["--api-key-file", credential] if s.api_key_file else []),
        # environment, not flags: a rollback to an older qwen27b-health must still run. Quiet: the
        # journal gets one line a check, the table when the verdict changes
        "health_env": [(QUIET_ENV, "1"), (MODEL_REF_ENV, model_ref),
                       (SPECULATIVE_ENV, f"{serve.spec.method}:{serve.spec.depth}" if serve.spec.on else "off")]
        + liveness_env(decision.stack.profile["serve"].get("liveness") or {}) + list(health_env),
        # the check must get CPU when the service takes it all (a CPU build under load starved it
        # for tens of seconds, close to timeout_s): CPUWeight where systemd runs the cpu controller
        # (default 100), Nice where both share one cpu cgroup (cgroup v1 without it, containers);
        # systemd sets Nice before it drops to the user, so no capability is needed.
        # node_exporter's textfile dir: "-", no error where node_exporter is not installed
        "hardening": hardening(decision, where, HEALTH_HARDENING) + [("CPUWeight", "1000"), ("Nice", "-5"),
                                                                      ("ReadWritePaths", f"-{TEXTFILE_DIR}")],
        "left_off": left_off(decision, HEALTH_LEFT_OFF),
    }
    # each argument quoted for systemd, as the main unit's ExecStart is
    health["health_exec"] = [systemd_quote(arg) for arg in health["health_exec"]]
    return health


def liveness_env(liveness: dict) -> list[tuple[str, str]]:
    """The stack's engine-progress bounds for the health check (whole seconds: allow-listed digits)."""
    names = {"stall_after_s": STALL_AFTER_ENV, "idle_probe_every_s": IDLE_PROBE_EVERY_ENV,
             "idle_probe_deadline_s": IDLE_PROBE_DEADLINE_ENV}
    return [(env, str(int(liveness[key]))) for key, env in names.items() if key in liveness]


def endpoint_context(decision: Decision, where: dict, address: str) -> dict:
    """The health endpoint's socket and service: on the service's address, the health port. Who may
    connect is the socket's IPAddressAllow=: loopback, the host's own bind address (a local client
    connecting to it has that source address) and qwen27b_metrics_allow; everyone else is dropped."""
    s = decision.settings
    ip = ipaddress.ip_address(address)
    listen = f"[{ip}]:{s.health_port}" if ip.version == 6 else f"{ip}:{s.health_port}"
    own = [] if ip.is_loopback or ip.is_unspecified else [str(ip)]
    argv = module_argv(where["venv"], "endpoint") + ["--status-file", where["health_status"],
                                                     "--interval-s", str(s.health_interval_s)]
    return {
        "listen": listen,
        "port": s.health_port,
        "allow": ["localhost"] + own + list(s.metrics_allow or []),
        "max_connections": ENDPOINT_MAX_CONNECTIONS,
        "max_per_source": ENDPOINT_MAX_PER_SOURCE,
        "status_file": where["health_status"],
        "user": decision.stack.layout.service_user,
        "pythonpath": lib_dir(where["venv"]),
        "environment": [],  # a host serving copies: their names (instance_endpoint_context)
        "exec": [systemd_quote(arg) for arg in argv],
        "runtime_max_s": ENDPOINT_RUNTIME_MAX_S,
        # never the key: the endpoint reads the status file only, and this makes sure of it
        "hardening": ENDPOINT_HARDENING + [("InaccessiblePaths", f"-{where['secrets_file']}")],
        "left_off": [f"{what}: {why}" for what, why in ENDPOINT_LEFT_OFF],
    }


# Stop first (blocking, TimeoutStopSec bounds it): a unit caught in a crash loop would otherwise
# still show its old auto-restart state to the readiness wait; then start without waiting for the
# weights to load (the verify role waits, with progress).
RESTART_COMMAND = (f"systemctl stop {SERVICE_UNIT}; systemctl reset-failed {SERVICE_UNIT}; "
                   f"systemctl start --no-block {SERVICE_UNIT}")


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)


def render(template: str, context: dict) -> str:
    return _ENV.get_template(template).render(**context)


def render_all(decision: Decision, prefix: str = "") -> dict[str, str]:
    """Template name -> rendered text."""
    return {name: render(name, ctx) for name, ctx in contexts(decision, prefix).items()}


# ------------------------------------------------------------------ used cards (issue 27)

GPU_POWER_UNIT = "qwen27b-gpu-power.service"
GPU_POWER_TEMPLATE = "qwen27b-gpu-power.service.j2"
NVIDIA_SMI = "/usr/bin/nvidia-smi"  # where the driver packages put it (nvidia-utils-<branch>)


def gpu_power_unit(decision: Decision, prefix: str = "") -> str:
    """The oneshot unit that turns persistence mode on and sets the planned power caps at boot
    (gate.Decision.power: indices and watts are ints the gate checked against each card's range)."""
    power = decision.power
    limits = [(int(i), int(w)) for i, w in power.limits]
    return render(GPU_POWER_TEMPLATE, {"service_unit": SERVICE_UNIT, "nvidia_smi": f"{prefix}{NVIDIA_SMI}",
                                       "limits": limits, "ecc_on": [int(i) for i in power.ecc_on]})
