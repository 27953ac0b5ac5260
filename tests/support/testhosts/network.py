"""Each host's network: a namespace and a veth pair, no default route; the registry proxy
(tinyproxy, bridged into the namespace by socat over a unix socket); optional peer routes.
The veth carries IPv4 (10.231.N.0/24) and an IPv6 unique-local /64 (fd00:231:N::/64), so a
host is reachable from the controller over either family (IPv6-only labs, issue 24)."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

from .common import TestHostsError, _free_port, _run, _tail, _write, log, require_root
from .procs import _spawn, pid_alive, stop_pid
from .state import ProfileState

NAME_PREFIX = "q27t"
SUBNET = "10.231.{n}"             # 10.231.N.1 outside, 10.231.N.2 inside
SUBNET6 = "fd00:231:{n}::"        # fd00:231:N::1 outside, fd00:231:N::2 inside (ULA, RFC 4193)
MAX_HOSTS = 250
PROXY_PORT_INSIDE = 3128


def _netns_list() -> list[str]:
    cp = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _subnet_in_use(n: int) -> bool:
    v4 = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    v6 = _run(["ip", "-o", "-6", "addr", "show"], check=False).stdout
    return f" {SUBNET.format(n=n)}." in v4 or f" {SUBNET6.format(n=n)}" in v6



class ProxyNetwork(ProfileState):
    """Namespaces, veths and the proxy of a profile (state and paths from ProfileState)."""

    def link_peers(self) -> None:
        """Let this profile's hosts reach each other, as on a lab LAN (host-to-host transfers:
        the weights fan-out): in each namespace a /32 route to every other host of the profile via
        its own gateway, and IPv4 forwarding on this profile's veths only
        (/proc/sys/net/ipv4/conf/vq27tN/forwarding; the machine's ip_forward stays as it is). Still
        no default route: nothing else becomes reachable. `down` undoes it with the veths and
        namespaces. Idempotent; call it again after adding hosts."""
        require_root()
        hosts = self.hosts
        for h in hosts:
            Path(f"/proc/sys/net/ipv4/conf/{h['veth']}/forwarding").write_text("1\n")
        for h in hosts:
            for other in hosts:
                if other["name"] != h["name"]:
                    _run(["ip", "netns", "exec", h["netns"], "ip", "route", "replace",
                          other["address"] + "/32", "via", h["gateway"], "dev", "eth0"])
        log(f"peers linked: {' '.join(h['name'] for h in hosts)} reach each other")

    def _ensure_proxy(self) -> None:
        st = self.load()
        px = st.setdefault("proxy", {})
        if not pid_alive(px.get("tinyproxy_pid"), px.get("tinyproxy_marker")):
            port = _free_port()
            conf = self.state_dir / "tinyproxy.conf"
            _write(conf, "\n".join([
                f"Port {port}", "Listen 127.0.0.1", "Timeout 600", "MaxClients 100",
                "Allow 127.0.0.1", "DisableViaHeader Yes", "LogLevel Notice",
                f'LogFile "{self.state_dir / "tinyproxy.log"}"',
                f'PidFile "{self.state_dir / "tinyproxy.pid"}"', ""]))
            pid = _spawn(["tinyproxy", "-d", "-c", conf], self.state_dir / "tinyproxy.out")
            px.update(tinyproxy_pid=pid, tinyproxy_marker=str(conf), port=port)
            self.save(st)
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if not pid_alive(pid) or time.monotonic() > deadline:
                    raise TestHostsError("tinyproxy did not start:\n"
                                         + _tail(self.state_dir / "tinyproxy.out"))
                time.sleep(0.1)
            log(f"tinyproxy on 127.0.0.1:{port} (pid {pid})")
            stop_pid(px.get("socat_pid"), px.get("socat_marker"))
            px["socat_pid"] = None
        if not pid_alive(px.get("socat_pid"), px.get("socat_marker")):
            with contextlib.suppress(FileNotFoundError):
                self.proxy_sock.unlink()
            pid = _spawn(["socat", f"UNIX-LISTEN:{self.proxy_sock},fork,unlink-early,mode=600",
                          f"TCP:127.0.0.1:{px['port']}"], self.state_dir / "socat-proxy.log")
            px.update(socat_pid=pid, socat_marker=f"UNIX-LISTEN:{self.proxy_sock}",
                      sock=str(self.proxy_sock))
            self.save(st)
            deadline = time.monotonic() + 10
            while not self.proxy_sock.exists():
                if not pid_alive(pid) or time.monotonic() > deadline:
                    raise TestHostsError("socat (proxy socket) did not start:\n"
                                         + _tail(self.state_dir / "socat-proxy.log"))
                time.sleep(0.05)

    def _allocate(self) -> int:
        netns = set(_netns_list())
        for n in range(1, MAX_HOSTS + 1):
            name = f"{NAME_PREFIX}{n}"
            if name in netns or _link_exists(f"v{name}") or _subnet_in_use(n):
                continue
            return n
        raise TestHostsError("no free 10.231.N.0/24 + fd00:231:N::/64 subnet / q27tN name")

    def _add_links(self, h: dict) -> None:
        """veth vNAME (gateway, gateway6) <-> eth0 in the namespace (address, address6), lo up.
        The IPv6 addresses are `nodad`: usable at once, no duplicate address detection to wait out."""
        ns = ["ip", "netns", "exec", h["netns"]]
        _run(["ip", "link", "add", h["veth"], "type", "veth", "peer", "name", "eth0",
              "netns", h["netns"]])
        _run(["ip", "addr", "add", h["gateway"] + "/24", "dev", h["veth"]])
        _run(["ip", "-6", "addr", "add", h["gateway6"] + "/64", "dev", h["veth"], "nodad"])
        _run(["ip", "link", "set", h["veth"], "up"])
        _run(ns + ["ip", "link", "set", "lo", "up"])
        _run(ns + ["ip", "addr", "add", h["address"] + "/24", "dev", "eth0"])
        _run(ns + ["ip", "-6", "addr", "add", h["address6"] + "/64", "dev", "eth0", "nodad"])
        _run(ns + ["ip", "link", "set", "eth0", "up"])

    def _ensure_bridge(self, h: dict) -> None:
        """The registry proxy bridged into the host's namespace at 127.0.0.1:3128."""
        if pid_alive(h.get("bridge_pid"), h.get("bridge_marker")):
            return
        listen = f"TCP-LISTEN:{PROXY_PORT_INSIDE},bind=127.0.0.1,fork,reuseaddr"
        pid = _spawn(["ip", "netns", "exec", h["netns"], "socat", listen,
                      f"UNIX-CONNECT:{self.proxy_sock}"],
                     self.state_dir / f"{h['name']}.bridge.log")
        h.update(bridge_pid=pid, bridge_marker=f"UNIX-CONNECT:{self.proxy_sock}")
        self._update_host(h)

    def _del_links(self, h: dict) -> None:
        """Undo _add_links and _ensure_bridge (idempotent)."""
        stop_pid(h.get("bridge_pid"), h.get("bridge_marker"))
        if h.get("netns") in _netns_list():
            _run(["ip", "netns", "del", h["netns"]], check=False)
        if h.get("veth") and _link_exists(h["veth"]):
            _run(["ip", "link", "del", h["veth"]], check=False)

    def _stop_proxy(self) -> None:
        """Stop the profile's tinyproxy and its socket bridge."""
        px = self.load().get("proxy", {})
        stop_pid(px.get("socat_pid"), px.get("socat_marker"))
        stop_pid(px.get("tinyproxy_pid"), px.get("tinyproxy_marker"))
        with contextlib.suppress(FileNotFoundError):
            self.proxy_sock.unlink()
