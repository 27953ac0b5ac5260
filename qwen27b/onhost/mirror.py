"""A small HTTP mirror that honours Range requests (python's http.server does not), so hosts
can resume interrupted weight downloads. For labs: `python3 -m qwen27b.onhost.mirror DIR --port 8800`.

The same file is the weights fan-out's seed server (`qwen27b-seed`, qwen27b/plan/fanout.py): with
--token-file and --allow it serves one model revision directory and nothing else - only plain
file names directly in it (no listing, no subdirectory, no hidden file), never through a symlink
(opened with O_NOFOLLOW relative to the directory), only to the planned peers' addresses and
only with the run's token (`Authorization: Bearer`); every refusal is logged without the token.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import socket
import stat
import sys
import threading
import time
import urllib.parse
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer

from .contract import http_base


# A client that sends nothing (or reads nothing) for this long is dropped: each connection holds a
# thread, and a peer that stalls mid-transfer must not hold one for ever.
IDLE_TIMEOUT_S = 60
MAX_CONNECTIONS = 32  # at once: more are closed on accept (a fan-out wave has a few peers per seed)


class BadRange(ValueError):
    """A Range header that names no part of the file: answered 416."""


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last byte) that `Range: bytes=...` asks for (RFC 9110 14.1.2), or None for the whole
    file (no Range, another unit, several ranges: a server may answer those with all of it).
    `bytes=5-2`, `bytes=abc-`, a start past the end or an empty suffix raise BadRange."""
    if not header.startswith("bytes="):
        return None
    spec = header[6:].strip()
    if "," in spec:
        return None
    first, dash, last = spec.partition("-")
    digits = lambda text: text.isascii() and text.isdigit()  # noqa: E731 (int() takes ' 5', '+5', '٥')
    if not dash or not (digits(first) or first == "") or not (digits(last) or last == "") or first == last == "":
        raise BadRange(f"unreadable Range {header[:40]!r}")
    if first == "":  # a suffix: the last N bytes
        if int(last) == 0 or size == 0:
            raise BadRange("an empty suffix range")
        return max(0, size - int(last)), size - 1
    start, end = int(first), (min(int(last), size - 1) if last else size - 1)
    if start >= size or start > end:
        raise BadRange(f"Range {header[:40]!r} is outside the file ({size} bytes)")
    return start, end


class BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most `max_connections` connections (one thread each) at once:
    a connection over the cap is closed on accept. The handlers' `timeout` bounds each one's idle time."""

    max_connections = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs):
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        """One line, not a traceback: a peer that stalled past the timeout or went away mid-transfer."""
        error = sys.exc_info()[1]
        print(f"{type(self).__name__}: {client_address[0]}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files with Range support; records (path, Range header) of each GET in `requests`
    and can throttle to `rate` bytes/s (tests use both: resume proof, a slow transfer to interrupt)."""

    requests: list = []
    rate: float | None = None
    timeout = IDLE_TIMEOUT_S

    def send_head(self):
        self.requests.append((self.path, self.headers.get("Range")))
        path = self.translate_path(self.path)
        header = self.headers.get("Range", "")
        if not header.startswith("bytes=") or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        try:
            wanted = parse_range(header, size)
        except BadRange as error:
            self.send_error(416, "Requested Range Not Satisfiable", str(error))
            return None
        if wanted is None:
            return super().send_head()
        start, end = wanted
        handle = open(path, "rb")
        handle.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._remaining = end - start + 1
        return handle

    def copyfile(self, source, outputfile, remaining=None):
        remaining = getattr(self, "_remaining", None) if remaining is None else remaining
        if not self.rate:  # sendfile(2): page cache to socket in the kernel, no copy through python
            # (outputfile is self.wfile, unbuffered: the headers have already gone out on the socket)
            self.connection.sendfile(source, source.tell(), remaining)
            return
        chunk = 1 << 18
        while remaining is None or remaining > 0:
            block = source.read(chunk if remaining is None else min(chunk, remaining))
            if not block:
                break
            outputfile.write(block)
            if remaining is not None:
                remaining -= len(block)
            if self.rate:
                time.sleep(len(block) / self.rate)

    def log_message(self, format, *args):  # noqa: A002 - quiet by default
        pass


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and "\0" not in name and not name.startswith(".")


def _address(text: str) -> str:
    """One canonical spelling (IPv4-mapped IPv6 as IPv4), so the allow-list compares like with like."""
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


class SeedHandler(BaseHTTPRequestHandler):
    """GET/HEAD of ROOT's plain files, at /<basename of ROOT>/<name>, for `allowed` addresses with
    `token`; Range honoured. Set per server by seed_handler()."""

    root_fd: int = -1
    prefix: str = ""
    token: str = ""
    allowed: frozenset = frozenset()
    rate: float | None = None
    timeout = IDLE_TIMEOUT_S
    server_version = "qwen27b-seed"
    sys_version = ""

    def do_HEAD(self):  # noqa: N802 (http.server's naming)
        self._answer(body=False)

    def do_GET(self):  # noqa: N802
        self._answer(body=True)

    def _refuse(self, code: int, why: str) -> None:
        print(f"qwen27b-seed: {code} for {self.client_address[0]} {self.command} "
              f"{self.path[:200]!r}: {why}", file=sys.stderr, flush=True)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        if code == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="qwen27b-seed"')
        self.end_headers()

    def _open(self):
        """The file the request names, opened without following any symlink; None: 404."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        head, _, name = path.lstrip("/").partition("/")
        if head != self.prefix or not _plain_name(name):
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.root_fd)
        except OSError:  # missing, a symlink (ELOOP), unreadable
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb"), info.st_size

    def _answer(self, body: bool) -> None:
        try:
            client = _address(self.client_address[0])
        except ValueError:
            client = self.client_address[0]
        if client not in self.allowed:
            return self._refuse(403, "not a planned peer of this fan-out")
        sent = self.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
            return self._refuse(401, "no or a wrong token")
        opened = self._open()
        if opened is None:
            return self._refuse(404, "not a plain file of the revision")
        handle, size = opened
        with handle:
            try:
                wanted = parse_range(self.headers.get("Range", ""), size)
            except BadRange as error:
                return self._refuse(416, str(error))
            start, end = wanted or (0, size - 1)
            self.send_response(206 if wanted else 200)
            self.send_header("Content-Type", "application/octet-stream")
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            if body:
                handle.seek(start)
                RangeHandler.copyfile(self, handle, self.wfile, end - start + 1)

    def log_message(self, format, *args):  # noqa: A002 - refusals are logged by _refuse
        pass


def seed_handler(directory: str, token: str, allowed) -> type:
    """A SeedHandler class for one revision directory (the directory itself may not be a symlink)."""
    if not token:
        raise ValueError("the seed needs a token")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    return type("Seed", (SeedHandler,), {"root_fd": fd, "prefix": os.path.basename(os.path.normpath(directory)),
                                         "token": token, "allowed": frozenset(_address(a) for a in allowed)})


def serve(directory: str, host: str = "127.0.0.1", port: int = 0, timeout: float = IDLE_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS) -> tuple[BoundedServer, threading.Thread]:
    """Start serving directory in a thread; returns the server (server.server_address has the port,
    server.handler the handler class: its `requests` log and `rate` throttle)."""
    handler = type("MirrorHandler", (RangeHandler,), {"requests": [], "rate": None, "timeout": timeout})
    server_class = type("Mirror", (BoundedServer,), {"max_connections": max_connections})
    server = server_class((host, port), partial(handler, directory=directory))
    server.handler = handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8800)
    parser.add_argument("--token-file", help="seed mode: the run's token (one line; never in argv)")
    parser.add_argument("--allow", action="append", default=[], metavar="ADDRESS",
                        help="seed mode: a peer address that may fetch (repeat)")
    args = parser.parse_args(argv)
    if args.token_file or args.allow:
        if not (args.token_file and args.allow):
            parser.error("seed mode needs both --token-file and --allow")
        with open(args.token_file, encoding="ascii") as fh:
            token = fh.read().strip()
        handler = seed_handler(args.directory, token, args.allow)
        what = f"seeding {args.directory} to {', '.join(sorted(handler.allowed))} (token required)"
    else:
        handler = partial(RangeHandler, directory=args.directory)
        what = f"serving {args.directory} (Range requests honoured)"
    server_class = BoundedServer
    if ":" in args.host:
        server_class = type("Server6", (BoundedServer,), {"address_family": socket.AF_INET6})
    server = server_class((args.host, args.port), handler)
    print(f"{what} on {http_base(args.host, args.port)}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
