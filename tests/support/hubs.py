"""Local stand-ins for the two model hubs a lab can reach (issue 30), so tests drive the REAL
download clients with no internet: `serve_hf` speaks the Hugging Face Hub protocol of
huggingface_hub 2.4 (`hf download`), `serve_modelscope` that of modelscope-hub 0.5.1
(`modelscope download`), the versions in the check venv. Each serves flat directories of files,
one per (repo id, revision), and logs every request as (path, method) in `server.handler.requests`.

Hand-written because neither client package ships a server, and no PyPI package serves either
protocol from a local directory (hub mirrors such as hf-mirror proxy the real hub instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from qwen27b.onhost.mirror import BadRange, parse_range

# huggingface.co's default .gitattributes stores these in LFS, and it refuses plain git files over
# 10 MiB: such files answer `resolve` with a redirect to the CDN, as on the real hub.
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".msgpack", ".h5", ".onnx")
LFS_MIN_SIZE = 10 << 20


class _Repo:
    """One served revision: its commit sha (sha1 of repo@revision: stable across runs) and files."""

    def __init__(self, repo_id: str, revision: str, directory) -> None:
        self.repo_id, self.revision, self.dir = repo_id, revision, str(directory)
        self.sha = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        self.files = {}  # name -> (size, sha256, git blob sha1)
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if os.path.isfile(path) and not name.startswith("."):
                data = open(path, "rb").read()
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                self.files[name] = (len(data), hashlib.sha256(data).hexdigest(), blob)

    def lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES) or self.files[name][0] >= LFS_MIN_SIZE


class _HubHandler(BaseHTTPRequestHandler):
    """What both hubs share: the request log, the repo table, JSON and file answers (Range honoured)."""

    requests: list = []
    repos: dict = {}
    server_version = "qwen27b-hub"
    sys_version = ""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.requests.append((self.path, self.command))
        self.route()

    do_HEAD = do_GET

    def find(self, repo_id: str, revision: str):
        """(repo known, the _Repo for that revision or its commit sha, or None)."""
        known = [r for (rid, _), r in self.repos.items() if rid == repo_id]
        return bool(known), next((r for r in known if revision in (r.revision, r.sha)), None)

    def send_json(self, code: int, body, headers=()) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for key, value in [("Content-Type", "application/json"), ("Content-Length", str(len(data))), *headers]:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_file(self, repo: _Repo, name: str, headers=()) -> None:
        size = repo.files[name][0]
        try:
            wanted = parse_range(self.headers.get("Range", ""), size)
        except BadRange as error:
            return self.send_json(416, {"error": str(error)})
        start, end = wanted or (0, size - 1)
        self.send_response(206 if wanted else 200)
        for key, value in [("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"),
                           ("Content-Length", str(max(0, end - start + 1))), *headers]:
            self.send_header(key, value)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command != "HEAD" and size:
            with open(os.path.join(repo.dir, name), "rb") as handle:
                self.connection.sendfile(handle, start, end - start + 1)

    def log_message(self, format, *args):  # noqa: A002 - the request log is `requests`
        pass


def _start(handler: type, repos: dict, host: str, port: int) -> ThreadingHTTPServer:
    handler = type(handler.__name__, (handler,), {
        "requests": [], "repos": {key: _Repo(*key, d) for key, d in repos.items()}})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.handler = handler
    # a short poll: .shutdown() waits for it, once per test
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


class HfHandler(_HubHandler):
    """The Hub's read API as `hf download` walks it: /api/models/R/revision/REV (commit sha),
    /api/models/R/tree/SHA (files, sizes, LFS sha256), HEAD+GET /R/resolve/SHA/NAME; LFS files
    redirect to a "CDN" (the same server under another host name, so the client does not follow
    the HEAD's redirect but reads X-Linked-Etag/-Size from it, as with huggingface.co)."""

    def route(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo = self.repo("/".join(parts[2:4]), parts[5])
            if repo and parts[4] == "revision":
                self.send_json(200, {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha,
                                     "private": False, "siblings": [{"rfilename": n} for n in repo.files]})
            elif repo:
                self.send_json(200, [self.entry(repo, n) for n in repo.files] if len(parts) == 6 else [])
        elif parts[2:3] == ["resolve"] and len(parts) == 5 or parts[0] == "cdn-lfs" and parts[3:4] == ["resolve"] \
                and len(parts) == 6:
            cdn = parts[0] == "cdn-lfs"
            repo, name = self.repo("/".join(parts[cdn:cdn + 2]), parts[cdn + 3]), parts[cdn + 4]
            if repo and name not in repo.files:
                self.send_json(404, {"error": "Entry not found"},
                               [("X-Error-Code", "EntryNotFound"), ("X-Error-Message", "Entry not found")])
            elif repo and repo.lfs(name) and not cdn:
                size, sha256, _ = repo.files[name]
                host, port = self.server.server_address[:2]
                host = "localhost" if host == "127.0.0.1" else host  # another origin: see the docstring
                where = f"http://{host}:{port}/cdn-lfs/{repo.repo_id}/resolve/{repo.sha}/{name}"
                self.send_json(302, {}, [("Location", where), ("X-Repo-Commit", repo.sha),
                                         ("X-Linked-Etag", f'"{sha256}"'), ("X-Linked-Size", str(size))])
            elif repo:
                _, sha256, blob = repo.files[name]
                self.send_file(repo, name, [("X-Repo-Commit", repo.sha), ("ETag", f'"{sha256 if cdn else blob}"')])
        else:
            self.send_json(404, {"error": "Not found"})

    def repo(self, repo_id: str, revision: str):
        """The served revision, or None after answering 404 the way the Hub does (X-Error-Code)."""
        known, repo = self.find(repo_id, revision)
        if repo is None:
            code, what = ("RevisionNotFound", f"Invalid rev id: {revision}") if known else \
                         ("RepoNotFound", f"Repository not found: {repo_id}")
            self.send_json(404, {"error": what}, [("X-Error-Code", code), ("X-Error-Message", what)])
        return repo

    @staticmethod
    def entry(repo: _Repo, name: str) -> dict:
        size, sha256, blob = repo.files[name]
        lfs = {"lfs": {"oid": sha256, "size": size, "pointerSize": 134}} if repo.lfs(name) else {}
        return {"type": "file", "path": name, "size": size, "oid": blob, **lfs}


def serve_hf(repos: dict, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A Hugging Face Hub for `repos` ({(repo id, revision): directory}) in a daemon thread; point
    the client at it with HF_ENDPOINT=http://HOST:PORT. Stop it with .shutdown()."""
    return _start(HfHandler, repos, host, port)


class ModelScopeHandler(_HubHandler):
    """ModelScope's legacy read API as `modelscope download` walks it: GET
    /api/v1/models/R/repo/files?Revision=REV&Recursive=True (names, sizes, sha256: the client
    verifies each download against it) and GET /api/v1/models/R/repo?Revision=REV&FilePath=NAME;
    anything else (the intranet-acceleration probe, ...) is a quick 404 that sends it the plain way.
    `bad_sha256` names files whose listed sha256 is wrong, to prove the client checks it."""

    bad_sha256: set = set()

    def route(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        query = dict(urllib.parse.parse_qsl(url.query))
        if parts[:3] != ["api", "v1", "models"] or len(parts) not in (6, 7) or parts[5] != "repo" \
                or parts[6:] not in ([], ["files"]):
            return self.send_json(404, {"Code": 404, "Message": "Not found", "Success": False})
        repo_id, revision = "/".join(parts[3:5]), query.get("Revision") or "master"
        known, repo = self.find(repo_id, revision)
        if repo is None:
            what = f"Revision {revision} of {repo_id} not found" if known else f"Model {repo_id} not found"
            self.send_json(404, {"Code": 10010205001, "Message": what, "Success": False})
        elif parts[6:] == ["files"]:
            self.send_json(200, {"Code": 200, "Success": True, "Message": "success",
                                 "Data": {"Files": [self.entry(repo, n) for n in repo.files]}})
        elif query.get("FilePath", "").lstrip("/") in repo.files:
            self.send_file(repo, query["FilePath"].lstrip("/"))
        else:
            self.send_json(404, {"Code": 10010205001, "Message": f"File {query.get('FilePath')} not found",
                                 "Success": False})

    def entry(self, repo: _Repo, name: str) -> dict:
        size, sha256, _ = repo.files[name]
        if name in self.bad_sha256:
            sha256 = hashlib.sha256(sha256.encode()).hexdigest()
        return {"Name": name, "Path": name, "Type": "blob", "Size": size, "Sha256": sha256,
                "Revision": repo.sha, "IsLFS": repo.lfs(name), "Mode": "33188"}


def serve_modelscope(repos: dict, host: str = "127.0.0.1", port: int = 0,
                     bad_sha256=()) -> ThreadingHTTPServer:
    """A ModelScope hub for `repos` ({(repo id, revision): directory}) in a daemon thread; point the
    client at it with MODELSCOPE_ENDPOINT=http://HOST:PORT. Stop it with .shutdown()."""
    server = _start(ModelScopeHandler, repos, host, port)
    server.handler.bad_sha256 = set(bad_sha256)
    return server
