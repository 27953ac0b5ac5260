"""A PyPI simple index (PEP 503) made from a wheelhouse, served on loopback (issue 30): what a lab's
own PyPI mirror (`qwen27b_pypi_index`) serves, for the tests to point the real uv at.

The pages are static files (`simple/<name>/index.html`, each link carrying the wheel's
`#sha256=` from the wheelhouse's manifest.json) served by the standard library's file server, which
answers `/simple/<name>/` with that index.html; every request is logged as (path, method) in
`server.handler.requests`, like the lab mirror's and the hubs'.
"""

from __future__ import annotations

import html
import json
import re
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _project(wheel: str) -> str:
    """A wheel file's project name, normalized as PEP 503 says."""
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


def build_index(wheelhouse: Path, root: Path) -> Path:
    """Lay the wheelhouse out as a simple index under `root` (wheels linked, not copied)."""
    files = json.loads((wheelhouse / "manifest.json").read_text())["files"]
    (root / "files").mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[str]] = {}
    for name, meta in sorted(files.items()):
        if name.endswith(".whl"):
            link = root / "files" / name
            if not link.exists():
                link.symlink_to(wheelhouse / name)
            projects.setdefault(_project(name), []).append(
                f'<a href="../../files/{html.escape(name)}#sha256={meta["sha256"]}">{html.escape(name)}</a><br>')
    for project, links in projects.items():
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / "simple" / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(f'<a href="{p}/">{p}</a><br>' for p in sorted(projects))
        + "\n</body></html>\n")
    return root


class _LoggedFiles(SimpleHTTPRequestHandler):
    requests: list = []

    def send_head(self):
        self.requests.append((self.path, self.command))
        return super().send_head()

    def log_message(self, format, *args):  # noqa: A002 - the request log is `requests`
        pass


def serve_index(wheelhouse: Path, root: Path, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The index of `wheelhouse` under `root`, served from a daemon thread; its URL is
    http://HOST:PORT/simple/. The caller shuts it down."""
    build_index(wheelhouse, root)
    handler = type("IndexHandler", (_LoggedFiles,), {"requests": []})
    server = ThreadingHTTPServer((host, port), partial(handler, directory=str(root)))
    server.daemon_threads = True
    server.handler = handler
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
