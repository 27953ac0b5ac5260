"""Progress of the long steps on the controller's terminal: one updating line per host.

The weights download (20+ GiB), the wheel install and the model load run for minutes, and pyinfra
shows a host's remote output only with -v (then as raw lines, after the fact for pip). While such
an operation runs on a host, a greenlet here reads a small read-only probe on that host every
second or two (over its own SSH connection to the host, not pyinfra's: remote.side_connection
says why; `du` of the directories the step writes, each inode counted once) and draws `bytes of total (n%), rate, ETA`; the verify step
draws the model load itself (vLLM's "Loading safetensors checkpoint shards: N/M" from the unit's
journal).

Only on a terminal: stderr a TTY and PYINFRA_PROGRESS not "off". Anywhere else (a CI log, a pipe,
a file) nothing is drawn and no probe runs: such logs stay line-oriented; -v still has the tools'
own output there. Only in pyinfra's default mode (each operation on every host, then the next):
--serial and --no-wait run no per-operation callbacks, and then nothing is drawn either.

pyinfra's own spinner draws the terminal's bottom line while each operation runs ("50% (1/2)
{hosts}"). For a watched operation it is switched off through pyinfra's own switch
(PYINFRA_PROGRESS=off, which `progress_spinner` reads as each operation's spinner starts) and
these lines take its place; they go away when the operation ends and the spinner is back for the
next one. Whatever else is written to stderr meanwhile (pyinfra's per-host results, verify's
messages, a Ctrl-C notice) is printed above the lines: sys.stderr is wrapped while they show.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass, field

import gevent
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.state import BaseStateCallback

from . import runstate
from .remote import close_side_connection, on_host, side_connection

SPINNER_SWITCH = "PYINFRA_PROGRESS"


# --------------------------------------------------------------------------------------------
# Pure: numbers to text, samples to rate and ETA
# --------------------------------------------------------------------------------------------

def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass
class Meter:
    """Bytes so far, sampled over time: the rate over the last `window` seconds (a transfer's speed
    changes: the mean since the start would lag) and the ETA at that rate."""

    total: int | None
    window: float = 10.0
    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, when: float, done: int) -> None:
        self.samples.append((when, done))
        while len(self.samples) > 2 and when - self.samples[1][0] >= self.window:
            self.samples.pop(0)

    @property
    def done(self) -> int | None:
        return self.samples[-1][1] if self.samples else None

    @property
    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return max(0.0, (b1 - b0) / (t1 - t0)) if t1 > t0 else None

    @property
    def eta(self) -> float | None:
        rate, done = self.rate, self.done
        if not self.total or rate is None or done is None or rate <= 0:
            return None
        return max(0.0, self.total - done) / rate


def bytes_line(label: str, meter: Meter, finishing: str = "") -> str:
    """`weights  1.2 GiB of 20.4 GiB (6%), 85.3 MiB/s, ETA 3m48s`; with no total, bytes and rate;
    past the total, `finishing` (what the step does after its bytes: install compiles bytecode)."""
    done, rate, total = meter.done or 0, meter.rate, meter.total
    text = f"{label:<8} {human_bytes(done)}"
    if total:
        text += f" of {human_bytes(total)} ({min(100, int(done * 100 / total))}%)"
    if rate is not None:
        text += f", {human_bytes(rate)}/s"
    if total and done >= total and finishing:
        return text + f", {finishing}"
    eta = meter.eta
    if eta is not None:
        text += f", ETA {human_duration(eta)}"
    return text


# --------------------------------------------------------------------------------------------
# What a role asks for: watch this operation on this host
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """A step's progress is the bytes in `paths` (each inode once: `du` counts a hard link once,
    so uv's cache and the venv it links into add up to what was unpacked) against `total`."""

    label: str
    paths: tuple[str, ...]
    total: int | None
    every_s: float = 1.0
    finishing: str = ""

    def command(self) -> str:
        quoted = " ".join(shlex.quote(p) for p in self.paths)
        return f"du -scb -- {quoted} 2>/dev/null | tail -n1"  # a path not made yet is skipped

    @staticmethod
    def parse(lines: list[str]) -> int | None:
        try:
            return int(lines[-1].split()[0])
        except (IndexError, ValueError):
            return None


SELF = Probe("", (), None)  # the operation draws its own line (verify's load)


def watch(op, host, label: str, paths: list[str], total: int | None, every_s: float = 1.0,
          finishing: str = "") -> None:
    """While `op` runs on `host`, draw `label`'s bytes in `paths` against `total` (when on a terminal)."""
    if op is not None and getattr(op, "_hash", None):
        runstate.current().progress[(host.name, op._hash)] = Probe(label, tuple(paths), total, every_s, finishing)


def watch_self(op, host) -> None:
    """`op` draws its own line with `show` while it runs (its function runs on the controller)."""
    if op is not None and getattr(op, "_hash", None):
        runstate.current().progress[(host.name, op._hash)] = SELF


def show(host_name: str, text: str) -> bool:
    """Draw this host's line (False when nothing is drawn: not a terminal, or not a watched operation)."""
    if _BOARD.active:
        _BOARD.set(host_name, text)
        return True
    return False


def done(host_name: str) -> None:
    """This host's line is no longer needed (its step goes on without progress to show)."""
    if _BOARD.active:
        _BOARD.drop(host_name)


def drawing() -> bool:
    return _BOARD.active


# --------------------------------------------------------------------------------------------
# The terminal: the lines at its bottom, and stderr written above them
# --------------------------------------------------------------------------------------------

def on_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and _BOARD.spinner_setting != "off"


class Board:
    """One line per host at the bottom of the terminal, redrawn in place. `shown` lines are on the
    screen, the cursor at the start of the line below them. Anything else written to stderr goes
    through `_Above`: the lines are cleared, the text written, the lines drawn again below it."""

    def __init__(self) -> None:
        self.lines: dict[str, str] = {}
        self.shown = 0
        self.active = False
        self.real = None
        self.at_line_start = True
        self.spinner_setting = os.environ.get(SPINNER_SWITCH)  # the user's, before this run changed it

    def start(self) -> None:
        if self.active:
            return
        self.real, self.active, self.at_line_start = sys.stderr, True, True
        sys.stderr = _Above(self, self.real)
        os.environ[SPINNER_SWITCH] = "off"

    def stop(self) -> None:
        if not self.active:
            return
        self.clear()
        self.lines.clear()
        sys.stderr, self.active = self.real, False
        if self.spinner_setting is None:
            os.environ.pop(SPINNER_SWITCH, None)
        else:
            os.environ[SPINNER_SWITCH] = self.spinner_setting

    def set(self, host_name: str, text: str) -> None:
        self.lines[host_name] = text
        self.draw()

    def drop(self, host_name: str) -> None:
        if self.lines.pop(host_name, None) is not None:
            self.draw()

    def width(self) -> int:
        try:
            return os.get_terminal_size(self.real.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return 100

    def clear(self) -> None:
        if self.shown:
            self.real.write(f"\x1b[{self.shown}F\x1b[J")  # up to the first line, clear to the end
            self.shown = 0

    def draw(self) -> None:
        if not self.active or not self.at_line_start:
            return  # another writer is mid-line: draw after its newline
        self.clear()
        room = max(20, self.width() - 1)  # never wrap: the cursor arithmetic counts one row per line
        names = sorted(self.lines)
        pad = max((len(n) for n in names), default=0)
        for name in names:
            self.real.write(f"    [{name}]".ljust(pad + 7)[: room] + self.lines[name][: max(0, room - pad - 7)] + "\n")
        self.shown = len(names)
        self.real.flush()


class _Above:
    """sys.stderr while the board shows: each write lands above the lines."""

    def __init__(self, board: Board, real) -> None:
        self._board, self._real = board, real

    def write(self, text):
        if not text:
            return self._real.write(text)  # click probes a stream with empty writes
        self._board.clear()
        written = self._real.write(text)
        self._board.at_line_start = text.endswith("\n")
        self._board.draw()
        return written

    def flush(self) -> None:
        self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


_BOARD = Board()  # the terminal is the process's: one board per process


# --------------------------------------------------------------------------------------------
# pyinfra's callbacks: when a watched operation starts and ends, per host
# --------------------------------------------------------------------------------------------

class Watcher(BaseStateCallback):
    """Starts the board when a watched operation starts (pyinfra's default mode calls
    `operation_start` before that operation's spinner starts), a probe per host while the operation
    runs there, and stops the board when the operation has ended on every host."""

    def __init__(self) -> None:
        self.pollers: dict = {}
        self.connections: dict = {}  # host name -> the probe's own SSH connection (None: pyinfra's)

    def operation_start(self, state, op_hash) -> None:
        watched = runstate.of(state).progress
        if on_terminal() and any(key[1] == op_hash for key in watched):
            _BOARD.start()

    def operation_host_start(self, state, host, op_hash) -> None:
        probe = runstate.of(state).progress.get((host.name, op_hash))
        if not _BOARD.active or probe is None or probe is SELF:
            return
        arguments = state.get_op_data_for_host(host, op_hash).global_arguments
        connector = {k: arguments[k] for k in CONNECTOR_ARGUMENT_KEYS if k in arguments and k not in ("_stdin",)}
        self.pollers[host.name] = gevent.spawn(_poll, host, probe, connector, self._connection)

    def _connection(self, host):
        """The probe's own connection to `host`, made once per run (in the poller's greenlet: the
        handshake never holds up the operation it watches)."""
        if host.name not in self.connections:
            self.connections[host.name] = side_connection(host)
        return self.connections[host.name]

    def close(self) -> None:
        for connection in self.connections.values():
            close_side_connection(connection)
        self.connections.clear()

    def _host_done(self, host) -> None:
        poller = self.pollers.pop(host.name, None)
        if poller is not None:
            poller.kill(block=False)
        _BOARD.drop(host.name)

    def operation_host_success(self, state, host, op_hash, retry_count=0) -> None:
        self._host_done(host)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0) -> None:
        self._host_done(host)

    def operation_end(self, state, op_hash) -> None:
        for name in list(self.pollers):
            self.pollers.pop(name).kill(block=False)
        _BOARD.stop()  # the probes' connections stay for the next watched step


def _poll(host, probe: Probe, connector: dict, connection_for) -> None:
    meter = Meter(probe.total)
    via = connection_for(host)
    while True:
        try:
            _, output = on_host(host, probe.command(), connector=connector, via=via, print_output=False,
                                print_input=False)
            done = Probe.parse(output.stdout_lines)
        except Exception:  # noqa: BLE001 - a progress line must never fail the step it watches
            done = None
        if done is not None:
            meter.add(time.monotonic(), done)
            _BOARD.set(host.name, bytes_line(probe.label, meter, probe.finishing))
        gevent.sleep(probe.every_s)


_WATCHERS: list[Watcher] = []


def install(state) -> None:
    """Once per run (preflight, before any operation runs)."""
    watcher = Watcher()
    _WATCHERS.append(watcher)
    state.add_callback_handler(watcher)


def stop() -> None:
    """Clear the lines and give stderr and pyinfra's spinner back (also at exit, after Ctrl-C); the
    probes' own connections are closed (the run is over)."""
    _BOARD.stop()
    for watcher in _WATCHERS:
        watcher.close()
