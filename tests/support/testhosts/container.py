"""The containers: a host root per host (overlay or extracted), systemd-nspawn under a supervisor
that restarts it on reboot, readiness waits, and the stop sequence."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import time
import uuid
from pathlib import Path

from .common import TestHostsError, _rm_root, _run, _tail, _write, log
from .procs import _reap, _spawn, _wait_gone, descendants, pid_alive
from .rootfs import _sync_ca_certs, ensure_lower, rootfs_mode
from .ssh import SshAccess


class Containers(SshAccess):
    """Roots, nspawn supervisors, waits and stops of a profile's hosts."""

    def _make_root(self, h: dict, tarball: Path) -> float:
        """Extract a fresh root for h from the tarball and give it its identity. Returns secs."""
        t0 = time.monotonic()
        root = Path(h["root"])
        self._rm_host_root(h)
        root.mkdir(parents=True)
        if rootfs_mode() == "overlay":
            lower = ensure_lower(tarball)
            upper, work = Path(h["root"] + ".upper"), Path(h["root"] + ".work")
            upper.mkdir()
            work.mkdir()
            h.update(rootfs_mode="overlay", upper=str(upper), work=str(work))
            self._update_host(h)
            _run(["mount", "-t", "overlay", "overlay", "-o",
                  f"lowerdir={lower},upperdir={upper},workdir={work}", str(root)])
        else:
            h.update(rootfs_mode="extract")
            _run(["tar", "-C", str(root), "--numeric-owner", "--xattrs", "--xattrs-include=*",
                  "-xpf", str(tarball)], timeout=600)
        name = h["name"]
        _write(root / "etc/hostname", name + "\n")
        _write(root / "etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n"
               "::1\tlocalhost ip6-localhost ip6-loopback\n")
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf.tmp")
        os.replace(root / "etc/resolv.conf.tmp", root / "etc/resolv.conf")
        _write(root / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
        _sync_ca_certs(root)
        self._install_ssh_identity(root, name)
        return time.monotonic() - t0

    def _rm_host_root(self, h: dict) -> None:
        """Delete a host's root (unmounting its overlay first, if any)."""
        if h.get("root"):
            _rm_root(Path(h["root"]))
            for extra in (".upper", ".work"):
                _rm_root(Path(h["root"] + extra))

    def _supervisor_script(self, h: dict) -> Path:
        name, root = h["name"], h["root"]
        pidfile = self.state_dir / f"{name}.nspawn.pid"
        stopflag = self.state_dir / f"{name}.stop"
        nspawn = shlex.join([
            "systemd-nspawn", "-D", root, "-b", "--register=no", "--keep-unit",
            "--console=pipe", f"--network-namespace-path=/run/netns/{h['netns']}", "-M", name,
            "--resolv-conf=off", "--link-journal=no",
            # the host's own network namespace: let it manage its firewall (the firewall role's nft)
            "--capability=CAP_NET_ADMIN",
        ])
        script = f"""#!/bin/sh
# qwen27b test host supervisor for {name}: restarts nspawn when the container reboots (133)
PIDFILE={shlex.quote(str(pidfile))}
STOP={shlex.quote(str(stopflag))}
boot=0
while :; do
  [ -e "$STOP" ] && exit 0
  boot=$((boot + 1))
  up=$(cut -d. -f1 /proc/uptime)
  echo "=== [supervisor] boot $boot of {name} at $(date -Is) ==="
  # a fresh time namespace per boot: the container's uptime starts at ~0
  unshare --time --boottime=-"$up" --fork sh -c 'echo $$ > "$0"; exec "$@"' "$PIDFILE" {nspawn}
  rc=$?
  rm -f "$PIDFILE"
  echo "=== [supervisor] nspawn exited rc=$rc ==="
  [ "$rc" -eq 133 ] || exit "$rc"
done
"""
        path = self.state_dir / f"{name}.supervise.sh"
        _write(path, script, 0o755)
        return path

    def _start(self, h: dict) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / f"{h['name']}.stop").unlink()
        script = self._supervisor_script(h)
        pid = _spawn(["sh", script], Path(h["console_log"]))
        h.update(supervisor_pid=pid, supervisor_marker=str(script), started=time.time())
        self._update_host(h)

    def _nspawn_pid(self, h: dict) -> int | None:
        try:
            pid = int((self.state_dir / f"{h['name']}.nspawn.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid, "systemd-nspawn") else None

    def journal_tail(self, name: str, lines: int = 40) -> str:
        """The container's journal, read from its root on the controller (works when SSH
        does not; with --console=pipe systemd writes nothing to the console)."""
        jdir = Path(self.host(name)["root"]) / "var/log/journal"
        if not shutil.which("journalctl") or not jdir.is_dir():
            return "(no journal)"
        cp = _run(["journalctl", "-D", str(jdir), "-b", "-n", str(lines), "--no-pager",
                   "-o", "short-iso"], check=False, timeout=30)
        return (cp.stdout or cp.stderr).rstrip()

    def _fail(self, h: dict, why: str) -> TestHostsError:
        return TestHostsError(
            f"{h['name']} ({h['address']}): {why}\n--- tail of {h['console_log']} ---\n"
            + _tail(Path(h["console_log"]))
            + "\n--- tail of the container's journal ---\n" + self.journal_tail(h["name"]))

    def wait_ssh(self, name: str, timeout: float | None = None) -> float:
        """Wait until sshd answers (ssh-keyscan), refresh known_hosts. Returns seconds waited."""
        h = self.host(name)
        t0 = time.monotonic()
        deadline = t0 + (timeout or self.boot_timeout)
        expected = Path(self.state_dir / "hostkeys" / name / "ssh_host_ed25519_key.pub") \
            .read_text().split()[1]
        while True:
            if not pid_alive(h.get("supervisor_pid"), h.get("supervisor_marker")):
                raise self._fail(h, "the container exited while waiting for sshd")
            cp = _run(["ssh-keyscan", "-T", "2", h["address"]], check=False, timeout=30)
            keys = [line for line in cp.stdout.splitlines() if line and not line.startswith("#")]
            if any(expected in line for line in keys):
                break
            if keys:
                raise self._fail(h, f"{h['address']} answers with an unexpected host key "
                                    "(address clash with another test host?)")
            if time.monotonic() > deadline:
                raise self._fail(h, "sshd did not answer within "
                                    f"{timeout or self.boot_timeout:.0f}s")
            time.sleep(0.25)
        self._set_known_hosts(name, keys)
        return time.monotonic() - t0

    def wait_system(self, name: str, timeout: float | None = None) -> str:
        """`systemctl is-system-running --wait` over SSH; running/degraded -> returned."""
        h = self.host(name)
        t = timeout or self.boot_timeout
        cp = _run(self.ssh_argv(name, f"timeout {int(t)} systemctl is-system-running --wait"),
                  check=False, timeout=t + 15)
        state = cp.stdout.strip().splitlines()[-1] if cp.stdout.strip() else ""
        if state == "running":
            return state
        if state == "degraded":
            failed = self.ssh(name, "systemctl list-units --failed --plain --no-legend",
                              check=False)
            units = " ".join(line.split()[0] for line in failed.stdout.splitlines() if line.strip())
            log(f"{name}: systemd state degraded; failed units: {units or '?'}")
            h["failed_units"] = units
            self._update_host(h)
            return state
        raise self._fail(h, f"systemctl is-system-running said {state!r} (rc={cp.returncode}) "
                            f"{cp.stderr.strip()}")

    def _wait_ready(self, name: str) -> None:
        t0 = time.monotonic()
        self.wait_ssh(name)
        t_ssh = time.monotonic() - t0
        state = self.wait_system(name)
        h = self.host(name)
        h.update(state=state, boot_to_ssh_s=round(t_ssh, 2),
                 boot_to_ready_s=round(time.monotonic() - t0, 2))
        self._update_host(h)
        log(f"{name}: sshd answers after {t_ssh:.1f}s, systemd {state} after "
            f"{time.monotonic() - t0:.1f}s")

    def _stop_container(self, h: dict, grace: float = 30.0) -> None:
        """Poweroff over SSH; if that does not end it, SIGTERM nspawn (orderly halt of the
        container's init); then SIGKILL the whole tree. Never restarts (stop flag)."""
        self._ask_poweroff(h)
        self._await_stop(h, grace)

    def _ask_poweroff(self, h: dict) -> bool:
        """Set the stop flag (no restart) and ask a running host to power off; True if it ran."""
        _write(self.state_dir / f"{h['name']}.stop", "")
        if not self._running_pids(h):
            return False
        if self.ssh_config.exists():
            _run(self.ssh_argv(h["name"], "systemctl poweroff --no-block"), check=False,
                 timeout=20)
            self.end_shared_connection(h)
        return True

    def _running_pids(self, h: dict) -> list[int]:
        pids = []
        if pid_alive(h.get("supervisor_pid"), h.get("supervisor_marker")):
            pids.append(h["supervisor_pid"])
        nspawn = self._nspawn_pid(h)
        if nspawn:
            pids.append(nspawn)
        return pids

    def _await_stop(self, h: dict, grace: float) -> None:
        pids = self._running_pids(h)
        if not pids or _wait_gone(pids, grace):
            return
        nspawn = self._nspawn_pid(h)
        if nspawn:
            log(f"{h['name']}: no clean poweroff within {grace:.0f}s; SIGTERM nspawn {nspawn}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(nspawn, signal.SIGTERM)  # nspawn asks the container's init to halt
            if _wait_gone(pids, 15):
                return
        log(f"{h['name']}: killing {pids} and their process trees")
        for p in pids:
            self._kill_tree(p)

    def _kill_tree(self, pid: int) -> None:
        tree = [pid] + descendants(pid)
        for p in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if not _wait_gone(tree, 10):
            log(f"still alive after SIGKILL: {[p for p in tree if pid_alive(p)]}")
        for p in tree:
            _reap(p)
