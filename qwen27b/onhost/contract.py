"""What host code and controller code both rely on, defined once: the nagios codes of the health
status, the fatal Xids, systemd's unit properties and the restart-loop rule, the environment and
file names the units set, and how this package is installed on a host. Standard library only."""

from __future__ import annotations

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3


LEVELS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}


INFO = -1  # a note that does not change the verdict (watchdog decisions)


# Xids whose GPU cannot serve until it is reset or the host rebooted; others are warnings.
XID_FATAL = {48, 79, 95}


XID_ADVICE = {
    13: "graphics engine exception, usually a kernel/app bug: read the vLLM log around that time",
    31: "GPU memory page fault, usually an app bug: read the vLLM log; if it repeats, update the driver",
    43: "GPU stopped processing (app fault): read the vLLM log",
    45: "preemptive cleanup after a killed process: harmless alone, look for the Xid before it",
    48: "double-bit ECC error: drain the host and reboot; if it repeats, replace the card",
    61: "GPU microcontroller error: reboot at the next window; update the driver if it repeats",
    62: "GPU microcontroller halt: reboot at the next window; update the driver if it repeats",
    63: "ECC page retirement / row remap recorded: reboot at the next window to apply it",
    64: "ECC page retirement / row remap failed: drain the host, reboot, replace the card if it repeats",
    74: "NVLink error: reseat the NVLink bridge, check `nvidia-smi nvlink -e`",
    79: "GPU has fallen off the bus: reboot; check PCIe seating, riser, PSU and Above-4G decoding",
    92: "high single-bit ECC rate: plan a reboot and watch for Xid 48/63",
    94: "contained ECC error: the app was stopped; restart it and reboot at the next window",
    95: "uncontained ECC error: drain the host and reboot (GPU reset required)",
}


# A GPU fault a restart of the service cannot fix (issue 27): the health finding's "kind", its verdict's
# "needs" and the qwen27b_health_needs gauge say which; the watchdog does not restart on either.
NEEDS_REBOOT_FINDING = "needs_reboot"  # pending page retirement, uncorrected ECC: a reboot or a GPU reset fixes it
NEEDS_HUMAN_FINDING = "needs_human"  # fallen off the bus, unreadable: power, seating, slot, the card itself
NEEDS = {NEEDS_REBOOT_FINDING: "reboot", NEEDS_HUMAN_FINDING: "human"}
XID_NEEDS = {48: NEEDS_REBOOT_FINDING, 95: NEEDS_REBOOT_FINDING, 79: NEEDS_HUMAN_FINDING}


def xid_meaning(xid: int) -> str:
    """What an Xid is, in a few words (XID_ADVICE's sentence up to its first colon)."""
    advice = XID_ADVICE.get(xid)
    return advice.split(":", 1)[0] if advice else "see NVIDIA's Xid catalog"


# The systemd units qwen27b installs, named once: the controller renders, starts, reads and removes
# them by these names (controller/render.py, gateway_render.py, plan/lifecycle.py, the tools).
SERVICE_UNIT = "qwen27b.service"
INSTANCE_TEMPLATE = "qwen27b@.service"  # the copies of qwen27b_instances: qwen27b@NAME.service
HEALTH_UNIT = "qwen27b-health.service"
HEALTH_TIMER = "qwen27b-health.timer"
HEALTH_HTTP_SOCKET = "qwen27b-health-http.socket"  # the health endpoint: systemd listens, one process a request
HEALTH_HTTP_TEMPLATE = "qwen27b-health-http@.service"
RAY_UNIT = "qwen27b-ray.service"
SEED_UNIT = "qwen27b-seed.service"
FIREWALL_UNIT = "qwen27b-firewall.service"
GATEWAY_UNIT = "qwen27b-gateway.service"
POOL_UNIT = "qwen27b-gateway-pool.service"


def http_base(address: str, port: int) -> str:
    """http://ADDRESS:PORT for a re-printed address: IPv6 in brackets, its zone id as %25 (RFC 6874).
    The one URL builder: the unit's probe, health --url, the release record, copies, fan-out, the seed's
    start-up line (plan.hostdata re-exports it for the controller)."""
    return f"http://[{address.replace('%', '%25')}]:{port}" if ":" in address else f"http://{address}:{port}"


UNIT_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "StartLimitBurst", "MainPID")


FAILED_RESULTS = ("exit-code", "signal", "core-dump", "timeout", "start-limit-hit", "watchdog", "oom-kill")


# systemd's Result values that mean the process itself failed, and the restart-loop rule read from
# systemd's own counters: (kind, restarts). The health check's finding, its crash-loop metric and the
# deploy's verify all judge by this one rule (verify matches the finding's "kind", not its sentence).
START_LIMIT, CRASH_LOOP, EXITED = "start_limit", "crash_loop", "exited"
LOOPING = (START_LIMIT, CRASH_LOOP)
RESTART_LOOP_FINDING = "restart_loop"
RESTARTING = ("auto-restart", "start-pre", "start", "start-post")  # SubStates of a unit on its way back up  # a finding's "kind" when it holds the restart-loop sentence


def restart_state(props: dict) -> tuple[str, int] | None:
    """(kind, automatic restarts) of a unit whose process keeps exiting; None when systemd does not say so."""
    result, sub = props.get("Result", ""), props.get("SubState", "")
    try:
        restarts = int(props.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    if result in FAILED_RESULTS and sub in ("auto-restart", "failed", "start", "start-post", "dead"):
        if result == "start-limit-hit":
            return START_LIMIT, restarts
        return (CRASH_LOOP if restarts >= 2 else EXITED), restarts
    # systemd resets Result to "success" at every start, automatic restarts included: while a
    # restarted unit is starting again only NRestarts (reset by a manual start alone) remembers
    if restarts >= 2 and sub in RESTARTING:
        return CRASH_LOOP, restarts
    return None


def crash_loop(props: dict | None) -> bool:
    """systemd keeps restarting the unit, or gave up on it (a start-up failure, not a fluke)."""
    state = restart_state(props or {})
    return state is not None and state[0] in LOOPING


def restart_loop(props: dict, unit: str) -> str | None:
    """The sentence for restart_state (what to do included); None when systemd does not say so."""
    state = restart_state(props)
    if state is None:
        return None
    kind, restarts = state
    result = props.get("Result", "")
    advice = (f"a start-up failure (bad flag, model or memory), not an outage to wait out: read "
              f"`journalctl -u {unit}` or run `qwen27b doctor`.")
    if kind == START_LIMIT:
        return (f"{unit} is not serving: systemd gave up on it, start limit hit after {restarts} automatic "
                f"restart(s) (StartLimitBurst={props.get('StartLimitBurst', '?')}); {advice}")
    if kind == CRASH_LOOP and result not in FAILED_RESULTS:
        return (f"{unit} is not serving: crash loop, systemd restarted it {restarts} times and it is "
                f"starting again; {advice}")
    if kind == CRASH_LOOP:
        return (f"{unit} is not serving: crash loop, its process exited (Result={result}) and systemd "
                f"restarted it {restarts} times; {advice}")
    return (f"{unit} is not serving: its process exited (Result={result}); systemd restarts it "
            f"({restarts} restart(s) so far): read `journalctl -u {unit}` if it does not come back.")


RESTART_REQUEST_ENV = "QWEN27B_HEALTH_RESTART_REQUEST"


# Debian's prometheus-node-exporter reads *.prom here (its --collector.textfile.directory).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"


TEXTFILE_NAME = "qwen27b.prom"
# A copy of qwen27b_instances: its health check reads only its GPUs and writes qwen27b@NAME.prom with
# a `copy` label on every series (from the environment, for the reason RESTART_REQUEST_ENV is).
COPY_ENV, GPUS_ENV = "QWEN27B_HEALTH_COPY", "QWEN27B_HEALTH_GPUS"
# the health endpoint of a host serving copies: their names, each answered on /health/NAME
COPIES_ENV = "QWEN27B_HEALTH_COPIES"


def textfile_name(copy: str | None) -> str:
    """The textfile of one health check: qwen27b.prom, or qwen27b@NAME.prom for a copy (one file each:
    node_exporter reads every *.prom, and two checks writing one file would each erase the other)."""
    return f"qwen27b@{copy}.prom" if copy else TEXTFILE_NAME


QUIET_ENV, TEXTFILE_DIR_ENV, MODEL_REF_ENV = "QWEN27B_HEALTH_QUIET", "QWEN27B_HEALTH_TEXTFILE_DIR", "QWEN27B_MODEL_REF"
SPECULATIVE_ENV = "QWEN27B_SPECULATIVE"  # the speculative method in use, "mtp:7" / "dflash2:7" / "off" (qwen27b_build_info)
SLOTS_ENV = "QWEN27B_SLOTS"  # a copy's --max-num-seqs: /health says it, the gateway's fair share sums it
# the one service's: read from its release record at each check (a rollback restores the record, not
# the health unit: a per-release value in the unit would outlive the release it was rendered for)
RELEASE_RECORD_ENV = "QWEN27B_RELEASE_RECORD"
# the engine's forward-progress bounds (stack file `liveness`), from the environment for the reason above
STALL_AFTER_ENV, IDLE_PROBE_EVERY_ENV, IDLE_PROBE_DEADLINE_ENV = (
    "QWEN27B_STALL_AFTER_S", "QWEN27B_IDLE_PROBE_EVERY_S", "QWEN27B_IDLE_PROBE_DEADLINE_S")
ENGINE_STALLED_FINDING = "engine_stalled"  # a finding's kind: /health answers, the engine generates nothing


# How the package is installed on a host: once per release venv, under this name, outside
# site-packages (nothing in the venv can shadow it or be shadowed by it).
PACKAGE = "qwen27b_onhost"
MIDDLEWARE = f"{PACKAGE}.route_auth.RequireKey"  # vLLM's --middleware takes module.attribute


def lib_dir(venv: str) -> str:
    """The directory holding the package; on PYTHONPATH of the units and the tools run from it."""
    return f"{venv}/lib"


def module_argv(venv: str, module: str) -> list[str]:
    """`python -m qwen27b_onhost.<module>` with the release venv's python (PYTHONPATH: lib_dir)."""
    return [f"{venv}/bin/python", "-m", f"{PACKAGE}.{module}"]


def module_command(venv: str, module: str) -> str:
    """module_argv as shell words, PYTHONPATH set (the paths are the stack's: plain characters)."""
    return f"PYTHONPATH={lib_dir(venv)} " + " ".join(module_argv(venv, module))


def wrapper_script(venv: str) -> str:
    """``<venv>/bin/qwen27b-health``: the health check's command, for the timer and for people."""
    return (f"#!{venv}/bin/python\n"
            f"# qwen27b health check (rendered by qwen27b); the code is {lib_dir(venv)}/{PACKAGE}/health.py\n"
            f"import sys\n"
            f"sys.path.insert(0, {lib_dir(venv)!r})\n"
            f"from {PACKAGE}.health import main\n"
            f"raise SystemExit(main())\n")
