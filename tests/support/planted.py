"""A planted listener for the tests of issue 51 item 2: a plain Python HTTP server, started by the
test as its own process (not the unit's), that binds the service's port, answers 200 to everything
with JSON shaped like vLLM's (so a check that trusts it would call it healthy) and writes every
request's path and Authorization header to a log: the test reads there whether a key reached it."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

SERVER = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

LOG = sys.argv[2]
BODIES = {"/v1/models": {"data": [{"id": "m"}]},
          "/v1/completions": {"choices": [{"text": "hi"}], "usage": {"completion_tokens": 1}}}

class Squat(BaseHTTPRequestHandler):
    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with open(LOG, "a") as fh:
            fh.write(f"{self.command} {self.path} auth={self.headers.get('Authorization')}\n")
        body = json.dumps(BODIES.get(self.path, {})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Squat).serve_forever()
'''


@contextmanager
def planted_listener(port: int, log: Path):
    """Run the squatter on 127.0.0.1:`port` until the block ends; yields its Popen (stopped by PID)."""
    log.touch()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(log)])
    try:
        import urllib.request
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1).read()  # noqa: S310
                break
            except OSError:
                time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def other_process():
    """A real process that is not the squatter: the unit's MainPID while someone else holds its port."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
