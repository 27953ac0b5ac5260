"""NspawnHosts: a profile's lifecycle (up, reset, down, status), made of its collaborators."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from .common import TestHostsError, _locked, _rm_root, _run, log, require_root
from .container import Containers
from .network import NAME_PREFIX, SUBNET, SUBNET6, ProxyNetwork
from .procs import descendants, pid_alive
from .rootfs import ensure_host_tools, ensure_rootfs


class NspawnHosts(Containers, ProxyNetwork):
    """A set ("profile") of test hosts with its own state dir. Not thread-safe."""

    __test__ = False

    def pids(self) -> dict[str, int]:
        """Every live PID this profile started (for leak checks)."""
        st = self.load()
        out = {}
        px = st.get("proxy", {})
        for key in ("tinyproxy_pid", "socat_pid"):
            if px.get(key):
                out[f"proxy.{key}"] = px[key]
        for h in st["hosts"].values():
            for key in ("supervisor_pid", "bridge_pid"):
                if h.get(key):
                    out[f"{h['name']}.{key}"] = h[key]
            npid = self._nspawn_pid(h)
            if npid:
                out[f"{h['name']}.nspawn_pid"] = npid
                for d in descendants(npid):
                    out[f"{h['name']}.container.{d}"] = d
        return out

    # -- up
    def up(self, n: int = 1) -> list[dict]:
        require_root()
        ensure_host_tools()
        self._ensure_key()
        tarball = ensure_rootfs()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "roots").mkdir(exist_ok=True)
        st = self.load()
        # drop hosts whose supervisor died (stale state)
        for name, h in list(st["hosts"].items()):
            if not pid_alive(h.get("supervisor_pid"), h.get("supervisor_marker")):
                log(f"{name}: stale (supervisor gone), cleaning up")
                self._teardown_host(h)
                st = self.load()
                st["hosts"].pop(name, None)
                self.save(st)
        self._ensure_proxy()
        for h in self.hosts:
            self._ensure_bridge(h)
        while len(self.load()["hosts"]) < n:
            self._create_host(tarball)
        self._write_client_files()
        names = [h["name"] for h in self.hosts]
        for name in names:
            self._wait_ready(name)
        self._write_client_files()
        return self.hosts

    def _create_host(self, tarball: Path) -> dict:
        with _locked(self.cache / "testhosts" / ".alloc.lock"):
            n = self._allocate()
            name = f"{NAME_PREFIX}{n}"
            h = {
                "name": name, "index": n, "netns": name, "veth": f"v{name}",
                "address": SUBNET.format(n=n) + ".2", "gateway": SUBNET.format(n=n) + ".1",
                "address6": SUBNET6.format(n=n) + "2", "gateway6": SUBNET6.format(n=n) + "1",
                "root": str(self.state_dir / "roots" / name),
                "console_log": str(self.state_dir / f"{name}.console.log"),
            }
            st = self.load()
            st["hosts"][name] = h
            self.save(st)
            # network namespace + veth; recorded first so that down() can always undo it
            _run(["ip", "netns", "add", name])
        try:
            self._add_links(h)
            self._ensure_bridge(h)
            self._make_root(h, tarball)
            self._start(h)
            log(f"{name}: {h['address']} booting (supervisor pid {h['supervisor_pid']})")
            return h
        except BaseException:
            self._teardown_host(h)
            self._drop_host(name)
            raise

    # -- reset
    def reset(self, name: str) -> dict:
        """Stop NAME, re-extract its root from the tarball, boot it again, wait until ready."""
        require_root()
        h = self.host(name)
        t0 = time.monotonic()
        self._stop_container(h)
        secs = self._make_root(h, ensure_rootfs())
        self._start(h)
        self._wait_ready(name)
        h = self.host(name)
        h.update(reset_root_s=round(secs, 2), reset_total_s=round(time.monotonic() - t0, 2))
        self._update_host(h)
        log(f"{name}: reset in {time.monotonic() - t0:.1f}s (new root {secs:.1f}s)")
        return h

    def _teardown_host(self, h: dict, stop: bool = True) -> None:
        if stop:
            self._stop_container(h)
        self._del_links(h)
        self._rm_host_root(h)
        for suffix in (".stop", ".nspawn.pid"):
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / f"{h['name']}{suffix}").unlink()

    def down(self) -> None:
        """Stop every host and helper of this profile; delete roots and state. Idempotent."""
        require_root()
        st = self.load()
        hosts = list(st["hosts"].values())
        # ask all to power off first, then wait for all (shutdowns overlap)
        live = [h for h in hosts if self._ask_poweroff(h)]
        for h in live:
            self._await_stop(h, 30.0)
        for h in hosts:
            self._teardown_host(h, stop=True)
            self._drop_host(h["name"])
            log(f"{h['name']}: down")
        self._stop_proxy()
        leftover = {k: p for k, p in self.pids().items() if pid_alive(p)}
        if leftover:
            raise TestHostsError(f"processes still running after down: {leftover}")
        shutil.rmtree(self.mux_dir, ignore_errors=True)  # the masters ended with their hosts
        if self.state_dir.exists():
            self._keep_logs()
            _rm_root(self.state_dir)

    def _keep_logs(self, keep: int = 10) -> None:
        """Move this profile's logs to CACHE/testhosts/logs/PROFILE (the newest `keep` sets
        are kept) so that a failed run can still be looked at after teardown."""
        logs = [p for p in self.state_dir.iterdir() if p.suffix in (".log", ".out")]
        if not logs:
            return
        base = self.cache / "testhosts" / "logs"
        dest = base / self.profile
        _rm_root(dest)
        dest.mkdir(parents=True)
        for p in logs:
            shutil.move(str(p), dest / p.name)
        old = sorted(base.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)[keep:]
        for p in old:
            _rm_root(p)

    # -- status / client files
    def status(self, probe: bool = True) -> list[dict]:
        rows = []
        for h in self.hosts:
            sup = h.get("supervisor_pid")
            alive = pid_alive(sup, h.get("supervisor_marker"))
            state = "dead"
            if alive:
                state = "booting"
                if probe and self.ssh_config.exists():
                    cp = _run(self.ssh_argv(h["name"], "systemctl is-system-running"),
                              check=False, timeout=15)
                    state = cp.stdout.strip() or f"no-ssh(rc={cp.returncode})"
            rows.append({"profile": self.profile, "name": h["name"], "address": h["address"],
                         "address6": h.get("address6"),
                         "supervisor_pid": sup if alive else None,
                         "nspawn_pid": self._nspawn_pid(h), "state": state})
        return rows
