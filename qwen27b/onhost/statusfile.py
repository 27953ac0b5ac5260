"""The health check's status file, its memory between runs: the failure counter, the last restart
and the verdict history, written atomically and distrusted when it does not parse."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile

from .contract import LEVELS

HISTORY_LEN = 20


def push_history(history: list | None, when: str, code: int) -> list[dict]:
    entry = {"time": when, "code": code, "verdict": LEVELS[code]}
    return (list(history or []) + [entry])[-HISTORY_LEN:]


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")


def epoch(text: str | None) -> float | None:
    try:
        return dt.datetime.fromisoformat(text).timestamp() if text else None
    except (TypeError, ValueError):
        return None


def _valid_status(data) -> str | None:
    """Why a previous status cannot be trusted as the watchdog's memory (None: it can). Only the
    fields a run reads back are checked: the counter, the times and the history."""
    if not isinstance(data, dict):
        return f"holds a JSON {type(data).__name__}, not an object"
    failures = data.get("consecutive_failures", 0)
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
        return f"consecutive_failures is {failures!r}, not a count"
    if data.get("time") is not None and epoch(data["time"]) is None:
        return f"time is {data['time']!r}, not an ISO timestamp"
    last = data.get("last_restart")
    if last is not None and not (isinstance(last, dict) and (last.get("time") is None or epoch(last["time"]))):
        return "last_restart is not {time, reason, ok}"
    history = data.get("history")
    if history is not None and not (isinstance(history, list) and all(
            isinstance(h, dict) and h.get("code") in LEVELS and not isinstance(h.get("code"), bool)
            for h in history)):
        return "history is not a list of {time, code, verdict}"
    live = data.get("liveness")
    if live is not None and not _valid_liveness(live):
        return "liveness is not {tokens, busy_since, last_probe}"
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _valid_liveness(live) -> bool:
    """The engine-progress memory (health.liveness): a counter reading and two times."""
    if not isinstance(live, dict) or not _number(live.get("tokens")):
        return False
    probe = live.get("last_probe")
    return ((live.get("busy_since") is None or _number(live["busy_since"]))
            and (probe is None or (isinstance(probe, dict) and _number(probe.get("time")))))


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
