"""The gateway's files rendered into a scratch root on this machine, as the role writes them on a
gateway host (nginx.conf with the access log off and no worker user, the keys include, the pool
watcher's config, the on-host package), for the loopback tests and benchmarks/gateway_compare.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from qwen27b.controller import gateway_render as G
from qwen27b.onhost.gateway_pool import fair_text, upstream_text
from qwen27b.plan.gateway import GatewayPlan
from tests.support import onhost_lib

ONHOST = Path(__file__).resolve().parents[2] / "qwen27b" / "onhost"


# the workers as the test's own user (nginx's default, nobody, cannot reach pytest's 0700 tmp dirs,
# where the usage counters are kept across a restart); on a host they are qwen27b-gateway's
SCRATCH_USER = ["user root;"] if os.geteuid() == 0 else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_scratch(plan: GatewayPlan, root: Path, access_log: str = "off", usage: bool = True) -> dict:
    """Write the files under `root`; returns the layout plus `pool` (the watcher's argv, less its
    command) and `env` (PYTHONPATH to the package). `access_log`: nginx's (e.g. "FILE qwen27b");
    `usage`: with nginx's Lua module (False: a gateway whose OS archive lacks it)."""
    where = G.layout(str(root))
    usage_port = free_port()  # the usage counters' listener, on a port of its own per scratch nginx
    for key in ("config", "temp_dir"):
        Path(where[key]).parent.mkdir(parents=True, exist_ok=True)
    Path(where["temp_dir"]).mkdir(exist_ok=True)
    Path(where["usage_dir"]).mkdir(exist_ok=True)
    Path(where["config"]).write_text(G.render("qwen27b-gateway.nginx.conf.j2",
                                              G.nginx_context(plan, where, run_as=SCRATCH_USER, access_log=access_log, usage_port=usage_port,
                                                              usage=usage)))
    Path(where["keys"]).write_text(G.keys_text(plan))
    pair = G.tls_pair(plan)
    if pair:
        Path(where["tls_cert"]).write_bytes(pair[0])
        Path(where["tls_key"]).write_bytes(pair[1])
    Path(where["pool_config"]).write_text(G.pool_config(plan, where))
    onhost_lib.install(root / "lib")
    Path(where["usage_lua"]).parent.mkdir(parents=True, exist_ok=True)
    Path(where["usage_lua"]).write_bytes((ONHOST / G.USAGE_LUA).read_bytes())
    return {**where, "usage": f"http://127.0.0.1:{usage_port}/metrics", "pool": [sys.executable, "-m", G.POOL_MODULE, "--config", where["pool_config"]],
            "env": {**os.environ, "PYTHONPATH": str(root / "lib")}}


def config_test(plan: GatewayPlan, root: Path, nginx: str, pool: list[str], usage: bool = True) -> subprocess.CompletedProcess:
    """`nginx -t` of the files rendered under `root`, the upstream file listing `pool` (-t binds the
    plan's listen address: give it a free loopback port)."""
    where = render_scratch(plan, root, usage=usage)
    Path(where["upstream_file"]).parent.mkdir(parents=True, exist_ok=True)
    config = json.loads(G.pool_config(plan, where))
    Path(where["upstream_file"]).write_text(upstream_text(config, pool))
    Path(where["fair_file"]).write_text(fair_text(config, pool, {name: 4 for name in pool}))
    return subprocess.run([nginx, "-t", "-c", where["config"]], capture_output=True, text=True)


@contextlib.contextmanager
def running_nginx(plan: GatewayPlan, root: Path, nginx: str | list[str], access_log: str = "off", usage: bool = True):
    """The files rendered under `root`, the pool's first round, and nginx (as root would run it) on
    the plan's loopback address until the block ends; yields render_scratch's dict plus `base`
    (http or https, as the plan says) and, with TLS, `verify` (an SSL context trusting its lab CA).
    `nginx`: its path, or an argv that ends with it (a wrapper that sets up its process first)."""
    where = render_scratch(plan, root, access_log, usage)
    subprocess.run(where["pool"] + ["render"], env=where["env"], check=True, capture_output=True)
    verify = ssl.create_default_context(cafile=f"{plan.tls.lab_ca_dir}/ca.crt") if plan.tls else None
    base = f"{plan.scheme}://{plan.address}:{plan.port}"
    argv = (nginx if isinstance(nginx, list) else [nginx]) + ["-c", where["config"]]  # a list: a wrapper first
    process = subprocess.Popen(argv, stderr=open(root / "nginx.log", "w"))
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{base}/health", timeout=1, verify=verify or True)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield {**where, "base": base, "verify": verify}
    finally:
        process.send_signal(signal.SIGQUIT)  # as the unit stops it (KillSignal=SIGQUIT): graceful
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a request still in flight: the tests do not wait for it
            process.terminate()
            process.wait(timeout=10)


class DevLog:
    """A stand-in for journald's syslog socket (/run/systemd/journal/dev-log): a real Unix datagram
    socket, read at once by a thread as journald does, that keeps each datagram nginx sends as (tag,
    message). What limits a line is the sender's side (the kernel refuses a datagram past nginx's
    socket buffer), as on a host."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gwlog", dir="/tmp")  # a Unix socket's path: 107 bytes at most
        self.path = f"{self.dir}/dev-log"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o666)  # nginx's workers may run as another user
        self.sock.settimeout(0.1)
        self.got: list[tuple[str, str]] = []
        self.open = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while self.open:
            try:
                data = self.sock.recv(4 << 20).decode()
            except TimeoutError:
                continue
            head, _, message = data.partition(": ")  # "<190>Dec  7 22:50:00 TAG: MESSAGE" (nohostname)
            self.got.append((head.rsplit(" ", 1)[-1], message))

    def lines(self, tag: str) -> list[str]:
        return [message for got, message in self.got if got == tag]

    def close(self):
        self.open = False
        self.reader.join(timeout=5)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)
