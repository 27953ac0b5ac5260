"""The inventory `./run up N` writes (issue 48 item 4): README's lab layout on the test hosts, logged
in as the `admin` sudo account with the harness's key, a gateway group with named client keys, and
read by pyinfra's own inventory loader as a lab's inventory is."""

from __future__ import annotations

import json
import os
import re
import runpy
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.testhosts.labinventory import CLIENTS, ensure_key_files, lab_files

HOSTS = [{"name": f"q27t{n}", "address": f"10.231.{n}.2"} for n in (7, 8, 9)]


def write(tmp_path: Path, hosts=HOSTS) -> Path:
    key, known = tmp_path / "id_ed25519", tmp_path / "known_hosts"
    for rel, text in lab_files(hosts, key=key, known_hosts=known, secrets_dir=tmp_path / "secrets").items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    ensure_key_files(tmp_path / "secrets")
    return tmp_path / "lab.py"


def test_the_lab_logs_in_as_the_sudo_user_with_the_key(tmp_path):
    write(tmp_path)
    data = runpy.run_path(str(tmp_path / "group_data/all.py"))
    assert data["ssh_user"] == "admin" and data["_sudo"] is True
    assert data["ssh_key"] == str(tmp_path / "id_ed25519")
    assert data["ssh_known_hosts_file"] == str(tmp_path / "known_hosts")
    assert data["qwen27b_api_key_file"] == str(tmp_path / "secrets/lab.key")
    config = (tmp_path / "ssh_config").read_text()
    assert config.count("User admin") == len(HOSTS) and "User root" not in config
    assert f"IdentityFile {tmp_path / 'id_ed25519'}" in config


def test_the_last_host_is_the_gateway_with_named_client_keys(tmp_path):
    inventory = runpy.run_path(str(write(tmp_path)))
    assert [name for name, _ in inventory["serving"]] == ["q27t7", "q27t8"]
    assert inventory["qwen27b_gateway"] == [("q27t9", {"ssh_hostname": "10.231.9.2"})]
    gateway = runpy.run_path(str(tmp_path / "group_data/qwen27b_gateway.py"))
    assert gateway["qwen27b_gateway_key_files"] == [str(tmp_path / f"secrets/{c}.key") for c in CLIENTS]
    serving = runpy.run_path(str(tmp_path / "group_data/serving.py"))
    assert serving["qwen27b_profile"] == "cpu-smoke" and serving["qwen27b_metrics_allow"] == ["10.231.9.2/32"]


def test_key_files_are_made_once_0600_and_kept(tmp_path):
    made = ensure_key_files(tmp_path / "secrets")
    assert len(made) == 1 + len(CLIENTS)
    before = {p: p.read_text() for p in made}
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in made)
    assert len(set(before.values())) == len(made)
    assert ensure_key_files(tmp_path / "secrets") == [] and {p: p.read_text() for p in made} == before


def test_one_host_is_not_a_lab(tmp_path):
    with pytest.raises(ValueError, match="two hosts"):
        lab_files(HOSTS[:1], key=tmp_path / "k", known_hosts=tmp_path / "kh", secrets_dir=tmp_path)


def test_pyinfra_reads_it_with_its_group_data(tmp_path):
    """pyinfra's own CLI (`debug-inventory`: group_data beside the inventory, nothing connected):
    each host as admin with sudo, the serving hosts with the CPU profile, the gateway without."""
    inventory = write(tmp_path / "lab")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    done = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "debug-inventory"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    parts = re.split(r"^\[(q27t\d+)\] *$", done.stdout + done.stderr, flags=re.M)  # [head, name, block, name, block...]
    names, blocks = parts[1::2], parts[2::2]
    assert names == [h["name"] for h in HOSTS], done.stdout
    found = {}
    for name, block in zip(names, blocks):
        groups = re.search(r"--> Groups: (.*)", block).group(1).split(", ")
        data = json.loads(block[block.index("{"):block.rindex("}") + 1])
        found[name] = (data["ssh_user"], data["_sudo"], data["ssh_hostname"], data.get("qwen27b_profile"), groups)
    assert found["q27t7"][:4] == ("admin", True, "10.231.7.2", "cpu-smoke") and "serving" in found["q27t7"][4]
    assert found["q27t9"][:4] == ("admin", True, "10.231.9.2", None) and "qwen27b_gateway" in found["q27t9"][4]
