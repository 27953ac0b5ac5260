"""uv's Python build downloaded once into the controller cache (issue 30): the URL the stack's uv
names, the release's SHA256SUMS, the on-host fetcher's resumable, checked, atomic path, and the
plan's python row saying whether the controller downloaded the cached build or a user put it there.

Real parts: the download over HTTP (a loopback http.server serving a release's layout), the sha256
check and the cache. Stand-in: `uv python list --show-urls` is a script printing the line uv prints
(the real uv binary comes from PyPI, unreachable here); never GitHub.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import socket
import threading

import pytest

from qwen27b.controller import artifacts
from qwen27b.plan import sources
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack

SRC = load_stack()["fetch_sources"]
RELEASE, NAME = "20251014", "cpython-3.12.12+20251014-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz"
REL = f"{RELEASE}/{NAME}"
PATH = "astral-sh/python-build-standalone/releases/download"
BUILD = b"a python-build-standalone tarball" * 1000


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def release(tmp_path):
    """A release laid out as GitHub serves it, on 127.0.0.1: (its base URL, its dir)."""
    served = tmp_path / "served" / PATH / RELEASE
    served.mkdir(parents=True)
    (served / NAME).write_bytes(BUILD)
    (served / "SHA256SUMS").write_text(f"{'0' * 64}  other.tar.gz\n{hashlib.sha256(BUILD).hexdigest()}  {NAME}\n")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path / "served")))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("QWEN27B_CACHE", str(root))
    monkeypatch.setattr(artifacts, "_python_fetches", {})  # once per run: each test is a run
    return root


def fake_uv(base: str, version: str = "0.13.9") -> None:
    """What `uv python list --show-urls 3.12` prints (the URL of uv's pinned build), at the cached
    uv binary's path."""
    uv = artifacts.uv_path(version)
    uv.parent.mkdir(parents=True)
    url = f"{base}/{PATH}/{RELEASE}/{NAME.replace('+', '%2B')}"
    uv.write_text(f"#!/bin/sh\necho 'cpython-3.12.12-linux-x86_64-gnu    {url}'\n"
                  f"echo 'cpython-3.11.14-linux-x86_64-gnu    {base}/x/cpython-3.11.14%2B{RELEASE}-x86_64-unknown-linux-gnu-install_only.tar.gz'\n")
    uv.chmod(0o755)


def settings(**data):
    return settings_for("h", {f"qwen27b_{k}": v for k, v in data.items()})


def test_the_build_uv_pins_is_downloaded_once_checked_and_said_so(release, cache):
    base, _ = release
    fake_uv(base)
    assert artifacts.fetch_python_build("0.13.9", "3.12") == (REL, None)
    assert (cache / "python" / REL).read_bytes() == BUILD and not list((cache / "python").rglob("*.part"))
    record = json.loads((cache / "python" / "fetched.json").read_text())
    assert record[REL]["sha256"] == hashlib.sha256(BUILD).hexdigest() and record[REL]["url"].startswith(base)
    assert artifacts.python_builds() == (REL,) and artifacts.python_downloaded() == (REL,)
    shown = sources.python_source(settings(), SRC, "3.12", artifacts.python_builds(), artifacts.python_downloaded())
    assert shown.kind == "controller" and shown.shown == f"from the controller cache ({REL}, downloaded by the controller, pushed)"
    artifacts.uv_path("0.13.9").unlink()  # once per run: not asked again
    assert artifacts.fetch_python_build("0.13.9", "3.12") == (REL, None)


def test_a_build_already_in_the_cache_is_not_downloaded_again(release, cache):
    base, served = release
    fake_uv(base)
    (cache / "python" / RELEASE).mkdir(parents=True)
    (cache / "python" / REL).write_bytes(b"put there by the user")
    (served / NAME).unlink()  # nothing to download
    assert artifacts.fetch_python_build("0.13.9", "3.12") == (REL, None)
    assert artifacts.python_downloaded() == ()
    shown = sources.python_source(settings(), SRC, "3.12", artifacts.python_builds(), artifacts.python_downloaded())
    assert "put there by hand" in shown.shown


def test_a_build_that_fails_its_sha256_is_not_kept(release, cache):
    base, served = release
    fake_uv(base)
    (served / NAME).write_bytes(BUILD[:-1] + b"!")  # same size, other bytes
    rel, why = artifacts.fetch_python_build("0.13.9", "3.12")
    assert rel is None and f"could not download {NAME}" in why and "does not match" in why
    assert artifacts.python_builds() == () and not list((cache / "python").rglob("*.part"))


def test_a_release_without_its_sha256_is_refused(release, cache):
    base, served = release
    fake_uv(base)
    (served / "SHA256SUMS").write_text(f"{'0' * 64}  other.tar.gz\n")
    rel, why = artifacts.fetch_python_build("0.13.9", "3.12")
    assert rel is None and f"SHA256SUMS lists no sha256 for {NAME}" in why


def test_an_unreachable_source_is_said_clearly_and_the_plan_falls_back(cache):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    fake_uv(f"http://127.0.0.1:{closed}")
    rel, why = artifacts.fetch_python_build("0.13.9", "3.12")
    assert rel is None and f"could not download {NAME} from http://127.0.0.1:{closed}/" in why and "refused" in why.lower()
    assert sources.python_source(settings(), SRC, "3.12", artifacts.python_builds()).kind == "github"


def test_a_uv_that_names_no_build_is_said_clearly(cache):
    uv = artifacts.uv_path("0.13.9")
    uv.parent.mkdir(parents=True)
    uv.write_text("#!/bin/sh\necho 'error: no network' >&2\nexit 2\n")
    uv.chmod(0o755)
    rel, why = artifacts.fetch_python_build("0.13.9", "3.12")
    assert rel is None and "named no x86_64 Linux build (exit 2: error: no network)" in why


@pytest.mark.parametrize("data, unreachable, fetches", [
    ({}, False, False),  # a host that reaches GitHub: uv downloads Python there, as before
    ({}, True, True),  # `qwen27b reach` saw it fail on GitHub
    ({"wheel_mirror": "http://m.lab/wheels/"}, False, True),  # the lab host
    ({"wheel_mirror": "http://m.lab/wheels/", "python_mirror": "http://m.lab/python"}, False, False),
    ({"hf_endpoint": "http://m.lab", "release_mirror": "http://gh.lab/"}, False, False),
])
def test_the_controller_fetches_python_only_for_hosts_that_may_not_reach_github(data, unreachable, fetches):
    s = settings(**data)
    source = sources.python_source(s, SRC, "3.12")
    assert sources.controller_fetches_python(s, source, "3.12", unreachable) is fetches
