"""Throwaway real test hosts: Debian 12 + real systemd in systemd-nspawn, one network
namespace each, reached over SSH (pyinfra, testinfra, plain ssh).

    python3 -m tests.support.testhosts up [-n N]       # boot N hosts (default 1), print a table
                                   [--link-peers]  # ... that reach each other (lab LAN)
    python3 -m tests.support.testhosts status          # name, address, PIDs, systemd state
    python3 -m tests.support.testhosts ssh NAME [CMD]  # ssh into a host (or run CMD there)
    python3 -m tests.support.testhosts reset NAME      # fresh root from the cached tarball, reboot
    python3 -m tests.support.testhosts check [NAME]    # apt-get update + pip download six inside
    python3 -m tests.support.testhosts down            # stop everything, delete roots (keeps cache)

Needs root (network namespaces, veth, nspawn). Stdlib only. See docs/testhosts.md.

Layout (CACHE = $QWEN27B_CACHE or ~/.cache/qwen27b):
    CACHE/rootfs/debian-bookworm-<hash>.tar   pristine root, keyed by the package list
    CACHE/testhosts_id_ed25519[.pub]          the SSH key authorized for root in every host
    CACHE/testhosts/<profile>/                state of one set of hosts:
        state.json  inventory.py  ssh_config  known_hosts  roots/NAME/  NAME.console.log ...

Each host NAME (q27tN) gets: netns NAME, veth vNAME (10.231.N.1/24) <-> eth0 inside
(10.231.N.2/24), no default route (nothing leaves the namespace except through the proxy);
a forward proxy (tinyproxy on 127.0.0.1, started here) bridged into the namespace at
127.0.0.1:3128 with socat over a unix socket; apt and pip inside use that proxy.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

__all__ = ["NspawnHosts", "TestHostsError", "main", "PACKAGES"]

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "curl",
    "iproute2", "ca-certificates", "sudo", "procps", "kmod", "pciutils",
)
# Bump when the customisation baked into the tarball changes (part of the cache key).
ROOTFS_REVISION = 4
# Units that cannot work in an nspawn container; masked in the tarball so that
# `systemctl is-system-running` says "running".
MASKED_UNITS = (
    "console-getty.service",       # --console=pipe: no tty on /dev/console
    "systemd-networkd-wait-online.service",
)
NAME_PREFIX = "q27t"
SUBNET = "10.231.{n}"             # 10.231.N.1 outside, 10.231.N.2 inside
MAX_HOSTS = 250
PROXY_PORT_INSIDE = 3128
# host tools -> Debian package that provides them
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "tinyproxy": "tinyproxy",
    "socat": "socat",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ssh-keyscan": "openssh-client",
    "unshare": "util-linux",
    "tar": "tar",
}
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class TestHostsError(RuntimeError):
    """Anything that stops the test hosts from coming up or going down cleanly."""

    __test__ = False  # not a pytest test class


def log(msg: str) -> None:
    print(f"[testhosts] {msg}", file=sys.stderr, flush=True)


def _run(argv, check=True, capture=True, timeout=None, input=None, env=None):
    """subprocess.run with text output; raises TestHostsError with stderr on failure."""
    try:
        cp = subprocess.run(
            argv, check=False, text=True, input=input, timeout=timeout, env=env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        raise TestHostsError(f"timed out after {timeout}s: {shlex.join(map(str, argv))}") from e
    if check and cp.returncode != 0:
        raise TestHostsError(
            f"command failed (rc={cp.returncode}): {shlex.join(map(str, argv))}\n"
            f"{(cp.stderr or '').strip()}\n{(cp.stdout or '').strip()}".rstrip()
        )
    return cp


# ---------------------------------------------------------------- processes (by PID only)

def _proc_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    """True if PID runs (not a zombie) and, when given, its command line contains marker
    (guards against PID reuse)."""
    if not pid:
        return False
    _reap(pid)
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    if marker is not None:
        cmd = _proc_cmdline(pid)
        return cmd is not None and marker in cmd
    return True


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
                kids += [int(x) for x in text.split()]
    except OSError:
        pass
    return kids


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in _children(p):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _wait_gone(pids, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not any(pid_alive(p) for p in pids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def stop_pid(pid: int | None, marker: str | None, grace: float = 5.0) -> None:
    """SIGTERM, wait, SIGKILL: one process we started, identified by PID (+ marker)."""
    if not pid_alive(pid, marker):
        _reap(pid or 0)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_gone([pid], grace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone([pid], 5)
    _reap(pid)


def _spawn(argv, logfile: Path, cwd=None) -> int:
    """Start a long-running helper detached from our session; returns its PID."""
    with open(logfile, "ab") as out:
        p = subprocess.Popen(
            [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=cwd,
        )
    return p.pid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-64000:].decode(errors="replace")
    except OSError:
        return "(no console log)"
    return "\n".join(data.splitlines()[-lines:])


# ---------------------------------------------------------------- host machine prerequisites

def require_root() -> None:
    if os.geteuid() != 0:
        raise TestHostsError(
            "test hosts need root (network namespaces, veth pairs, systemd-nspawn, debootstrap); "
            "run as root, e.g. `sudo python3 -m tests.support.testhosts up`"
        )


def ensure_host_tools() -> None:
    """apt-get install whatever host tool is missing (a fresh CI machine has none of them)."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if not Path(DEBIAN_KEYRING).exists():
        missing.append("debian-archive-keyring")
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise TestHostsError(f"missing host packages {missing} and no apt-get to install them")
    log(f"installing host packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if _run(argv, check=False, env=env).returncode != 0:
        _run(["apt-get", "update"], env=env, timeout=600)
        _run(argv, env=env, timeout=1200)
    # the Debian tinyproxy package starts its own service where systemd runs it; ours is separate
    still = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if still:
        raise TestHostsError(f"host packages still missing after apt-get install: {still}")


# ---------------------------------------------------------------- paths

def cache_dir() -> Path:
    return Path(os.environ.get("QWEN27B_CACHE") or Path.home() / ".cache" / "qwen27b").absolute()


def rootfs_key(packages=PACKAGES, suite=SUITE, mirror=None) -> str:
    spec = {
        "suite": suite, "variant": "minbase", "packages": sorted(packages),
        "mirror": mirror or os.environ.get("QWEN27B_DEBIAN_MIRROR", DEFAULT_MIRROR),
        "masked": sorted(MASKED_UNITS), "revision": ROOTFS_REVISION,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the pristine root tarball

def _chroot(root: Path, *argv, check=True, timeout=300):
    return _run(["chroot", str(root), *argv], check=check, timeout=timeout,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                     "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"})


def _local_ca_certs() -> list[Path]:
    return sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))


def _sync_ca_certs(root: Path) -> bool:
    """Copy this machine's extra CA certificates into root; update-ca-certificates if changed."""
    dest = root / "usr/local/share/ca-certificates"
    dest.mkdir(parents=True, exist_ok=True)
    want = {p.name: p.read_bytes() for p in _local_ca_certs()}
    have = {p.name: p.read_bytes() for p in dest.glob("*.crt")}
    if want == have:
        return False
    for p in dest.glob("*.crt"):
        p.unlink()
    for name, data in want.items():
        (dest / name).write_bytes(data)
    _chroot(root, "update-ca-certificates", "--fresh")
    return True


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)


def _customise_rootfs(root: Path, mirror: str) -> None:
    proxy = f"http://127.0.0.1:{PROXY_PORT_INSIDE}"
    _write(root / "etc/apt/sources.list",
           f"deb {mirror} {SUITE} main\n"
           f"deb {mirror} {SUITE}-updates main\n"
           f"deb {SECURITY_MIRROR} {SUITE}-security main\n")
    _write(root / "etc/apt/apt.conf.d/80qwen27b-testhost-proxy",
           f'Acquire::http::Proxy "{proxy}";\nAcquire::https::Proxy "{proxy}";\n'
           'Acquire::Retries "3";\n')
    _write(root / "etc/pip.conf",
           f"[global]\nproxy = {proxy}\ncert = /etc/ssl/certs/ca-certificates.crt\n"
           "disable-pip-version-check = true\n")
    # SSH sessions (pam_env) get the proxy too; services do not.
    _write(root / "etc/environment",
           f"http_proxy={proxy}\nhttps_proxy={proxy}\nHTTP_PROXY={proxy}\nHTTPS_PROXY={proxy}\n"
           "no_proxy=localhost,127.0.0.1,::1\nNO_PROXY=localhost,127.0.0.1,::1\n")
    _write(root / "etc/default/locale", "LANG=C.UTF-8\n")
    _write(root / "etc/ssh/sshd_config.d/50-qwen27b-testhost.conf",
           "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
    _sync_ca_certs(root)
    for unit in MASKED_UNITS:
        _chroot(root, "systemctl", "mask", unit)
    _chroot(root, "systemctl", "enable", "ssh.service")
    _chroot(root, "systemctl", "set-default", "multi-user.target")
    # per-host identity is made at extraction time
    for p in (root / "etc/ssh").glob("ssh_host_*"):
        p.unlink()
    _write(root / "etc/machine-id", "")
    _chroot(root, "apt-get", "clean")
    for p in (root / "var/lib/apt/lists").glob("*"):
        if p.is_file():
            p.unlink()


def ensure_rootfs(mirror: str | None = None) -> Path:
    """Return the cached pristine root tarball, building it with debootstrap if missing."""
    mirror = mirror or os.environ.get("QWEN27B_DEBIAN_MIRROR", DEFAULT_MIRROR)
    cdir = cache_dir() / "rootfs"
    cdir.mkdir(parents=True, exist_ok=True)
    tarball = cdir / f"debian-{SUITE}-{rootfs_key(mirror=mirror)}.tar"
    if tarball.exists():
        with contextlib.suppress(OSError):
            os.utime(tarball)  # mtime = last use, for pruning
        return tarball
    with _locked(cdir / ".lock"):
        if tarball.exists():
            return tarball
        build = cdir / f"build-{os.getpid()}"
        _rm_root(build)
        t0 = time.monotonic()
        log(f"debootstrap {SUITE} (minbase + {len(PACKAGES)} packages) into {build}: "
            "takes 1-2 minutes, once")
        argv = ["debootstrap", "--variant=minbase", "--components=main",
                f"--include={','.join(PACKAGES)}", SUITE, str(build), mirror]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        seen, lines, last_beat = set(), [], time.monotonic()
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            lines.append(line)
            m = re.match(r"([IWE]): (\w+)", line)
            if m and (m.group(1) in "WE" or m.group(2) not in seen
                      or m.group(2) in ("Installing", "Base")):
                if m.group(1) == "I":
                    seen.add(m.group(2))
                log(f"  [{time.monotonic() - t0:3.0f}s] {line}")
                last_beat = time.monotonic()
            elif time.monotonic() - last_beat > 10:
                log(f"  [{time.monotonic() - t0:3.0f}s] ... {line}")
                last_beat = time.monotonic()
        rc = proc.wait()
        if rc != 0:
            _rm_root(build)
            raise TestHostsError(f"debootstrap failed (rc={rc}):\n" + "\n".join(lines[-30:]))
        log(f"  debootstrap done in {time.monotonic() - t0:.0f}s; customising")
        _customise_rootfs(build, mirror)
        tmp = tarball.with_suffix(".tar.tmp")
        _run(["tar", "-C", str(build), "--numeric-owner", "--xattrs", "--xattrs-include=*",
              "-cf", str(tmp), "."], timeout=600)
        os.replace(tmp, tarball)
        _rm_root(build)
        log(f"root tarball {tarball} ({tarball.stat().st_size / 1e6:.0f} MB) "
            f"built in {time.monotonic() - t0:.0f}s")
        _prune_rootfs_cache(cdir, keep=tarball)
    return tarball


def _prune_rootfs_cache(cdir: Path, keep: Path, max_age_days: float = 7) -> None:
    """Delete other root tarballs (and their overlay lower dirs) unused for a week."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    for p in cdir.glob("debian-*"):
        stem = p.with_suffix("")
        if stem == keep.with_suffix("") or str(p) in mountinfo:
            continue
        tar = stem.with_suffix(".tar")
        with contextlib.suppress(OSError):
            if time.time() - (tar if tar.exists() else p).stat().st_mtime > max_age_days * 86400:
                log(f"pruning unused root cache {p}")
                _rm_root(p) if p.is_dir() else p.unlink()


def rootfs_mode() -> str:
    """How a host root is made from the tarball: "extract" (default: a full private copy,
    ~5 s, ~450 MB per host) or "overlay" ($QWEN27B_TESTHOSTS_ROOTFS=overlay: an overlayfs
    over a shared pristine copy extracted once; reset and down take well under a second)."""
    mode = os.environ.get("QWEN27B_TESTHOSTS_ROOTFS", "overlay")
    if mode not in ("extract", "overlay"):
        raise TestHostsError(f"QWEN27B_TESTHOSTS_ROOTFS must be extract or overlay, not {mode!r}")
    if mode == "overlay" and "overlay" not in Path("/proc/filesystems").read_text():
        raise TestHostsError("QWEN27B_TESTHOSTS_ROOTFS=overlay but the kernel has no overlayfs")
    return mode


def ensure_lower(tarball: Path) -> Path:
    """The pristine tree (overlay lower dir) extracted once from tarball; never modified."""
    lower = tarball.with_suffix(".d")
    done = lower / ".qwen27b-complete"
    if done.exists():
        return lower
    with _locked(tarball.parent / ".lock"):
        if not done.exists():
            _rm_root(lower)
            lower.mkdir()
            _run(["tar", "-C", str(lower), "--numeric-owner", "--xattrs", "--xattrs-include=*",
                  "-xpf", str(tarball)], timeout=600)
            done.write_text("")
    return lower


# ---------------------------------------------------------------- helpers

@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) if path.exists() else str(path)
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return out


def _rm_root(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    for mp in sorted(_mounts_under(path), key=len, reverse=True):
        _run(["umount", "-l", mp], check=False)
    if _mounts_under(path):
        raise TestHostsError(f"refusing to delete {path}: still has mounts under it")
    _run(["rm", "-rf", "--one-file-system", str(path)], timeout=300)


def _netns_list() -> list[str]:
    cp = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _subnet_in_use(n: int) -> bool:
    cp = _run(["ip", "-o", "-4", "addr", "show"], check=False)
    return f" {SUBNET.format(n=n)}." in cp.stdout


# ---------------------------------------------------------------- the hosts

class NspawnHosts:
    """A set ("profile") of test hosts with its own state dir. Not thread-safe."""

    __test__ = False

    def __init__(self, profile: str = "default", cache: Path | None = None, *,
                 boot_timeout: float = 180.0):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", profile):
            raise ValueError(f"bad profile name {profile!r}")
        self.profile = profile
        self.cache = Path(cache) if cache else cache_dir()
        self.state_dir = self.cache / "testhosts" / profile
        self.boot_timeout = boot_timeout
        self.key = self.cache / "testhosts_id_ed25519"
        self.known_hosts = self.state_dir / "known_hosts"
        self.ssh_config = self.state_dir / "ssh_config"
        self.inventory = self.state_dir / "inventory.py"
        self.state_file = self.state_dir / "state.json"
        self.proxy_sock = self.state_dir / "proxy.sock"
        if len(str(self.proxy_sock)) > 100:  # sun_path limit
            self.proxy_sock = Path("/tmp") / (
                "qwen27b-" + hashlib.sha1(str(self.state_dir).encode()).hexdigest()[:12] + ".sock")

    # -- state
    def load(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {"profile": self.profile, "hosts": {}, "proxy": {}}

    def save(self, st: dict) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2, sort_keys=True))
        os.replace(tmp, self.state_file)

    @property
    def hosts(self) -> list[dict]:
        return sorted(self.load()["hosts"].values(), key=lambda h: h["index"])

    def host(self, name: str) -> dict:
        h = self.load()["hosts"].get(name)
        if h is None:
            raise TestHostsError(f"no test host {name!r} in profile {self.profile!r}")
        return h

    # -- ssh
    def ssh_argv(self, name_or_addr: str, *cmd: str, tty: bool = False) -> list[str]:
        argv = ["ssh", "-F", str(self.ssh_config)]
        if tty:
            argv.append("-t")
        return argv + [name_or_addr, *cmd]

    def ssh_options(self) -> list[str]:
        return [
            "-o", "User=root", "-o", f"IdentityFile={self.key}", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR",
        ]

    def ssh(self, name: str, command: str, *, check: bool = True, timeout: float = 120):
        """Run a shell command on a host over SSH; returns CompletedProcess (text)."""
        return _run(self.ssh_argv(name, command), check=check, timeout=timeout)

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

    def _ensure_key(self) -> None:
        if not self.key.exists():
            self.key.parent.mkdir(parents=True, exist_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "qwen27b-testhosts",
                  "-f", str(self.key)])
        os.chmod(self.key, 0o600)

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
        raise TestHostsError("no free 10.231.N.0/24 subnet / q27tN name")

    def _create_host(self, tarball: Path) -> dict:
        with _locked(self.cache / "testhosts" / ".alloc.lock"):
            n = self._allocate()
            name = f"{NAME_PREFIX}{n}"
            h = {
                "name": name, "index": n, "netns": name, "veth": f"v{name}",
                "address": SUBNET.format(n=n) + ".2", "gateway": SUBNET.format(n=n) + ".1",
                "root": str(self.state_dir / "roots" / name),
                "console_log": str(self.state_dir / f"{name}.console.log"),
            }
            st = self.load()
            st["hosts"][name] = h
            self.save(st)
            # network namespace + veth; recorded first so that down() can always undo it
            _run(["ip", "netns", "add", name])
        try:
            ns = ["ip", "netns", "exec", name]
            _run(["ip", "link", "add", h["veth"], "type", "veth", "peer", "name", "eth0",
                  "netns", name])
            _run(["ip", "addr", "add", h["gateway"] + "/24", "dev", h["veth"]])
            _run(["ip", "link", "set", h["veth"], "up"])
            _run(ns + ["ip", "link", "set", "lo", "up"])
            _run(ns + ["ip", "addr", "add", h["address"] + "/24", "dev", "eth0"])
            _run(ns + ["ip", "link", "set", "eth0", "up"])
            self._ensure_bridge(h)
            self._make_root(h, tarball)
            self._start(h)
            log(f"{name}: {h['address']} booting (supervisor pid {h['supervisor_pid']})")
            return h
        except BaseException:
            self._teardown_host(h)
            self._drop_host(name)
            raise

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

    def _update_host(self, h: dict) -> None:
        st = self.load()
        st["hosts"][h["name"]] = h
        self.save(st)

    def _drop_host(self, name: str) -> None:
        st = self.load()
        st["hosts"].pop(name, None)
        self.save(st)

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
        # host keys: made once per host name and kept, so known_hosts stays valid on reset
        kdir = self.state_dir / "hostkeys" / name
        kdir.mkdir(parents=True, exist_ok=True)
        for kt in ("ed25519", "ecdsa", "rsa"):
            k = kdir / f"ssh_host_{kt}_key"
            if not k.exists():
                _run(["ssh-keygen", "-q", "-t", kt, "-N", "", "-C", f"root@{name}", "-f", str(k)])
            for src in (k, k.with_name(k.name + ".pub")):
                dst = root / "etc/ssh" / src.name
                shutil.copyfile(src, dst)
                os.chmod(dst, 0o600 if src == k else 0o644)
        sshdir = root / "root/.ssh"
        sshdir.mkdir(mode=0o700, exist_ok=True)
        _write(sshdir / "authorized_keys", Path(str(self.key) + ".pub").read_text(), 0o600)
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

    def _set_known_hosts(self, name: str, keys: list[str]) -> None:
        h = self.host(name)
        with _locked(self.state_dir / ".known_hosts.lock"):
            lines = []
            with contextlib.suppress(OSError):
                lines = [ln for ln in self.known_hosts.read_text().splitlines()
                         if ln.split(" ", 1)[0] not in (h["address"], name)]
            for k in keys:
                _, rest = k.split(" ", 1)
                lines.append(f"{h['address']} {rest}")
                lines.append(f"{name} {rest}")
            _write(self.known_hosts, "\n".join(lines) + "\n", 0o600)

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

    # -- down
    def _stop_container(self, h: dict, grace: float = 30.0) -> None:
        """Poweroff over SSH; if that does not end it, SIGTERM nspawn (orderly halt of the
        container's init); then SIGKILL the whole tree. Never restarts (stop flag)."""
        _write(self.state_dir / f"{h['name']}.stop", "")
        if self._running_pids(h) and self.ssh_config.exists():
            _run(self.ssh_argv(h["name"], "systemctl poweroff --no-block"), check=False,
                 timeout=20)
        self._await_stop(h, grace)

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

    def _teardown_host(self, h: dict, stop: bool = True) -> None:
        if stop:
            self._stop_container(h)
        stop_pid(h.get("bridge_pid"), h.get("bridge_marker"))
        if h.get("netns") in _netns_list():
            _run(["ip", "netns", "del", h["netns"]], check=False)
        if h.get("veth") and _link_exists(h["veth"]):
            _run(["ip", "link", "del", h["veth"]], check=False)
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
        live = []
        for h in hosts:
            _write(self.state_dir / f"{h['name']}.stop", "")
            if self._running_pids(h):
                live.append(h)
                if self.ssh_config.exists():
                    _run(self.ssh_argv(h["name"], "systemctl poweroff --no-block"),
                         check=False, timeout=20)
        for h in live:
            self._await_stop(h, 30.0)
        for h in hosts:
            self._teardown_host(h, stop=True)
            self._drop_host(h["name"])
            log(f"{h['name']}: down")
        px = self.load().get("proxy", {})
        stop_pid(px.get("socat_pid"), px.get("socat_marker"))
        stop_pid(px.get("tinyproxy_pid"), px.get("tinyproxy_marker"))
        with contextlib.suppress(FileNotFoundError):
            self.proxy_sock.unlink()
        leftover = {k: p for k, p in self.pids().items() if pid_alive(p)}
        if leftover:
            raise TestHostsError(f"processes still running after down: {leftover}")
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
                         "supervisor_pid": sup if alive else None,
                         "nspawn_pid": self._nspawn_pid(h), "state": state})
        return rows

    def _write_client_files(self) -> None:
        hosts = self.hosts
        cfg = []
        inv = ["# generated by tests.support.testhosts: throwaway nspawn test hosts "
               f"(profile {self.profile})", "", "testhosts = ["]
        for h in hosts:
            cfg += [f"Host {h['name']} {h['address']}", f"    HostName {h['address']}",
                    "    User root", f"    IdentityFile {self.key}", "    IdentitiesOnly yes",
                    f"    UserKnownHostsFile {self.known_hosts}",
                    "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes",
                    "    BatchMode yes", "    ConnectTimeout 5", "    LogLevel ERROR", ""]
            data = {
                "ssh_hostname": h["address"], "ssh_user": "root", "ssh_key": str(self.key),
                "ssh_known_hosts_file": str(self.known_hosts),
                "ssh_strict_host_key_checking": "yes",
                "ssh_look_for_keys": False, "ssh_allow_agent": False,
                "testhost_root": h["root"],
            }
            inv.append(f"    ({h['name']!r}, {data!r}),")
        inv += ["]", ""]
        _write(self.ssh_config, "\n".join(cfg))
        _write(self.inventory, "\n".join(inv))


# ---------------------------------------------------------------- CLI

def all_profiles(cache: Path | None = None) -> list[str]:
    base = (Path(cache) if cache else cache_dir()) / "testhosts"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "state.json").exists())


def print_table(rows: list[dict]) -> None:
    cols = ["profile", "name", "address", "supervisor_pid", "nspawn_pid", "state"]
    data = [[str(r.get(c) if r.get(c) is not None else "-") for c in cols] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) if data else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for d in data:
        print("  ".join(v.ljust(w) for v, w in zip(d, widths)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.support.testhosts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None,
                    help="set of hosts (state dir); default $QWEN27B_TESTHOSTS_PROFILE or "
                         "'default'. status/down without --profile cover every profile")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="boot N hosts (reuses running ones)")
    p_up.add_argument("-n", type=int, default=1)
    p_up.add_argument("--timeout", type=float, default=180.0, help="per-host boot timeout (s)")
    p_up.add_argument("--link-peers", action="store_true",
                      help="let the hosts reach each other (routes + forwarding on their veths only)")
    sub.add_parser("down", help="stop all hosts and helpers, delete roots (keeps the cache)")
    sub.add_parser("status", help="table of hosts")
    p_ssh = sub.add_parser("ssh", help="ssh into a host")
    p_ssh.add_argument("name")
    p_ssh.add_argument("command", nargs=argparse.REMAINDER)
    p_reset = sub.add_parser("reset", help="fresh root from the tarball, boot again")
    p_reset.add_argument("name")
    p_check = sub.add_parser("check", help="apt-get update and pip download six inside")
    p_check.add_argument("name", nargs="?")
    sub.add_parser("paths", help="print the inventory / ssh_config / key paths")
    args = ap.parse_args(argv)

    explicit = args.profile or os.environ.get("QWEN27B_TESTHOSTS_PROFILE")
    profile = explicit or "default"
    try:
        if args.cmd in ("down", "status"):
            profiles = [explicit] if explicit else (all_profiles() or [profile])
            if args.cmd == "down":
                for p in profiles:
                    NspawnHosts(p).down()
                log("down: nothing of ours left running")
                return 0
            rows = [r for p in profiles for r in NspawnHosts(p).status()]
            print_table(rows)
            return 0
        lab = NspawnHosts(profile)
        if args.cmd == "up":
            lab.boot_timeout = args.timeout
            try:
                lab.up(args.n)
                if args.link_peers:
                    lab.link_peers()
            except TestHostsError as e:
                raise TestHostsError(f"{e}\n(hosts left as they are, for a look: "
                                     "`python3 -m tests.support.testhosts down` cleans up)") from e
            except KeyboardInterrupt:
                log("interrupted: tearing down")
                lab.down()
                return 130
            print_table(lab.status())
            print(f"inventory:  {lab.inventory}\nssh_config: {lab.ssh_config}\n"
                  f"e.g.:       pyinfra -y {lab.inventory} exec -- uptime\n"
                  f"            ssh -F {lab.ssh_config} {lab.hosts[0]['name']}")
            return 0
        if args.cmd == "ssh":
            lab.host(args.name)
            argv2 = lab.ssh_argv(args.name, *args.command, tty=not args.command)
            os.execvp(argv2[0], argv2)
        if args.cmd == "reset":
            lab.reset(args.name)
            print_table(lab.status())
            return 0
        if args.cmd == "check":
            names = [args.name] if args.name else [h["name"] for h in lab.hosts]
            for name in names:
                t0 = time.monotonic()
                lab.ssh(name, "apt-get update -q", timeout=300)
                t1 = time.monotonic()
                lab.ssh(name, "set -e; python3 -m venv /tmp/q27t-check; "
                              "/tmp/q27t-check/bin/pip download -q -d /tmp/q27t-dl six; "
                              "ls /tmp/q27t-dl; rm -rf /tmp/q27t-check /tmp/q27t-dl", timeout=300)
                print(f"{name}: apt-get update ok ({t1 - t0:.1f}s), pip download six ok "
                      f"({time.monotonic() - t1:.1f}s)")
            return 0
        if args.cmd == "paths":
            print(f"inventory {lab.inventory}\nssh_config {lab.ssh_config}\n"
                  f"known_hosts {lab.known_hosts}\nkey {lab.key}\nstate {lab.state_file}")
            return 0
    except TestHostsError as e:
        print(f"testhosts: error: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
