"""A small HTTP mirror that honours Range requests (python's http.server does not), so hosts
can resume interrupted weight downloads. For labs: `python3 -m qwen27b.mirror DIR --port 8800`.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files with Range support; records (path, Range header) of each GET in `requests`
    and can throttle to `rate` bytes/s (tests use both: resume proof, a slow transfer to interrupt)."""

    requests: list = []
    rate: float | None = None

    def send_head(self):
        self.requests.append((self.path, self.headers.get("Range")))
        path = self.translate_path(self.path)
        header = self.headers.get("Range", "")
        if not header.startswith("bytes=") or not os.path.isfile(path):
            return super().send_head()
        start_text, _, end_text = header[6:].partition("-")
        size = os.path.getsize(path)
        start = int(start_text or 0)
        end = min(int(end_text), size - 1) if end_text else size - 1
        if start >= size:
            self.send_error(416, "Requested Range Not Satisfiable")
            return None
        handle = open(path, "rb")
        handle.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._remaining = end - start + 1
        return handle

    def copyfile(self, source, outputfile):
        remaining = getattr(self, "_remaining", None)
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


def serve(directory: str, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start serving directory in a thread; returns the server (server.server_address has the port,
    server.handler the handler class: its `requests` log and `rate` throttle)."""
    handler = type("MirrorHandler", (RangeHandler,), {"requests": [], "rate": None})
    server = ThreadingHTTPServer((host, port), partial(handler, directory=directory))
    server.handler = handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8800)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), partial(RangeHandler, directory=args.directory))
    print(f"serving {args.directory} on http://{args.host}:{args.port}/ (Range requests honoured)")
    server.serve_forever()


if __name__ == "__main__":
    main()
