"""SSH to the hosts: the client key, per-host host keys (kept across resets), known_hosts, and
the client files (ssh_config, the pyinfra inventory)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from .common import TestHostsError, _locked, _run, _write
from .state import ProfileState

ADMIN_USER = "admin"  # a non-root SSH user with passwordless sudo on every test host
PASSWORD_SUDO_USER = "pwadmin"  # and one whose sudo asks for a password


def mux_options(mux_dir: Path) -> list[str]:
    """One shared connection per host (OpenSSH's ControlMaster), for the tests' many short commands:
    a fresh login costs the 2 shared cores ~0.14 CPU-s and 0.24 s (key exchange, sshd's re-exec, a
    PAM session and logind's scope on the host), a command over the shared one ~0.02 CPU-s and 0.02 s
    (measured here, issue 31). The master lives 30 s past its last command; keepalives end it within
    15 s when its host vanished without closing it, and `down`/`reset` end it first."""
    return ["    ControlMaster auto", f"    ControlPath {mux_dir}/%C", "    ControlPersist 30",
            "    ServerAliveInterval 5", "    ServerAliveCountMax 3"]


class SshAccess(ProfileState):
    """SSH keys, argv and client files of a profile."""

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

    def end_shared_connection(self, h: dict) -> None:
        """Close the host's shared SSH connection (its master exits), for a host about to go away."""
        if self.ssh_config.exists():
            for target in [h["name"]] + ([h["address6"]] if h.get("address6") else []):
                with contextlib.suppress(TestHostsError):  # none open: ssh says so, exit 255
                    _run(["ssh", "-F", str(self.ssh_config), "-O", "exit", target], check=False, timeout=10)

    def ssh(self, name: str, command: str, *, check: bool = True, timeout: float = 120):
        """Run a shell command on a host over SSH; returns CompletedProcess (text)."""
        return _run(self.ssh_argv(name, command), check=check, timeout=timeout)

    def _ensure_key(self) -> None:
        if not self.key.exists():
            self.key.parent.mkdir(parents=True, exist_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "qwen27b-testhosts",
                  "-f", str(self.key)])
        os.chmod(self.key, 0o600)

    def _install_ssh_identity(self, root: Path, name: str) -> None:
        """Host keys into root's /etc/ssh and our key as root's authorized_keys."""
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
        self._add_sudo_admin(root)

    def _add_sudo_admin(self, root: Path) -> None:
        """The account README tells labs to deploy with (issue 32): `admin`, a non-root user with our
        key and passwordless sudo; the e2e lab deploys as it (`_sudo = True`), one module as root.
        And `pwadmin`, whose sudo asks for a password it does not have ("a password is required")."""
        for user, rule in ((ADMIN_USER, "NOPASSWD: ALL"), (PASSWORD_SUDO_USER, "ALL")):
            if not any(line.startswith(f"{user}:") for line in (root / "etc/passwd").read_text().splitlines()):
                _run(["useradd", "--root", str(root), "--create-home", "--shell", "/bin/bash", user])
            uid, gid = next(map(int, line.split(":")[2:4]) for line in (root / "etc/passwd").read_text().splitlines()
                            if line.startswith(f"{user}:"))
            _write(root / f"etc/sudoers.d/{user}", f"{user} ALL=(ALL:ALL) {rule}\n", 0o440)
            self._authorize(root, user, uid, gid)

    def _authorize(self, root: Path, user: str, uid: int, gid: int) -> None:
        """Our client key in the user's authorized_keys, owned by the user."""
        sshdir = root / "home" / user / ".ssh"
        sshdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write(sshdir / "authorized_keys", Path(str(self.key) + ".pub").read_text(), 0o600)
        for path in (sshdir.parent, sshdir, sshdir / "authorized_keys"):
            os.chown(path, uid, gid)

    def _set_known_hosts(self, name: str, keys: list[str]) -> None:
        h = self.host(name)
        with _locked(self.state_dir / ".known_hosts.lock"):
            names = [h["address"], name] + ([h["address6"]] if h.get("address6") else [])
            lines = []
            with contextlib.suppress(OSError):
                lines = [ln for ln in self.known_hosts.read_text().splitlines()
                         if ln.split(" ", 1)[0] not in names]
            for k in keys:
                _, rest = k.split(" ", 1)
                lines += [f"{n} {rest}" for n in names]
            _write(self.known_hosts, "\n".join(lines) + "\n", 0o600)

    def _write_client_files(self) -> None:
        hosts = self.hosts
        cfg = []
        inv = ["# generated by tests.support.testhosts: throwaway nspawn test hosts "
               f"(profile {self.profile})", "", "testhosts = ["]
        for h in hosts:
            # the IPv6 address has a stanza of its own: under the name's, HostName would send it to IPv4
            stanzas = [(f"{h['name']} {h['address']}", h["address"])]
            stanzas += [(h["address6"], h["address6"])] if h.get("address6") else []
            for patterns, hostname in stanzas:
                cfg += [f"Host {patterns}", f"    HostName {hostname}",
                        "    User root", f"    IdentityFile {self.key}", "    IdentitiesOnly yes",
                        f"    UserKnownHostsFile {self.known_hosts}",
                        "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes",
                        "    BatchMode yes", "    ConnectTimeout 5", "    LogLevel ERROR", *mux_options(self.mux_dir), ""]
            data = {
                "ssh_hostname": h["address"], "ssh_user": "root", "ssh_key": str(self.key),
                "ssh_known_hosts_file": str(self.known_hosts),
                "ssh_strict_host_key_checking": "yes",
                "ssh_look_for_keys": False, "ssh_allow_agent": False,
                "testhost_root": h["root"],
                # the e2e tests call the API open unless they give a key (issue 25's lab key is
                # covered by tests/unit/slow/test_apikey.py)
                "qwen27b_api_key_file": "none",
            }
            inv.append(f"    ({h['name']!r}, {data!r}),")
        inv += ["]", ""]
        self.mux_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write(self.ssh_config, "\n".join(cfg))
        _write(self.inventory, "\n".join(inv))
