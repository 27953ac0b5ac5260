"""The units' sandbox: the systemd lines that take away what vLLM, the health check, its endpoint and
the Ray node do not use, and the lines left off, each with its reason (rendered into the units as
comments). Cut from controller/render.py (issue 50): render, render_group and render_copies fill
the templates with these.
"""

from __future__ import annotations

from qwen27b.plan.gate import Decision

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
