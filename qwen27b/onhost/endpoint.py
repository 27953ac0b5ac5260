"""The health check's verdict over HTTP: one request per process, for load balancers, uptime checks
and `curl`.

systemd's ``qwen27b-health-http.socket`` (Accept=yes) accepts each connection and starts one
``qwen27b-health-http@.service`` with the connection as stdin and stdout; this module reads one
request, answers it from the status file the health timer writes, and exits. No server loop, no
listening socket, no thread of its own: the address, the allow-list (IPAddressAllow=) and the
connection limits are systemd's, so a bug here cannot widen who reaches it.

Read-only: it opens the status file and nothing else (never the API key file), and the body is
the verdict, its age and its findings, which hold no secret. The pure part, :func:`answer`, takes
the status and the clock and is unit-tested without a socket.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.parse

from .contract import COPIES_ENV, LEVELS, OK, UNKNOWN, WARNING
from .statusfile import epoch, read_previous

STALE_FACTOR = 3  # a status older than this many health intervals: the timer stopped or cannot write
PATHS = ("/", "/health")
METHODS = ("GET", "HEAD")
MAX_LINE = 8192  # a request or header line longer than this is refused (no unbounded read)
MAX_HEADERS = 100
# The whole request must arrive within this: a load balancer or scraper sends it in one packet, and
# each connection holds one of the socket's few slots (MaxConnections=): a client trickling its
# request used to hold one for the unit's RuntimeMaxSec= (10 s).
REQUEST_TIMEOUT_S = 2.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           431: "Request Header Fields Too Large", 503: "Service Unavailable"}
TIMER_HINT = "`systemctl status qwen27b-health.timer` and `journalctl -u qwen27b-health.service`"


# ------------------------------------------------------------------------------- pure parts

def _body(verdict: str, code: int, findings: list[dict], status: dict | None = None, age_s: float | None = None) -> dict:
    status = status or {}
    return {"verdict": verdict, "code": code, "time": status.get("time"),
            "age_s": None if age_s is None else round(age_s, 1), "findings": findings,
            "unit_state": status.get("unit_state"), "consecutive_failures": status.get("consecutive_failures"),
            # the engine's --max-num-seqs (the gateway's fair share sums them)
            "slots": status.get("slots") if type(status.get("slots")) is int else None}


def _findings(status: dict) -> list[dict]:
    """The status's findings as {level, text} (the internal "kind" left out)."""
    return [{"level": str(f.get("level")), "text": str(f.get("text"))}
            for f in status.get("findings") or [] if isinstance(f, dict)]


def answer(status: dict | None, problem: str | None, now: float, stale_after_s: float) -> tuple[int, dict]:
    """(HTTP code, body) for a status file's content.  200 when the verdict is OK or WARNING (the
    service answers; a WARNING is for people, not for a load balancer); 503 when it is CRITICAL or
    UNKNOWN, when the status could not be read (``problem``: why), and when it is older than
    ``stale_after_s`` (verdict "STALE": nobody has checked lately, so it proves nothing)."""
    if problem is None and status is not None:
        code, ran = status.get("code"), epoch(status["time"]) if isinstance(status.get("time"), str) else None
        if type(code) is not int or code not in LEVELS or status.get("verdict") != LEVELS[code]:
            problem = f"the status holds no verdict the health check writes (code {code!r})"
        elif ran is None:
            problem = f"the status holds no time of the check ({status.get('time')!r})"
    if problem is not None or status is None:
        text = f"{problem or 'no status'}: the health check's verdict is unknown here; see {TIMER_HINT}."
        return 503, _body("UNKNOWN", UNKNOWN, [{"level": "UNKNOWN", "text": text}])
    age = now - ran
    if abs(age) > stale_after_s:
        when = "old" if age > 0 else "in the future (clock change?)"
        text = (f"the last check ({status['verdict']} at {status['time']}) is {abs(age):.0f} s {when}, more than "
                f"{stale_after_s:.0f} s: the health timer stopped or cannot write its status; see {TIMER_HINT}.")
        return 503, _body("STALE", UNKNOWN, [{"level": "UNKNOWN", "text": text}], status, age)
    http = 200 if code in (OK, WARNING) else 503
    return http, _body(status["verdict"], code, _findings(status), status, age)


def read_status(path: str) -> tuple[dict | None, str | None]:
    """(status, None), or (None, why it cannot be used): missing, unreadable, not the check's JSON."""
    if not os.path.exists(path):
        return None, f"no status file {path} yet (the first check runs 2 min after boot)"
    status, problem = read_previous(path)
    return (None, f"the status file {path} {problem}") if problem else (status, None)


def route(method: str, target: str) -> int:
    """200 for a health request, else the HTTP error code: unknown path 404, other method 405."""
    path = urllib.parse.urlsplit(target).path or "/"
    if path not in PATHS:
        return 404
    return 200 if method in METHODS else 405


def response(code: int, body: dict, head: bool = False) -> bytes:
    """The whole HTTP/1.1 response, one connection, one answer (Connection: close)."""
    payload = (json.dumps(body) + "\n").encode()
    lines = [f"HTTP/1.1 {code} {REASONS[code]}", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", "Cache-Control: no-store", "Connection: close"]
    if code == 405:
        lines.append("Allow: " + ", ".join(METHODS))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else payload)


def _error(code: int, detail: str) -> dict:
    return {"error": REASONS[code], "detail": detail}


# ------------------------------------------------------------------------------- one request

def read_request(stream) -> tuple[str, str] | int:
    """(method, target) of the request on ``stream``, its headers read and dropped (an unread
    request left in the socket would make the close a reset, losing the answer); or an error code."""
    line = stream.readline(MAX_LINE + 1)
    parts = line.decode("latin-1").split()
    if len(line) > MAX_LINE or len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return 400
    for _ in range(MAX_HEADERS):
        header = stream.readline(MAX_LINE + 1)
        if len(header) > MAX_LINE:
            return 431
        if header in (b"\r\n", b"\n", b""):
            return parts[0], parts[1]
    return 431


def read_request_within(stream, seconds: float = REQUEST_TIMEOUT_S) -> tuple[str, str] | int:
    """read_request with a deadline for the whole request (a timer signal: a client that sends a
    byte now and then never lets one read time out); 408 when it passes."""
    def expired(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return read_request(stream)
    except TimeoutError:
        return 408
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


COPY_NAME = re.compile(r"^[a-z0-9-]{1,16}$")  # qwen27b.plan.hostdata.INSTANCE_NAME


def copy_status_file(status_file: str, name: str) -> str:
    """A copy's status file beside the host's: health.json -> health@NAME.json (stack.health_status_file)."""
    return os.path.join(os.path.dirname(status_file), f"health@{name}.json")


def route_copy(method: str, target: str, copies: list[str]) -> tuple[int, str | None, str]:
    """A host serving copies: (200, name, "") for GET/HEAD /health/NAME of a listed copy, else
    (error code, None, what to ask instead). / and /health name no copy: 404 listing them."""
    path = urllib.parse.urlsplit(target).path or "/"
    name = path[len("/health/"):] if path.startswith("/health/") else None
    where = ", ".join(f"/health/{c}" for c in copies)
    if name is None or name not in copies:
        return 404, None, f"this host serves copies; each copy's verdict is at {where}"
    return (200 if method in METHODS else 405), name, ""


def handle(request: tuple[str, str] | int, status_file: str, interval_s: float, now: float,
           copies: list[str] | None = None) -> bytes:
    if isinstance(request, int):
        return response(request, _error(request, "send one HTTP request, e.g. GET /health HTTP/1.1"))
    method, target = request
    if copies:
        code, name, detail = route_copy(method, target, copies)
        if code != 200:
            return response(code, _error(code, detail or "GET (or HEAD) only"), head=method == "HEAD")
        http, body = answer(*read_status(copy_status_file(status_file, name)), now=now,
                            stale_after_s=STALE_FACTOR * interval_s)
        return response(http, {**body, "copy": name}, head=method == "HEAD")
    code = route(method, target)
    if code != 200:
        detail = "the health endpoint answers GET (or HEAD) on /health and / only"
        return response(code, _error(code, detail), head=method == "HEAD")
    http, body = answer(*read_status(status_file), now=now, stale_after_s=STALE_FACTOR * interval_s)
    return response(http, body, head=method == "HEAD")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b-health-http", description=__doc__.split("\n\n")[0])
    p.add_argument("--status-file", required=True, help="the health check's JSON status (its --status-file)")
    p.add_argument("--interval-s", type=float, default=30.0,
                   help=f"the health timer's interval; a status older than {STALE_FACTOR}x this is STALE")
    # from the environment (the unit's Environment=): a rollback's older endpoint still starts
    p.add_argument("--copies", default=os.environ.get(COPIES_ENV) or None, metavar="A,B",
                   help="a host serving copies: answer /health/NAME from health@NAME.json beside --status-file "
                        f"(default ${COPIES_ENV})")
    args = p.parse_args(argv)
    names = [n for n in (args.copies or "").split(",") if n]
    bad = [n for n in names if not COPY_NAME.match(n)]
    if bad:
        p.error(f"--copies: {bad[0]!r} is not a copy name ([a-z0-9-], at most 16)")
    args.copies = names
    return args


def main(argv=None, stdin=None, stdout=None) -> int:
    args = parse_args(argv)
    rfile = stdin or sys.stdin.buffer
    wfile = stdout or sys.stdout.buffer
    wfile.write(handle(read_request_within(rfile), args.status_file, args.interval_s, time.time(), args.copies))
    wfile.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
