"""The demo's summary (issue 48 item 8): how to use the lab key with the openai client, not only curl.
The printed lines are run as they are, in a real shell with the real openai client, against an
OpenAI-shaped stub on loopback that answers only the key from the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from qwen27b.tools.demo_summary import client_lines

KEY = "sk-qwen27b-demo-0123456789"


class Stub(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, body: dict) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        data = json.dumps(body if ok else {"error": {"message": "bad key"}}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer({"object": "list", "data": [{"id": "qwen-demo", "object": "model", "created": 0, "owned_by": "x"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer({"id": "c1", "object": "chat.completion", "created": 0, "model": "qwen-demo",
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "hello from the stub"}}]})


def test_the_summary_shows_the_openai_client_with_the_key_file_and_its_lines_work(tmp_path):
    key_file = tmp_path / "my lab" / "api.key"
    key_file.parent.mkdir()
    key_file.write_text(f"VLLM_API_KEY={KEY}\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lines = client_lines(str(key_file), f"http://127.0.0.1:{server.server_address[1]}")
    assert lines[0].startswith("export OPENAI_API_KEY=") and "OPENAI_BASE_URL=" in lines[0]
    assert KEY not in "\n".join(lines)  # the file is named, the key never printed
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's, with openai
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("OPENAI_")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    try:
        run = subprocess.run(["sh", "-c", f"{lines[0]} && {lines[1]}"], capture_output=True, text=True, env=env,
                             timeout=60)
        curl = subprocess.run(["sh", "-c", lines[2] + " -s"], capture_output=True, text=True, env=env, timeout=30)
    finally:
        server.shutdown()
    assert run.returncode == 0 and run.stdout.strip() == "hello from the stub", run.stderr[-2000:]
    if shutil.which("curl"):  # the curl line too, where curl is installed
        assert curl.returncode == 0 and json.loads(curl.stdout)["data"][0]["id"] == "qwen-demo", curl.stderr
