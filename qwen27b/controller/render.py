"""Render the service's files from a Decision: the systemd unit, its env file, the health timer.

Templates hold no logic beyond loops; every value (and every hardening line with its reason)
is computed here, so tests can check the values and `systemd-analyze verify` the result.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import jinja2

from qwen27b.plan.gate import Decision
from qwen27b.onhost.contract import (COPIES_ENV, COPY_ENV, FIREWALL_UNIT, GPUS_ENV, HEALTH_HTTP_SOCKET,
                                     HEALTH_HTTP_TEMPLATE, HEALTH_TIMER, HEALTH_UNIT,  # noqa: F401 (HEALTH_TIMER: roles/service.py's)
                                     IDLE_PROBE_DEADLINE_ENV, IDLE_PROBE_EVERY_ENV, INSTANCE_TEMPLATE, MODEL_REF_ENV,
                                     QUIET_ENV, RELEASE_RECORD_ENV, SLOTS_ENV, SPECULATIVE_ENV, RAY_UNIT, SERVICE_UNIT, STALL_AFTER_ENV, TEXTFILE_DIR,
                                     lib_dir, module_argv)
from qwen27b.plan.hostdata import http_base
from qwen27b.plan.settings import NODE_EXPORTER_PORT, NODE_EXPORTER_UNIT
from qwen27b.plan.hostlayout import UNIT_DIR, HostLayout  # noqa: F401 (UNIT_DIR: roles/nvidia.py imports it here)

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
HEALTH_HTTP_SERVICE = HEALTH_HTTP_TEMPLATE
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")

# The sandbox both units share: every line removes a privilege neither vLLM nor the health check
# uses. Measured with `systemd-analyze security --offline=yes` on the rendered units (docs/security.md
# has the scores; tests/unit/test_templates.py keeps them within the goals: main <= 2.5, health <= 4.0).
SANDBOX = [
    ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""),  # no capability at all: both run as the service user
    ("ProtectSystem", "strict"),
    ("PrivateTmp", "yes"),
    ("ProtectHome", "yes"),
    ("PrivateMounts", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),  # the health check reads kernel (Xid) lines from the journal, not /dev/kmsg
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
    # systemd's list for ordinary services, less @privileged (chown, setuid, mount, module, clock,
    # raw I/O, reboot, swap, bpf, ptrace); EPERM instead of a kill, so a library probing a call
    # it may not use gets an error it handles rather than a dead server
    ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged"),
    ("SystemCallErrorNumber", "EPERM"),
]
# vLLM's own lines on top of the sandbox.
COMMON_HARDENING = SANDBOX + [
    # NCCL and the API server need inet sockets; netlink lists interfaces.
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    ("RemoveIPC", "yes"),  # vLLM's shared-memory segments (TP workers) go when the service stops
    ("UMask", "0027"),
]
# What stays off in the main unit, and why (rendered into the unit as comments).
SERVICE_LEFT_OFF = [
    ("PrivateNetwork= is off", "vLLM serves the API on the network"),
    ("IPAddressDeny= is off", "who may connect is the firewall role's nftables rule (qwen27b_firewall_allow)"),
    ("MemoryDenyWriteExecute= is off", "torch, Triton and the CUDA driver JIT-compile kernels into W+X memory"),
    ("ProcSubset= is off", "vLLM, torch and psutil read /proc/meminfo, /proc/cpuinfo and /proc/stat"),
    ("PrivateUsers= is off", "no capability left to confine; a user namespace under the nspawn test hosts is untested"),
    ("RootDirectory= is off", "the release venv runs on the host's libc and NVIDIA driver libraries"),
    ("UMask=0027, not 0077", "caches and logs stay readable by the service group; nothing vLLM writes is secret"),
]
# The health check: the same sandbox, unprivileged. It probes the service over TCP, asks systemd
# over D-Bus (AF_UNIX) for the unit's state, reads the GPUs through NVML and the kernel's Xid lines
# from the journal (the systemd-journal group); a restart it decides on is done by the unit's root
# ExecStopPost (see the template), so it needs no capability, polkit rule or root.
HEALTH_HARDENING = SANDBOX + [
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
    ("MemoryDenyWriteExecute", "yes"),  # plain Python; NVML is a C library, no JIT
    ("UMask", "0077"),
]
HEALTH_LEFT_OFF = [
    ("PrivateNetwork= is off", "the check probes the service over TCP"),
    ("IPAddressDeny= is off", "the one peer is the service's own address; a wrong list would make every "
                              "check CRITICAL and the watchdog restart a healthy service"),
    ("RemoveIPC= is off", "the check runs as the service user: it would remove vLLM's shared memory after "
                          "every run"),
    ("ProcSubset= is off", "NVML reads /proc/driver/nvidia"),
    ("PrivateUsers= is off", "no capability left to confine; a user namespace under the nspawn test hosts is untested"),
    ("RootDirectory= is off", "the release venv runs on the host's libc and NVIDIA driver libraries"),
]
# The health endpoint (qwen27b_onhost.endpoint): reads one request from the socket systemd hands it
# and one file, the status; it opens no socket, writes nothing and needs no device.
ENDPOINT_HARDENING = SANDBOX + [
    ("PrivateNetwork", "yes"),  # the accepted connection is passed in; the process itself has no network
    ("RestrictAddressFamilies", "AF_UNIX"),
    ("PrivateDevices", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("ProcSubset", "pid"),
    ("UMask", "0077"),
]
ENDPOINT_LEFT_OFF = [
    ("IPAddressDeny= is off here", "the socket unit holds the allow-list (PrivateNetwork= leaves this process none)"),
    ("RemoveIPC= is off", "it runs as the service user: it would remove vLLM's shared memory after every request"),
    ("PrivateUsers= is off", "no capability left to confine; a user namespace under the nspawn test hosts is untested"),
    ("RootDirectory= is off", "the release venv runs on the host's libc"),
]
ENDPOINT_RUNTIME_MAX_S = 10  # a client that never finishes its request holds no process longer
ENDPOINT_MAX_CONNECTIONS = 16  # at once; a load balancer and a few scrapers need far fewer
ENDPOINT_MAX_PER_SOURCE = 4
# The NVIDIA device nodes: control, UVM, and every /dev/nvidiaN (major "nvidia-frontend").
GPU_DEVICES = [
    ("DevicePolicy", "closed"),
    ("DeviceAllow", "/dev/nvidiactl rw"),
    ("DeviceAllow", "/dev/nvidia-uvm rw"),
    ("DeviceAllow", "/dev/nvidia-uvm-tools rw"),
    ("DeviceAllow", "char-nvidia-frontend rw"),
    ("DeviceAllow", "char-nvidia-caps r"),
]
GPU_LEFT_OFF = ("PrivateDevices= is off", "the GPUs: DevicePolicy=closed and DeviceAllow= list the NVIDIA nodes")
JOURNAL_GROUP = "systemd-journal"  # reads the whole journal (kernel Xid lines); no other right
API_KEY_CREDENTIAL = "api-key"


def nginx_regex_literal(value: str) -> str:
    """A key or an allow-listed e-mail as an exact nginx regex: `.` and `+` are the only regex
    characters their allow-lists admit (secretfile.SECRET_CHARS, plan/chatpage.EMAIL)."""
    return re.sub(r"([.+])", r"\\\1", value)


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: single-quoted when needed; % and $ escaped for systemd."""
    arg = str(arg).replace("%", "%%").replace("$", "$$")
    if _SAFE.match(arg):
        return arg
    return "'" + arg.replace("\\", "\\\\").replace("'", "\\'") + "'"


_ENV_SAFE = re.compile(r"^[A-Za-z0-9_.,:/@+=-]*$")


def env_value(value: str) -> str:
    """One value of an EnvironmentFile= line: as is when plain (every allow-listed value is), else
    double-quoted with systemd's backslash escapes, so it stays one value on one line."""
    value = str(value)
    if _ENV_SAFE.match(value):
        return value
    escaped = "".join("\\" + c if c in '"\\$`' else c for c in value)
    return f'"{escaped}"'


def unit_text(value: str) -> str:
    """Free text in a unit line (Description=): % escaped so systemd expands no specifier."""
    return str(value).replace("%", "%%")


def layout(decision: Decision, prefix: str = "") -> dict:
    """Host paths (prefix lets tests render into a scratch root)."""
    at = decision.stack.layout
    return {
        "root": prefix + at.root,
        "venv": prefix + at.current_venv,
        "state_dir": prefix + at.state,
        "cache_dir": prefix + at.cache,
        "config_dir": prefix + at.config,
        "env_file": prefix + at.env_file,
        "secrets_file": prefix + at.api_key_env_file,
        "health_status": prefix + at.health_status,
        "restart_request": prefix + at.restart_request,
    }


def hardening(decision: Decision, where: dict, base=COMMON_HARDENING) -> list[tuple[str, str]]:
    lines = list(base) + [("ReadWritePaths", where["state_dir"])]
    if decision.gpus:
        lines += GPU_DEVICES
    else:
        lines.append(("PrivateDevices", "yes"))
    return lines


def left_off(decision: Decision, reasons: list[tuple[str, str]]) -> list[str]:
    """The comment lines naming each sandbox directive left off and why."""
    return [f"{what}: {why}" for what, why in reasons + ([GPU_LEFT_OFF] if decision.gpus else [])]


def restart_exec(request: str, unit: str) -> str:
    """The health unit's root ExecStopPost: restart the service only when the check left a request
    (rm(1) removes a symlink itself, never its target; no request, nothing happens)."""
    for value in (request, unit):
        if not _SAFE.match(value) or "%" in value:
            raise ValueError(f"not a plain path or unit name: {value!r}")
    return f"/bin/sh -c 'if rm {request} 2>/dev/null; then systemctl restart --no-block {unit}; fi'"


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


def nft_networks(networks: list | None) -> list[tuple[str, str]]:
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks or []]
    return [("ip" if n.version == 4 else "ip6", str(n)) for n in parsed]


def firewall_contexts(decision: Decision) -> dict[str, dict]:
    """The nftables rule and its unit ({} when there is nothing to guard): with qwen27b_firewall_allow,
    vLLM's port to those networks; with it or qwen27b_node_exporter, the health endpoint's port and
    node_exporter's (which has no allow-list of its own) to qwen27b_metrics_allow. The host itself
    (loopback) always gets through."""
    s = decision.settings
    rules = []
    serving = [(copy.serve.value("--port"), instance_unit(i.name)) for i, copy in decision.copies] \
        or [(decision.serve.value("--port"), SERVICE_UNIT)]
    if s.firewall_allow:
        rules += [{"port": port, "what": f"{unit} (vLLM's API)", "allowed": nft_networks(s.firewall_allow)}
                  for port, unit in serving]
    if decision.group is not None:
        rules += group_rules(decision)
    if rules or s.node_exporter:
        rules.append({"port": s.health_port, "what": f"{HEALTH_HTTP_SOCKET} (the health endpoint)",
                      "allowed": nft_networks(s.metrics_allow)})
    if s.node_exporter:
        rules.append({"port": NODE_EXPORTER_PORT, "what": f"{NODE_EXPORTER_UNIT} (node_exporter)",
                      "allowed": nft_networks(s.metrics_allow)})
    if not rules:
        return {}
    context = {
        "rules": rules,
        "ports": ", ".join(str(rule["port"]) for rule in rules),
        # a socket unit cannot be ordered after it (sockets come before basic.target, which it is after):
        # the socket's own IPAddressAllow= guards the health port from the start
        # Before= and, once enabled, RequiredBy= (a .requires/ link beside each guarded unit): they fail
        # closed (a rule file that does not load at boot leaves them stopped, not open to all), and
        # adding or removing the firewall leaves their own unit files, so a running vLLM, alone
        "guards": [unit for _, unit in serving] + ([RAY_UNIT] if decision.group is not None else [])
        + ([NODE_EXPORTER_UNIT] if s.node_exporter else []),
        # NCCL's ephemeral ports are closed to everyone but the members: replies to this host's own
        # connections (apt, pip, the hub) land on such ports too, so they pass first
        "established": ["ct state established,related accept"] if decision.group is not None else [],
        "firewall_unit": FIREWALL_UNIT,
        "rules_file": decision.stack.layout.firewall_rules,
    }
    return {"qwen27b-firewall.nft.j2": context, "qwen27b-firewall.service.j2": context}


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)


def render(template: str, context: dict) -> str:
    return _ENV.get_template(template).render(**context)


def render_all(decision: Decision, prefix: str = "") -> dict[str, str]:
    """Template name -> rendered text."""
    return {name: render(name, ctx) for name, ctx in contexts(decision, prefix).items()}


# ------------------------------------------------------------------ serving groups (multi-node)


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


# ------------------------------------------------------------------ copies on one machine (qwen27b_instances)
INSTANCE_UNIT = INSTANCE_TEMPLATE  # one template; qwen27b@NAME.service per copy, %i its name
SERVE_ARGS_ENV = "QWEN27B_SERVE_ARGS"  # the copy's vLLM flags, split at spaces by systemd ($VAR)
URL_ENV = "QWEN27B_URL"  # where the copy answers: its readiness check
INSTANCE_LEFT_OFF = [("RemoveIPC= is off", "it removes every IPC object of the user when one copy stops: the "
                                           "other copies run as the same user")]


def instance_unit(name: str) -> str:
    return f"qwen27b@{name}.service"


def instance_files(paths: dict, name: str) -> dict[str, str]:
    """A copy's own files: its env file (GPUs, flags, URL) and its API key's 0600 env file."""
    at = HostLayout.of(paths)
    return {"env_file": at.instance_env_file(name), "secrets_file": at.instance_api_key_env_file(name)}


def instance_contexts(decision: Decision, prefix: str = "") -> dict[str, dict]:
    """The templated unit (the same for every copy: rendered from the first) and each copy's env file,
    keyed 'qwen27b@.service.j2' and 'NAME.env'. The unit is qwen27b.service.j2 with the copy's files
    named by %i, its flags and URL from its env file, and RemoveIPC= off (INSTANCE_LEFT_OFF)."""
    (_, first), paths = decision.copies[0], decision.stack.paths
    unit = dict(contexts(first, prefix)["qwen27b.service.j2"])
    unit.update({key: prefix + value for key, value in instance_files(paths, "%i").items()})
    unit["served_name"] = f"copy %i of {unit['served_name']}"
    unit["exec_start"] = [unit["exec_start"][0], f"${SERVE_ARGS_ENV}"]
    # the URL from the copy's env file (systemd expands ${VAR} as one word); the model from /v1/models
    url = f"${{{URL_ENV}}}"
    unit["ready_check"] = " ".join(arg if arg == url else systemd_quote(arg)
                                   for arg in warmup_argv(first, layout(first, prefix), url, None))
    unit["hardening"] = [line for line in unit["hardening"] if line[0] != "RemoveIPC"]
    unit["left_off"] = unit["left_off"] + [f"{what}: {why}" for what, why in INSTANCE_LEFT_OFF]
    out = {"qwen27b@.service.j2": unit}
    for instance, copy in decision.copies:
        where = {**layout(copy, prefix), **{k: prefix + v for k, v in instance_files(paths, instance.name).items()}}
        serve = copy.serve
        env = sorted(service_env(copy, where) + [
            (SERVE_ARGS_ENV, env_value(" ".join(serve.argv()))),
            (URL_ENV, env_value(http_base(serve.value('--host'), serve.value('--port'))))])
        out[f"{instance.name}.env"] = {"env": env, "secrets_file": where["secrets_file"]}
    return out


def copy_health_units(name: str) -> tuple[str, str]:
    """A copy's health check and its timer: qwen27b-health@NAME.service/.timer, each its own unit file
    (systemd prefers an instance's own file to a template; each copy's check differs in URL, key,
    GPUs and files, so there is no shared template to fill from %i)."""
    return f"qwen27b-health@{name}.service", f"qwen27b-health@{name}.timer"


def copy_health_files(paths: dict, name: str) -> dict[str, str]:
    """A copy's health status file and the restart request its check leaves for the unit's root
    ExecStopPost (the one-service host's: health.json, health-restart.request)."""
    at = HostLayout.of(paths)
    return {"health_status": at.copy_health_status(name), "restart_request": at.copy_restart_request(name)}


def instance_health_contexts(decision: Decision, prefix: str = "") -> dict[str, dict]:
    """Each copy's health unit and timer context (qwen27b-health.*.j2), keyed by copy name: the check
    of qwen27b@NAME.service at the copy's URL with its key, reading only its GPUs (GPUS_ENV) and
    writing its own status file, restart request and metrics file labelled copy=NAME (COPY_ENV)."""
    out, paths = {}, decision.stack.paths
    for instance, copy in decision.copies:
        where = {**layout(copy, prefix), **{k: prefix + v for k, v in instance_files(paths, instance.name).items()},
                 **{k: prefix + v for k, v in copy_health_files(paths, instance.name).items()}}
        serve, model = copy.serve, decision.stack.model
        env = [(COPY_ENV, instance.name)] + ([(GPUS_ENV, ",".join(str(g.index) for g in serving_gpus(copy)))]
                                             if copy.gpus else [])
        # what the copy runs at once, for /health/NAME and the gateway's fair share (digits only)
        env += [(SLOTS_ENV, seqs) for seqs in [serve.value("--max-num-seqs")] if seqs and seqs.isdigit()]
        health = health_context(copy, where, instance_unit(instance.name), copy_health_units(instance.name)[0],
                                http_base(serve.value("--host"), serve.value("--port")),
                                serve.value("--served-model-name"), unit_text(f"{model['id']}@{model['revision']}"),
                                tuple(env))
        out[instance.name] = health
    return out


def instance_endpoint_context(decision: Decision, prefix: str = "") -> dict:
    """The health endpoint of a host serving copies: one socket on qwen27b_health_port at the copies'
    address, answering each copy on /health/NAME from its status file (COPIES_ENV: the names,
    allow-listed by copykeys.INSTANCE_NAME)."""
    _, first = decision.copies[0]
    endpoint = endpoint_context(first, layout(first, prefix), first.serve.value("--host"))
    endpoint["environment"] = [(COPIES_ENV, ",".join(i.name for i, _ in decision.copies))]
    # never a key: each copy's key file is out of its reach too, as the host's is
    endpoint["hardening"] = endpoint["hardening"] + [
        ("InaccessiblePaths", f"-{prefix}{instance_files(decision.stack.paths, i.name)['secrets_file']}")
        for i, _ in decision.copies]
    return endpoint


def render_instances(decision: Decision, prefix: str = "") -> dict[str, str]:
    """'qwen27b@.service', 'NAME.env', 'qwen27b-health@NAME.service' and '.timer', the health endpoint's
    socket and service -> rendered text (the unit from qwen27b.service.j2, each copy's health units
    from qwen27b-health.*.j2, the endpoint from qwen27b-health-http*.j2)."""
    ctx = instance_contexts(decision, prefix)
    out = {INSTANCE_UNIT: render("qwen27b.service.j2", ctx.pop("qwen27b@.service.j2"))}
    out.update({name: render("qwen27b.env.j2", c) for name, c in ctx.items()})
    for name, health in instance_health_contexts(decision, prefix).items():
        unit, timer = copy_health_units(name)
        out[unit] = render("qwen27b-health.service.j2", health)
        out[timer] = render("qwen27b-health.timer.j2", health)
    endpoint = instance_endpoint_context(decision, prefix)
    out[HEALTH_HTTP_SOCKET] = render("qwen27b-health-http.socket.j2", endpoint)
    out[HEALTH_HTTP_SERVICE] = render("qwen27b-health-http@.service.j2", endpoint)
    return out


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
