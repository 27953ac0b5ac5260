"""Secure by default (issue 25): a host whose data names no API key file is served with the route
guard and the lab key the controller makes once (controller/apikey.py), beside the inventory, 0600,
reused on every run; `qwen27b_api_key_file: none` serves open by choice. The key is never printed."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path


from qwen27b.controller import apikey
from qwen27b.onhost.secretfile import load_secret
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.urlsecret import with_lab_key
from tests.support.paths import ROOT



def test_the_key_is_made_once_private_and_reused(tmp_path, monkeypatch):
    monkeypatch.delenv(apikey.STATE_ENV, raising=False)
    inventory = tmp_path / "lab" / "hosts.py"
    inventory.parent.mkdir()
    inventory.write_text("hosts = []\n")
    path = apikey.key_file(str(inventory))
    assert path == tmp_path / "lab" / ".qwen27b" / "api.key"
    assert apikey.ensure(path) is True
    key = load_secret(str(path))
    assert key.startswith("sk-qwen27b-") and len(key) > 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert apikey.ensure(path) is False and load_secret(str(path)) == key  # reused, not replaced
    other = tmp_path / "other" / "api.key"
    apikey.ensure(other)
    assert load_secret(str(other)) != key  # random
    monkeypatch.setenv(apikey.STATE_ENV, str(tmp_path / "state"))
    assert apikey.key_file(str(inventory)) == tmp_path / "state" / "api.key"
    assert key not in apikey.how_to_use(path, True)


def test_the_operator_tools_read_the_lab_key_but_never_make_it(tmp_path, monkeypatch):
    """doctor compares a unit with the plan from the host's data: the lab key's file is in it when
    the key exists (the deploy's route guard), absent otherwise; a named file or `none` stays."""
    monkeypatch.setenv(apikey.STATE_ENV, str(tmp_path / "state"))
    assert apikey.lab_data({"qwen27b_port": 8001}, None) == {"qwen27b_port": 8001}
    assert not (tmp_path / "state").exists()
    apikey.ensure(apikey.key_file(None))
    path = str(tmp_path / "state" / "api.key")
    assert apikey.lab_data({"qwen27b_port": 8001}, None) == {"qwen27b_port": 8001, "qwen27b_api_key_file": path}
    assert apikey.lab_data({"qwen27b_api_key_file": "none"}, None) == {"qwen27b_api_key_file": "none"}


def test_a_symlink_in_the_keys_place_is_not_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "api.key").symlink_to(target)
    assert apikey.ensure(tmp_path / "state" / "api.key") is False and not target.exists()


def test_none_is_the_explicit_open_api_and_a_named_file_wins(tmp_path):
    assert settings_for("h", {"qwen27b_api_key_file": "none"}).api_key_file is None
    assert with_lab_key({"qwen27b_api_key_file": "none"}, "/k") == {"qwen27b_api_key_file": "none"}
    assert with_lab_key({"qwen27b_port": 8001}, "/k") == {"qwen27b_port": 8001, "qwen27b_api_key_file": "/k"}


def _dry(inventory: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y"], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    return out


def _block(out: str, host: str) -> str:
    """The host's parts of the output (its decision block and its operations)."""
    return "".join(part for part in out.split("\n== @fake/") if part.startswith(f"{host}:"))


def test_a_deploy_without_a_key_file_guards_the_api_with_the_lab_key(tmp_path):
    """The real `pyinfra INVENTORY deploy.py --dry` on recorded hosts: the host that names no key
    file gets the route guard, its plan names the key's file and how to use it, and the same key
    serves the next run; the host with `none` plans no guard. No key in the output."""
    inventory = tmp_path / "lab.py"
    inventory.write_text(
        "from inventory.recorded import _fake\n"
        "name, data = _fake('keyed', 'v100x1-2004')\n"
        "data = {k: v for k, v in data.items() if k != 'qwen27b_api_key_file'}\n"
        "hosts = [(name, data), _fake('open', 'v100x2-pcie')]\n")
    out = _dry(inventory)
    key_file = tmp_path / ".qwen27b" / "api.key"
    key = load_secret(str(key_file))
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key not in out
    keyed, open_ = _block(out, "keyed"), _block(out, "open")
    assert f"the route guard uses the lab key in {key_file} (made now, 0600" in keyed, keyed[:3000]
    assert "--middleware" in keyed and "API key env file (0600)" in keyed
    assert "--middleware" not in open_ and "lab key" not in open_
    again = _dry(inventory)
    assert f"lab key in {key_file} (kept from an earlier run" in again and load_secret(str(key_file)) == key
    assert key not in again


def test_a_key_that_cannot_be_made_stops_the_run_before_any_host(tmp_path):
    """A read-only place for the key: a refusal naming the fixes, not a traceback."""
    if os.geteuid() == 0:
        blocker = tmp_path / "file"  # root writes anywhere: a file where the directory should be
        blocker.write_text("")
        state = blocker / "state"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        state = tmp_path / "ro" / "state"
    inventory = tmp_path / "lab.py"
    inventory.write_text("from inventory.recorded import _fake\n"
                         "name, data = _fake('keyed', 'v100x1-2004')\n"
                         "hosts = [(name, {k: v for k, v in data.items() if k != 'qwen27b_api_key_file'})]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_STATE_DIR=str(state))
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y"], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "the lab key cannot be made at" in out and "qwen27b_api_key_file: none" in out, \
        out[-2000:]
    assert "Traceback" not in out and "operation(s) planned" not in out


def test_every_level_of_the_state_dir_is_private_and_nothing_above_it_is_touched(tmp_path, monkeypatch):
    """Issue 51: `.qwen27b/` and `chat-page/` were 0755 (mkdir's parents take the umask's mode, and a
    `.qwen27b/` made earlier kept its own); every level down to a secret is 0700 now, and the
    directories above the state dir keep their modes."""
    import os

    from qwen27b.controller import apikey

    monkeypatch.delenv(apikey.STATE_ENV, raising=False)
    lab = tmp_path / "lab"
    (lab / ".qwen27b").mkdir(parents=True, mode=0o755)
    os.chmod(lab / ".qwen27b", 0o755)
    os.chmod(lab, 0o755)
    inventory = lab / "lab.py"
    inventory.write_text("hosts = []\n")
    assert apikey.ensure_chat_page(apikey.chat_page_dir(str(inventory), "gw")) == ["page.key", "admin.password",
                                                                                  "session.secret"]
    for level in (lab / ".qwen27b", lab / ".qwen27b" / "chat-page", lab / ".qwen27b" / "chat-page" / "gw"):
        assert level.stat().st_mode & 0o777 == 0o700, level
    assert lab.stat().st_mode & 0o777 == 0o755  # above the state dir: left as it is
