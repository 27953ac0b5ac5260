"""The pristine Debian root: host tools, the tarball built once with debootstrap (cached, keyed by
its package list), and the overlay lower dir each host root is mounted over."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from .common import TestHostsError, _locked, _rm_root, _run, _write, cache_dir, log
from .network import PROXY_PORT_INSIDE

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



def rootfs_key(packages=PACKAGES, suite=SUITE, mirror=None) -> str:
    spec = {
        "suite": suite, "variant": "minbase", "packages": sorted(packages),
        "mirror": mirror or os.environ.get("QWEN27B_DEBIAN_MIRROR", DEFAULT_MIRROR),
        "masked": sorted(MASKED_UNITS), "revision": ROOTFS_REVISION,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


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
