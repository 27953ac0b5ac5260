"""qwen27b-health: one health check of the vLLM service, run by a systemd timer on each host.

Shipped as a single file (``<venv>/lib/qwen27b_health.py``) into the release venv, which holds
only the stdlib and the stack's host_packages (httpx, nvidia-ml-py, prometheus-client): so this
module imports nothing from qwen27b or pyinfra, and pynvml and prometheus_client only lazily
(CPU-only hosts have no NVML; a venv from before the metrics lacks prometheus_client).

One run: probe ``/health`` and ``/v1/models``, read the GPUs through NVML and new ``NVRM: Xid``
kernel lines, turn the readings into a nagios verdict (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN
when the check itself broke), persist it to a JSON status file (with the consecutive-failure
counter and the last 20 verdicts) and, after K consecutive CRITICAL runs, restart the unit,
rate-limited.  Every finding is one sentence saying what to do.  The same readings also go to
node_exporter's textfile collector as ``qwen27b_*`` gauges (:func:`metrics_registry`), written
with prometheus_client (imported lazily: a venv without it still gets the verdict).

The pure parts (:func:`verdict`, :func:`decode_throttle`, :func:`parse_xids`,
:func:`next_failures`, :func:`restart_decision`, :func:`parse_secret`) take plain values so they
are unit-tested without a server, a GPU or systemd.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
LEVELS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
INFO = -1  # a note that does not change the verdict (watchdog decisions)

HISTORY_LEN = 20
HOT_C = 85  # V100 slows down at ~87 C (nvidia-smi "GPU Slowdown Temp"); warn before it does
XID_FIRST_LOOKBACK_S = 600  # first run (no status file yet): look this far back for Xids

# NVML clocks-event ("throttle") reason bits; stable across NVML versions (nvml.h).
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# Reasons that mean cooling or power delivery is failing; idle / power cap / sync boost are normal.
THROTTLE_BAD = {"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}

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

XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+),\s*(?P<rest>.*)$")
XID_PID_RE = re.compile(r"pid=(?P<pid>'?[^,]*'?),\s*name=(?P<name>[^,]*),\s*(?P<msg>.*)$")
TS_RE = re.compile(r"^(?:\[)?(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


# ------------------------------------------------------------------------------- pure parts

def finding(level: int, text: str) -> dict:
    return {"level": "INFO" if level == INFO else LEVELS[level], "text": text}


def decode_throttle(mask: int) -> list[str]:
    """NVML clocks-event bitmask -> reason names (unknown bits kept as hex, never dropped)."""
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_BITS)
    if unknown:
        names.append(hex(unknown))
    return names


def _parse_ts(text: str) -> float | None:
    m = TS_RE.match(text)
    if not m:
        return None
    ts = m.group("ts").replace(",", ".")
    try:
        when = dt.datetime.fromisoformat(ts)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.astimezone()  # journal/dmesg without offset: local time
    return when.timestamp()


def parse_xids(text: str, since: float | None = None) -> list[dict]:
    """``NVRM: Xid`` kernel lines -> [{time, pci, xid, pid, name, message}].

    Accepts journalctl ``short-iso`` and ``dmesg --time-format=iso`` lines (and bare kernel lines).
    With ``since`` (epoch s), only lines stamped after it are kept: dmesg cannot filter by time
    itself and would repeat every Xid since boot on each run.  Lines that do not parse are
    skipped, never raised on: a strange kernel line must not break the check.
    """
    out = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if not m:
            continue
        when = _parse_ts(line)
        # strictly before: a line stamped in the same second as the last check is reported
        # twice rather than never (journal stamps have 1 s resolution)
        if since is not None and (when is None or when < int(since)):
            continue
        rest = m.group("rest").strip()
        pm = XID_PID_RE.match(rest)
        out.append({
            "time": _iso(when) if when is not None else None,
            "pci": m.group("pci"),
            "xid": int(m.group("xid")),
            "pid": pm.group("pid").strip("'") if pm else None,
            "name": pm.group("name").strip() if pm else None,
            "message": (pm.group("msg") if pm else rest).strip(),
        })
    return out


def verdict(r: dict, slow_ms: float = 1000.0, hot_c: int = HOT_C) -> tuple[int, list[dict]]:
    """Readings -> (nagios code, findings).  ``r`` holds what :func:`collect` measured:

    url, unit, served_name, key_error, health {status, latency_ms, error},
    models {status, ids, error}, gpu (list or None), xids (list or None).
    """
    f: list[tuple[int, str]] = []
    url, unit = r.get("url", "the server"), r.get("unit", "the unit")
    h = r.get("health") or {}
    if h.get("error"):
        f.append((CRITICAL, f"/health unreachable ({h['error']}): vLLM is down or not listening on {url}; "
                            f"check `systemctl status {unit}` and `journalctl -u {unit}`."))
    elif h.get("status") == 503:
        f.append((CRITICAL, f"/health returned 503: the vLLM engine died; read `journalctl -u {unit}` "
                            f"for the cause and restart {unit} (the watchdog does after K failures)."))
    elif h.get("status") != 200:
        f.append((CRITICAL, f"/health returned {h.get('status')}: something else answers on {url}; "
                            f"check the port and `systemctl status {unit}`."))
    elif h.get("latency_ms") is not None and h["latency_ms"] > slow_ms:
        f.append((WARNING, f"/health took {h['latency_ms']:.0f} ms (> {slow_ms:.0f} ms): the host is "
                           f"overloaded or swapping; check load, memory and vllm:num_requests_waiting."))

    if r.get("key_error"):
        f.append((CRITICAL, f"cannot use the API key file ({r['key_error']}); if it is "
                            f"a permission error, run the check as root or fix the file's owner/mode."))
    m = r.get("models") or {}
    if m.get("error"):
        if not h.get("error"):  # one sentence for one outage
            f.append((CRITICAL, f"/v1/models unreachable ({m['error']}): the API server is not answering; "
                                f"check `journalctl -u {unit}`."))
    elif m.get("status") == 401:
        f.append((CRITICAL, "/v1/models returned 401: the API key does not match the server's VLLM_API_KEY; "
                            "point --api-key-file at the service's key file."))
    elif m.get("status") != 200:
        f.append((CRITICAL, f"/v1/models returned {m.get('status')}: the OpenAI API is not serving; "
                            f"check `journalctl -u {unit}`."))
    elif r.get("served_name") and r["served_name"] not in (m.get("ids") or []):
        f.append((CRITICAL, f"served model {r['served_name']!r} is not listed by /v1/models "
                            f"(it lists {', '.join(m.get('ids') or []) or 'nothing'}): clients asking for it "
                            f"get 404; fix --served-model-name in {unit} or --served-name here."))

    for g in r.get("gpu") or []:
        i = g.get("index")
        if g.get("error"):
            f.append((CRITICAL, f"GPU {i} unreadable via NVML ({g['error']}): check `nvidia-smi` and the "
                                f"kernel log for Xid 79; reboot the host."))
            continue
        if (g.get("ecc_uncorrected") or 0) > 0:
            f.append((CRITICAL, f"GPU {i} has {g['ecc_uncorrected']} uncorrected ECC errors since driver load: "
                                f"drain the host and reboot; replace the card if it repeats."))
        if g.get("retired_pages_pending"):
            f.append((WARNING, f"GPU {i} has retired pages pending: reboot (or reset the GPU) at the next "
                               f"window so they are retired."))
        if g.get("temperature_c") is not None and g["temperature_c"] >= hot_c:
            f.append((WARNING, f"GPU {i} at {g['temperature_c']} C (>= {hot_c} C): check fans and airflow "
                               f"before it slows down."))
        bad = [n for n in (g.get("throttle") or {}).get("reasons", []) if n in THROTTLE_BAD]
        if bad:
            f.append((WARNING, f"GPU {i} slowed down by {', '.join(bad)}: a cooling or power-delivery problem; "
                               f"check fans, PSU cables and `nvidia-smi -q -d PERFORMANCE`."))

    for x in r.get("xids") or []:
        level = CRITICAL if x["xid"] in XID_FATAL else WARNING
        advice = XID_ADVICE.get(x["xid"], "look it up in NVIDIA's Xid catalog and read the kernel log")
        f.append((level, f"Xid {x['xid']} on {x['pci']} at {x['time'] or 'unknown time'}: {advice}."))

    code = max([lvl for lvl, _ in f], default=OK)
    return code, [finding(lvl, text) for lvl, text in f]


def next_failures(previous: int, code: int) -> int:
    """Consecutive CRITICAL runs.  Any non-CRITICAL run ends the streak: WARNING means the
    endpoint answered (only GPU health or slowness is off), so there is nothing to restart."""
    return previous + 1 if code == CRITICAL else 0


def restart_decision(*, code: int, failures: int, restart_after: int, last_restart: float | None,
                     now: float, min_interval_s: float, unit_state: str | None,
                     enabled: bool, unit: str) -> tuple[str, str]:
    """-> (action, reason) with action "none", "skip" or "restart".

    Skips, each with its reason: --no-restart; the unit is still "activating" (a 27B model takes
    minutes to load and a restart would only start the wait again); the last restart was less
    than ``min_interval_s`` ago (a crash loop must not become a restart storm).
    """
    if code != CRITICAL or failures < restart_after:
        return "none", ""
    why = f"{failures} consecutive CRITICAL runs (restart after {restart_after})"
    if not enabled:
        return "skip", f"{why}: would restart {unit}, but --no-restart is set."
    if unit_state == "activating":
        return "skip", f"{why}: {unit} is still starting (activating); not restarting it, wait for the model to load."
    if last_restart is not None and now - last_restart < min_interval_s:
        return "skip", (f"{why}: {unit} was restarted {now - last_restart:.0f} s ago "
                        f"(< {min_interval_s:.0f} s); not again yet, read `journalctl -u {unit}`.")
    return "restart", f"{why}: restarting {unit}."


# The one key-file format (deploy, qwen27b-health, bench and doctor all read it with load_secret):
# one line, either the bare key or NAME=key (VLLM_API_KEY for the API key, HF_TOKEN for a hub token),
# the key made of RFC 6750 bearer-token characters. Anything else is refused, never guessed: an empty
# key leaves the API open, a second line would add a variable to the service's environment.
SECRET_CHARS = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class SecretFileError(ValueError):
    """A key file that cannot be used; problem and fix never contain the file's contents."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}. Fix: {fix}")


def parse_secret(text: str, name: str = "VLLM_API_KEY") -> str:
    """The key in a key file's text: one line, ``KEY`` or ``NAME=KEY`` -> KEY; else SecretFileError."""
    fix = f"write one line: the bare key or {name}=KEY (e.g. `openssl rand -hex 32 > FILE`)"
    body = text.strip()
    if not body:
        raise SecretFileError("is empty (an empty key would leave the API open)", fix)
    if "\n" in body or "\r" in body:
        raise SecretFileError(f"has {len(body.splitlines())} lines; only one is read", fix)
    assignment = _ASSIGNMENT.match(body)
    if assignment and assignment.group(1) == name:
        body = assignment.group(2).strip()
        if not body:
            raise SecretFileError(f"has an empty {name}= (an empty key would leave the API open)", fix)
    elif assignment and not SECRET_CHARS.match(body):  # base64 padding ("abc==") is a key, not NAME=
        raise SecretFileError(f"sets {assignment.group(1)}, not {name}", fix)
    if not SECRET_CHARS.match(body):
        raise SecretFileError("the key holds characters other than A-Z a-z 0-9 . _ ~ + / - (and trailing =): "
                              "spaces, quotes or non-ASCII", fix)
    return body


def load_secret(path: str, name: str = "VLLM_API_KEY") -> str:
    """parse_secret of the file at path; an unreadable file (missing, a directory, not UTF-8) is a
    SecretFileError too."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            raw = fh.read(65536)
    except OSError as error:
        raise SecretFileError(f"cannot read {path}: {error.strerror}", "create it (chmod 600) or fix the path") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise SecretFileError("holds non-ASCII bytes", f"write one line: the bare key or {name}=KEY") from None
    return parse_secret(text, name)


def push_history(history: list | None, when: str, code: int) -> list[dict]:
    entry = {"time": when, "code": code, "verdict": LEVELS[code]}
    return (list(history or []) + [entry])[-HISTORY_LEN:]


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")


def _epoch(iso: str | None) -> float | None:
    try:
        return dt.datetime.fromisoformat(iso).timestamp() if iso else None
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------- readings

def probe(url: str, key: str | None, timeout: float) -> tuple[dict, dict]:
    """GET /health (open) and /v1/models (guarded by --api-key) -> (health, models).

    Errors are recorded as the exception's class and text; httpx's messages name the URL but
    never the request headers, so the key cannot leak through them.
    """
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    health: dict = {"status": None, "latency_ms": None, "error": None}
    models: dict = {"status": None, "ids": None, "error": None}
    with httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False) as client:
        t0 = time.monotonic()
        try:
            resp = client.get(f"{base}/health")
            health["status"] = resp.status_code
            health["latency_ms"] = round((time.monotonic() - t0) * 1000, 1)
        except httpx.HTTPError as e:
            health["error"] = f"{type(e).__name__}: {e}"
        try:
            resp = client.get(f"{base}/v1/models", headers=headers)
            models["status"] = resp.status_code
            if resp.status_code == 200:
                models["ids"] = [m.get("id") for m in resp.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            models["error"] = f"{type(e).__name__}: {e}"
    return health, models


def read_gpus(nvml=None) -> tuple[list[dict] | None, str | None]:
    """Per-GPU NVML readings -> (gpus, why_none).  No pynvml or no driver: (None, reason) - a
    CPU-only host is not an error.  Fields NVML reports "Not Supported" are None; a GPU that
    fails otherwise (e.g. "GPU is lost") gets an ``error`` and a CRITICAL finding."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "pynvml not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return None, str(e)

    def opt(fn, *args):
        try:
            return fn(*args)
        except nvml.NVMLError_NotSupported:
            return None

    throttle_fn = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    gpus = []
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(h)
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                pci = opt(nvml.nvmlDeviceGetPciInfo, h)
                mask = opt(throttle_fn, h)
                pending = opt(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
                retired = opt(_retired_pages, nvml, h)
                gpus.append({
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "pci": (pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId) if pci else None,
                    "memory_used_mib": mem.used // 2**20,
                    "memory_total_mib": mem.total // 2**20,
                    "temperature_c": opt(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                    "ecc_uncorrected": opt(nvml.nvmlDeviceGetTotalEccErrors, h,
                                           nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
                    "retired_pages_pending": None if pending is None else bool(pending),
                    "retired_pages": retired,
                    "throttle": None if mask is None else {"mask": hex(mask), "reasons": decode_throttle(mask)},
                })
            except nvml.NVMLError as e:
                gpus.append({"index": i, "error": str(e)})
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return gpus, None


def _retired_pages(nvml, h) -> int:
    """Pages retired for ECC (single-bit storms and double-bit errors); Volta retires pages,
    Ampere+ remaps rows instead and answers Not Supported (None)."""
    return sum(len(nvml.nvmlDeviceGetRetiredPages(h, cause)) for cause in (
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))


def read_kernel_log(since: float) -> tuple[str | None, str | None]:
    """Kernel lines since ``since`` -> (text, source).  journalctl filters by time itself;
    dmesg (hosts without a persistent journal) returns the whole ring buffer, filtered later.
    Neither present or both failing: (None, None), i.e. "unknown", not a finding."""
    if shutil.which("journalctl"):
        cmd = ["journalctl", "_TRANSPORT=kernel", "-o", "short-iso", "--no-pager", "-q",
               f"--since=@{int(since)}"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, errors="replace")
            if p.returncode == 0:
                return p.stdout, "journalctl"
        except (OSError, subprocess.SubprocessError):
            pass
    if shutil.which("dmesg"):
        try:
            p = subprocess.run(["dmesg", "--time-format=iso"], capture_output=True, text=True,
                               timeout=20, errors="replace")
            if p.returncode == 0:
                return p.stdout, "dmesg"
        except (OSError, subprocess.SubprocessError):
            pass
    return None, None


def read_xids(since: float) -> tuple[list[dict] | None, str | None]:
    text, source = read_kernel_log(since)
    if text is None:
        return None, None
    try:
        return parse_xids(text, since=since), source
    except Exception:  # noqa: BLE001 - a parse bug must not take the check down
        return None, source


UNIT_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "StartLimitBurst")
FAILED_RESULTS = ("exit-code", "signal", "core-dump", "timeout", "start-limit-hit", "watchdog", "oom-kill")


def unit_properties(unit: str) -> dict:
    """systemd's view of the unit (Key=Value from `systemctl show`); {} when unknown."""
    try:
        p = subprocess.run(["systemctl", "show", *[a for k in UNIT_PROPERTIES for a in ("-p", k)], unit],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line) if p.returncode == 0 else {}


def restart_loop(props: dict, unit: str) -> str | None:
    """The sentence for a unit whose process keeps exiting, from systemd's own counters; None when
    systemd does not say so. The deploy's verify quotes this same sentence in its report."""
    result, sub = props.get("Result", ""), props.get("SubState", "")
    try:
        restarts = int(props.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    if result not in FAILED_RESULTS or sub not in ("auto-restart", "failed", "start", "start-post", "dead"):
        return None
    advice = (f"a start-up failure (bad flag, model or memory), not an outage to wait out: read "
              f"`journalctl -u {unit}` or run `qwen27b doctor`.")
    if result == "start-limit-hit":
        return (f"{unit} is not serving: systemd gave up on it, start limit hit after {restarts} automatic "
                f"restart(s) (StartLimitBurst={props.get('StartLimitBurst', '?')}); {advice}")
    if restarts >= 2:
        return (f"{unit} is not serving: crash loop, its process exited (Result={result}) and systemd "
                f"restarted it {restarts} times; {advice}")
    return (f"{unit} is not serving: its process exited (Result={result}); systemd restarts it "
            f"({restarts} restart(s) so far): read `journalctl -u {unit}` if it does not come back.")


def restart_unit(unit: str) -> tuple[bool, str]:
    """``systemctl restart --no-block``: queue the job and return; the check never waits for a
    model load (the timer's TimeoutStartSec is far shorter)."""
    try:
        p = subprocess.run(["systemctl", "restart", "--no-block", unit],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"{type(e).__name__}: {e}"
    return p.returncode == 0, (p.stderr or p.stdout).strip()[-300:]


RESTART_REQUEST_ENV = "QWEN27B_HEALTH_RESTART_REQUEST"


def request_restart(path: str, unit: str, reason: str) -> tuple[bool, str]:
    """The unprivileged route: leave the request in ``path`` for the health unit's root
    ExecStopPost (``+``: runs as root once this check has exited), which removes it and restarts
    the unit. The check itself then needs no privilege, polkit rule or capability."""
    try:
        write_text_atomic(path, reason + "\n")
    except OSError as e:
        return False, f"cannot write the restart request {path}: {e.strerror}"
    return True, f"requested in {path}; the health unit's ExecStopPost restarts {unit} as root"


# ------------------------------------------------------------------------------- status file

def _valid_status(data) -> str | None:
    """Why a previous status cannot be trusted as the watchdog's memory (None: it can). Only the
    fields a run reads back are checked: the counter, the times and the history."""
    if not isinstance(data, dict):
        return f"holds a JSON {type(data).__name__}, not an object"
    failures = data.get("consecutive_failures", 0)
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
        return f"consecutive_failures is {failures!r}, not a count"
    if data.get("time") is not None and _epoch(data["time"]) is None:
        return f"time is {data['time']!r}, not an ISO timestamp"
    last = data.get("last_restart")
    if last is not None and not (isinstance(last, dict) and (last.get("time") is None or _epoch(last["time"]))):
        return "last_restart is not {time, reason, ok}"
    history = data.get("history")
    if history is not None and not (isinstance(history, list) and all(
            isinstance(h, dict) and h.get("code") in LEVELS and not isinstance(h.get("code"), bool)
            for h in history)):
        return "history is not a list of {time, code, verdict}"
    return None


def read_previous(path: str | None) -> tuple[dict, str | None]:
    """The previous run's status and, when it was there but unusable (torn by a power cut, edited
    by hand, written by something else), why: the run then starts fresh (counter 0) and says so
    once - its own status replaces the bad file. A bad file must never make every run fail,
    which would disable the watchdog for good."""
    if not path or not os.path.exists(path):
        return {}, None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}, f"cannot be read as JSON ({type(error).__name__})"
    problem = _valid_status(data)
    return ({}, problem) if problem else (data, None)


def load_status(path: str | None) -> dict:
    """The previous run's status; missing, unreadable or malformed means a first run (counter 0)."""
    return read_previous(path)[0]


def write_status(path: str, status: dict) -> None:
    """Atomic: a temp file in the same directory, fsync, rename - readers never see half a file."""
    write_text_atomic(path, json.dumps(status, indent=2) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".health-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ------------------------------------------------------------------------------- Prometheus metrics

# Debian's prometheus-node-exporter reads *.prom here (its --collector.textfile.directory).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE_NAME = "qwen27b.prom"
QUIET_ENV, TEXTFILE_DIR_ENV, MODEL_REF_ENV = "QWEN27B_HEALTH_QUIET", "QWEN27B_HEALTH_TEXTFILE_DIR", "QWEN27B_MODEL_REF"


def accumulate_xids(previous: dict | None, xids: list[dict] | None) -> dict[str, int]:
    """Xid counts since the status file began, by Xid number (str keys: JSON).  A counter, not a
    per-run gauge: a 30 s gauge is missed by a 60 s scrape, a counter's increase() is not.  Every
    known Xid starts at 0 so that the first one is an increase, not a new series at 1."""
    counts = {str(x): 0 for x in sorted(set(XID_ADVICE) | XID_FATAL)}
    counts.update({str(k): int(v) for k, v in (previous or {}).items() if str(k).isdigit()})
    for x in xids or []:
        counts[str(x["xid"])] = counts.get(str(x["xid"]), 0) + 1
    return counts


def crash_loop(props: dict | None) -> bool:
    """systemd says the unit keeps dying: the restart-loop sentence's crash-loop and start-limit cases."""
    sentence = restart_loop(props or {}, "unit")
    return bool(sentence) and ("crash loop" in sentence or "start limit hit" in sentence)


class _Fixed:
    """A collector that yields metric families built beforehand."""

    def __init__(self, *families):
        self.families = families

    def collect(self):
        return iter(self.families)


def metrics_registry(s: dict, *, release: str | None, model_ref: str | None, systemd: dict | None = None):
    """A status dict (what :func:`check` returns, plus ``xid_counts``) -> a prometheus_client
    CollectorRegistry of ``qwen27b_*`` gauges.  Readings NVML calls Not Supported are left out
    rather than written as 0: an absent series is "unknown", a 0 would claim a healthy reading."""
    from prometheus_client import CollectorRegistry, Gauge, Info
    from prometheus_client.core import CounterMetricFamily

    reg = CollectorRegistry()

    def gauge(name, doc, labels=()):
        return Gauge(name, doc, labels, registry=reg)

    gauge("qwen27b_health_verdict", "Health check verdict as its nagios code: 0 OK, 1 WARNING, 2 CRITICAL, "
          "3 UNKNOWN").set(s["code"])
    state = gauge("qwen27b_health_state", "1 for the health check's current verdict, 0 for the others", ["state"])
    for code, name in LEVELS.items():
        state.labels(name).set(1 if code == s["code"] else 0)
    epoch = _epoch(s.get("time"))
    if epoch is not None:
        gauge("qwen27b_health_last_run_timestamp_seconds", "When the health check last ran (Unix time)").set(epoch)
    gauge("qwen27b_health_consecutive_failures", "Consecutive CRITICAL health checks").set(s["consecutive_failures"])
    gauge("qwen27b_health_restart_after", "The watchdog restarts the unit after this many consecutive "
          "CRITICAL checks").set(s["restart_after"])
    last = _epoch((s.get("last_restart") or {}).get("time"))
    if last is not None:
        gauge("qwen27b_health_last_restart_timestamp_seconds", "When the health watchdog last restarted the "
              "unit (Unix time)").set(last)
    gauge("qwen27b_service_up", "1 when vLLM's /health answered 200").set(1 if s.get("health_status") == 200 else 0)
    if s.get("latency_ms") is not None:
        gauge("qwen27b_health_latency_seconds", "Time /health took to answer").set(s["latency_ms"] / 1000)
    systemd = systemd if systemd is not None else s.get("systemd")
    if systemd and str(systemd.get("NRestarts", "")).isdigit():
        gauge("qwen27b_service_systemd_restarts", "systemd's automatic restarts of the unit (NRestarts) since "
              "it was last started by hand").set(int(systemd["NRestarts"]))
    if systemd:
        gauge("qwen27b_service_crash_loop", "1 when systemd keeps restarting the unit (crash loop or start "
              "limit hit)").set(1 if crash_loop(systemd) else 0)

    if s.get("gpu") is not None:
        info = gauge("qwen27b_gpu_info", "A GPU the health check read through NVML (always 1)", ["gpu", "pci", "name"])
        up = gauge("qwen27b_gpu_up", "1 when NVML could read the GPU", ["gpu"])
        used = gauge("qwen27b_gpu_memory_used_bytes", "GPU memory in use", ["gpu"])
        total = gauge("qwen27b_gpu_memory_total_bytes", "GPU memory in all", ["gpu"])
        temp = gauge("qwen27b_gpu_temperature_celsius", "GPU core temperature", ["gpu"])
        ecc = gauge("qwen27b_gpu_ecc_uncorrected_errors", "Uncorrected (volatile) ECC errors since the driver "
                    "loaded", ["gpu"])
        retired = gauge("qwen27b_gpu_retired_pages", "Memory pages retired for ECC errors", ["gpu"])
        pending = gauge("qwen27b_gpu_retired_pages_pending", "1 when retired pages wait for a reboot/reset", ["gpu"])
        throttle = gauge("qwen27b_gpu_throttle_reason", "1 for each active clocks-event (throttle) reason",
                         ["gpu", "reason"])
        for g in s["gpu"]:
            i = str(g.get("index"))
            up.labels(i).set(0 if g.get("error") else 1)
            if g.get("error"):
                continue
            info.labels(i, g.get("pci") or "", g.get("name") or "").set(1)
            for metric, value in ((used, g.get("memory_used_mib")), (total, g.get("memory_total_mib"))):
                if value is not None:
                    metric.labels(i).set(value * 2**20)
            for metric, value in ((temp, g.get("temperature_c")), (ecc, g.get("ecc_uncorrected")),
                                  (retired, g.get("retired_pages")), (pending, g.get("retired_pages_pending"))):
                if value is not None:
                    metric.labels(i).set(int(value))
            if g.get("throttle") is not None:
                active = set(g["throttle"].get("reasons") or [])
                for reason in sorted(set(THROTTLE_BITS.values()) | active):
                    throttle.labels(i, reason).set(1 if reason in active else 0)

    if s.get("xids") is not None:
        gauge("qwen27b_health_xids_new", "Xid kernel lines this check found (since the previous one)").set(len(s["xids"]))
    # a counter family, not Counter(): its value comes from the status file, and Counter's
    # qwen27b_xid_created would claim the count began at this run
    xid_total = CounterMetricFamily("qwen27b_xid", "NVRM Xid kernel lines seen by the health check, by Xid",
                                    labels=["xid", "fatal"])
    for xid, n in sorted((s.get("xid_counts") or {}).items(), key=lambda kv: int(kv[0])):
        xid_total.add_metric([xid, "true" if int(xid) in XID_FATAL else "false"], n)
    reg.register(_Fixed(xid_total))

    Info("qwen27b_build", "The release venv and the model the host serves", registry=reg).info(
        {"release": release or "", "model": model_ref or "", "unit": s.get("unit") or ""})
    return reg


def write_metrics(directory: str, registry) -> str:
    """``<directory>/qwen27b.prom`` via prometheus_client's write_to_textfile (a temp file in the
    same directory, renamed over: node_exporter never reads half a file), mode 0644 whatever the
    unit's UMask, so node_exporter's own user can read it."""
    from prometheus_client import write_to_textfile

    path = os.path.join(directory, TEXTFILE_NAME)
    old = os.umask(0o022)
    try:
        write_to_textfile(path, registry)
    finally:
        os.umask(old)
    return path


def current_release() -> str:
    """The release this check runs from: <releases>/<name>/venv/bin/python -> <name>."""
    return os.path.basename(os.path.dirname(os.path.realpath(sys.prefix)))


def export_metrics(args: argparse.Namespace, status: dict) -> str | None:
    """Write the textfile; why not as one sentence (never raised: metrics must not break the check)."""
    if not args.textfile_dir:
        return None
    if not os.path.isdir(args.textfile_dir):
        if args.textfile_dir == TEXTFILE_DIR:
            return None  # no node_exporter on this host: nothing to say every 30 s
        return (f"no {args.textfile_dir}: node_exporter's textfile collector is not installed; metrics not "
                f"written (install prometheus-node-exporter or pass --textfile-dir)")
    try:
        systemd = status.get("systemd") or unit_properties(args.unit)
        write_metrics(args.textfile_dir, metrics_registry(status, release=current_release(),
                                                          model_ref=args.model_ref, systemd=systemd))
    except ImportError:
        return "prometheus_client is not in this venv: metrics not written (redeploy to install it)"
    except OSError as e:
        return f"cannot write metrics to {args.textfile_dir} ({e.strerror})"
    return None


# ------------------------------------------------------------------------------- one run

def check(args: argparse.Namespace, now: float | None = None) -> dict:
    """Probe, judge, persist, maybe restart -> the status dict (also the --json output)."""
    now = time.time() if now is None else now
    prev, bad_status = read_previous(args.status_file)

    key, key_error = None, None
    if args.api_key_file:
        try:
            key = load_secret(args.api_key_file)
        except SecretFileError as e:
            key_error = f"{args.api_key_file}: {e}"

    health, models = probe(args.url, key, args.timeout)
    gpus, gpu_note = read_gpus()
    since = _epoch(prev.get("time")) or now - XID_FIRST_LOOKBACK_S
    xids, xid_source = read_xids(since)

    readings = {"url": args.url, "unit": args.unit, "served_name": args.served_name,
                "key_error": key_error, "health": health, "models": models, "gpu": gpus, "xids": xids}
    code, findings = verdict(readings, slow_ms=args.slow_ms)
    if bad_status:
        note = (f"the previous status {args.status_file} {bad_status}: starting fresh (failure counter 0, "
                "no history); this run's status replaces it.")
        findings.append(finding(INFO, note))
        print(f"qwen27b-health: {note}", file=sys.stderr)

    failures = next_failures(int(prev.get("consecutive_failures") or 0), code)
    last_restart = prev.get("last_restart")
    systemd = unit_properties(args.unit) if code == CRITICAL else {}  # {}: no systemd or no such unit
    unit_state = systemd.get("ActiveState") or None  # unknown is never "activating"
    loop = restart_loop(systemd, args.unit) if systemd else None
    if loop:
        findings.append(finding(CRITICAL, loop))
    if unit_state == "activating":
        findings.append(finding(INFO, f"{args.unit} is still starting (activating): CRITICAL is expected "
                                      f"until the model has loaded."))
    action, reason = restart_decision(
        code=code, failures=failures, restart_after=args.restart_after,
        last_restart=_epoch((last_restart or {}).get("time")), now=now,
        min_interval_s=args.restart_min_interval_s, unit_state=unit_state,
        enabled=not args.no_restart, unit=args.unit)
    restart = {"action": action, "reason": reason} if action != "none" else None
    if action == "skip":
        findings.append(finding(INFO, reason))
    elif action == "restart":
        ok, detail = (request_restart(args.restart_request, args.unit, reason) if args.restart_request
                      else restart_unit(args.unit))
        last_restart = {"time": _iso(now), "reason": reason, "ok": ok, "detail": detail}
        restart["ok"], restart["detail"] = ok, detail
        findings.append(finding(INFO, reason if ok else f"{reason} It failed ({detail}): restart it by hand."))
    if action != "none":
        print(f"qwen27b-health: {reason}" + ("" if restart.get("ok", True) else f" failed: {restart['detail']}"),
              file=sys.stderr)

    stamp = _iso(now)
    return {
        "time": stamp,
        "url": args.url,
        "unit": args.unit,
        "verdict": LEVELS[code],
        "code": code,
        "findings": findings,
        "latency_ms": health["latency_ms"],
        "health_status": health["status"],
        "models": models["ids"],
        "served_name": args.served_name,
        "gpu": gpus,
        "gpu_note": gpu_note,
        "xids": xids,
        "xid_source": xid_source,
        "unit_state": unit_state,
        "systemd": systemd or None,  # what the restart-loop sentence was read from
        "consecutive_failures": failures,
        "restart_after": args.restart_after,
        "restart": restart,
        "last_restart": last_restart,
        "history": push_history(prev.get("history"), stamp, code),
    }


def verdict_changed(s: dict) -> bool:
    """True on a first run or when this run's verdict differs from the previous run's."""
    history = s.get("history") or []
    return len(history) < 2 or history[-2]["code"] != history[-1]["code"]


def one_line(s: dict) -> str:
    """The journal's line for a check whose verdict did not change (``--quiet``): the verdict, since
    when (as far as the history reaches), the counter, and the first finding's sentence."""
    history = s.get("history") or []
    since = s["time"]
    for h in reversed(history):
        if h["code"] != s["code"]:
            break
        since = h["time"]
    gpus = s.get("gpu")
    parts = [f"{s['verdict']} ({s['code']}) unchanged since {since}",
             f"/health {s['health_status']} in {s['latency_ms']} ms" if s.get("health_status") else "/health no answer",
             "no GPU" if gpus is None else f"{sum(1 for g in gpus if not g.get('error'))}/{len(gpus)} GPUs read",
             f"{len(s['xids'])} new Xids" if s.get("xids") is not None else "Xids unknown"]
    if s["code"] == CRITICAL:
        parts.append(f"{s['consecutive_failures']} consecutive failures")
    worst = [f for f in s.get("findings") or [] if f["level"] == s["verdict"]]
    if worst:
        parts.append(f"{len(s['findings'])} finding(s), first: {worst[0]['text']}")
    return "; ".join(parts)


def table(s: dict) -> str:
    """A few aligned lines for a person at a terminal (or reading the journal)."""
    rows = [("verdict", f"{s['verdict']} ({s['code']})  {s['time']}"),
            ("url", s["url"]),
            ("/health", f"{s['health_status']} in {s['latency_ms']} ms" if s["health_status"] else "no answer"),
            ("models", ", ".join(s["models"]) if s["models"] else "-")]
    if s["gpu"] is None:
        rows.append(("gpu", f"none ({s['gpu_note']})"))
    for g in s["gpu"] or []:
        if g.get("error"):
            rows.append((f"gpu {g['index']}", f"error: {g['error']}"))
            continue
        thr = ",".join((g.get("throttle") or {}).get("reasons") or []) or "-"
        rows.append((f"gpu {g['index']}", f"{g['name']}  {g['memory_used_mib']}/{g['memory_total_mib']} MiB  "
                                          f"{g['temperature_c']} C  ecc {g['ecc_uncorrected']}  "
                                          f"pending {g['retired_pages_pending']}  clocks {thr}"))
    rows.append(("xid", "unknown (no kernel log)" if s["xids"] is None
                 else f"{len(s['xids'])} new ({s['xid_source']})"))
    last = s["last_restart"]
    rows.append(("failures", f"{s['consecutive_failures']} consecutive (restart after {s['restart_after']}); "
                             f"last restart {last['time'] if last else 'never'}"))
    rows.append(("history", " ".join(str(h["code"]) for h in s["history"]) + "  (codes, oldest first)"))
    out = [f"{k:<9} {v}" for k, v in rows]
    out += [f"  {f['level']:<8} {f['text']}" for f in s["findings"]] or ["  no findings"]
    return "\n".join(out)


def wrapper_script(venv: str) -> str:
    """The ``<venv>/bin/qwen27b-health`` entry point.  This file is installed as
    ``<venv>/lib/qwen27b_health.py``, outside site-packages, so the wrapper puts that directory
    on sys.path first (nothing else in the venv can shadow or be shadowed by it)."""
    return (f"#!{venv}/bin/python\n"
            f"# qwen27b health check (rendered by qwen27b); the code is {venv}/lib/qwen27b_health.py\n"
            f"import sys\n"
            f"sys.path.insert(0, {venv + '/lib'!r})\n"
            f"from qwen27b_health import main\n"
            f"raise SystemExit(main())\n")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b-health", description=__doc__.split("\n\n")[0],
                                epilog="exit codes: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the check failed)")
    p.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--unit", default="qwen27b.service", help="systemd unit the watchdog restarts")
    p.add_argument("--status-file", help="JSON status, also the memory between runs (counter, history)")
    p.add_argument("--restart-after", type=int, default=3, help="restart after K consecutive CRITICAL runs")
    p.add_argument("--restart-min-interval-s", type=float, default=600.0, help="at most one restart per S s")
    p.add_argument("--api-key-file", help="VLLM_API_KEY=... env file or a bare key (never printed)")
    p.add_argument("--served-name", help="model id /v1/models must list")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in s")
    p.add_argument("--slow-ms", type=float, default=1000.0, help="/health slower than this is a WARNING")
    p.add_argument("--json", action="store_true", help="print the status JSON instead of the table")
    p.add_argument("--no-restart", action="store_true", help="never restart; record what would happen")
    # from the environment too: the unit sets it with Environment=, so that a rollback to a release
    # whose qwen27b-health predates it still runs (an unknown flag would fail every check)
    p.add_argument("--restart-request", default=os.environ.get(RESTART_REQUEST_ENV) or None, metavar="FILE",
                   help="restart by writing FILE for a privileged helper instead of `systemctl restart` "
                        f"(default ${RESTART_REQUEST_ENV}; the health unit runs unprivileged)")
    # these three from the environment as well, for the same reason
    p.add_argument("--quiet", action="store_true", default=os.environ.get(QUIET_ENV) == "1",
                   help=f"the full table only when the verdict changes (and on a first run); else one line "
                        f"(default: ${QUIET_ENV}=1)")
    p.add_argument("--textfile-dir", default=os.environ.get(TEXTFILE_DIR_ENV, TEXTFILE_DIR),
                   help=f"node_exporter textfile dir for {TEXTFILE_NAME} ('' to write none; "
                        f"default ${TEXTFILE_DIR_ENV} or {TEXTFILE_DIR})")
    p.add_argument("--model-ref", default=os.environ.get(MODEL_REF_ENV) or None,
                   help=f"model id@revision, for the qwen27b_build_info metric (default ${MODEL_REF_ENV})")
    args = p.parse_args(argv)
    if args.restart_after < 1:
        p.error("--restart-after must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        status = check(args)
    except Exception as e:  # noqa: BLE001 - a broken check is UNKNOWN, not a service outage
        print(f"qwen27b-health: UNKNOWN: the check itself failed: {type(e).__name__}: {e}", file=sys.stderr)
        return UNKNOWN
    status["xid_counts"] = accumulate_xids(load_status(args.status_file).get("xid_counts"), status["xids"])
    problem = export_metrics(args, status)
    if problem:
        print(f"qwen27b-health: {problem}", file=sys.stderr)
    if args.status_file:
        try:
            write_status(args.status_file, status)
        except OSError as e:
            print(f"qwen27b-health: cannot write {args.status_file} ({e.strerror}): the failure counter "
                  f"and history are not kept", file=sys.stderr)
    if args.json:
        print(json.dumps(status, indent=2))
    elif args.quiet and not verdict_changed(status):
        print(one_line(status))
    else:
        print(table(status))
    return status["code"]


if __name__ == "__main__":
    raise SystemExit(main())
