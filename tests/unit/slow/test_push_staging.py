"""push_files under plain sudo (issue 32): the SSH user uploads straight into a staging dir near
the files and sudo renames each verified file into place, instead of pyinfra's upload to /tmp and
`cp` (every byte written twice). Issue 48: the staging dir sat in the destination, and the
checkpoint's destination lies under /var/lib/qwen27b (0750), which the SSH user cannot search: the
fresh sudo deploy failed with Permission denied. It is now in the deepest directory every level of
which lets others search it. The e2e tier proves it for real: its lab deploys as `admin` with
`_sudo`, pushing the 878 MiB wheelhouse (tests/e2e/test_deploy.py checks what is left) and, once,
the checkpoint from the controller (tests/e2e/test_ipv6_e2e.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host

from qwen27b.controller.host_facts import DirectoryStates, FileHashes
from qwen27b.controller.operations import STAGING_DIR, STAGING_PREFIX, push_files, staging_candidates, staging_dir

DIR = {"user": "root", "group": "root", "type": "directory"}


class _Host:
    """Just what push_files reads of pyinfra's host: its global arguments, the FileHashes fact and
    DirectoryStates (every level searchable by others unless `modes` says otherwise)."""

    def __init__(self, arguments: dict, present: dict, modes: dict | None = None):
        self.current_op_global_arguments, self.present, self.modes = arguments, present, modes or {}

    def get_fact(self, fact, **kwargs):
        if fact is DirectoryStates:
            return [{**DIR, "mode": self.modes.get(path, "755")} for path in kwargs["paths"]]
        return self.present

    def noop(self, text):
        pass


def _plan(tmp_path, arguments: dict, dest: str = "/opt/qwen27b/wheelhouse", modes: dict | None = None) -> list:
    (tmp_path / "a.whl").write_bytes(b"wheel a")
    manifest = {"a.whl": hashlib.sha256(b"wheel a").hexdigest()}
    with ctx_host.use(_Host(arguments, {"b.whl": "0" * 64}, modes)):
        return list(push_files._inner(str(tmp_path), dest, manifest))


def test_under_plain_sudo_the_ssh_user_uploads_into_a_staging_dir_renamed_by_root(tmp_path):
    staging = f"/opt/qwen27b/wheelhouse/{STAGING_DIR}"
    mkdir, upload, verify, cleanup = _plan(tmp_path, {"_sudo": True})
    assert mkdir == f'rm -rf {staging} && mkdir -m 0700 {staging} && chown "$SUDO_USER" {staging}'
    assert isinstance(upload, FileUploadCommand) and upload.dest == f"{staging}/a.whl.part"
    assert upload.connector_arguments == {"_sudo": False}  # as the SSH user, no /tmp and cp
    assert f"chown root:root {staging}/a.whl.part && chmod 644 {staging}/a.whl.part && " \
           f"mv -f {staging}/a.whl.part /opt/qwen27b/wheelhouse/a.whl" in verify
    assert cleanup == f"rm -rf {staging}"


@pytest.mark.parametrize("arguments", [{}, {"_sudo": True, "_sudo_user": "svc"}, {"_sudo": True, "_su_user": "x"}])
def test_as_root_or_as_another_user_the_upload_goes_beside_the_file(tmp_path, arguments):
    upload, verify = _plan(tmp_path, arguments)
    assert upload.dest == "/opt/qwen27b/wheelhouse/a.whl.part" and upload.connector_arguments == {}
    assert "chown" not in verify


def test_under_a_dir_others_cannot_search_the_staging_dir_is_in_the_deepest_one_they_can(tmp_path):
    """Issue 48: the checkpoint goes to /var/lib/qwen27b/models/<id>, below /var/lib/qwen27b (0750,
    the service user's): the SSH user cannot reach a staging dir there. It stages in /var/lib and
    root moves each verified file beside its destination (hidden), then renames it over the file."""
    dest = "/var/lib/qwen27b/models/x@1"
    mkdir, upload, verify, cleanup = _plan(tmp_path, {"_sudo": True}, dest, {"/var/lib/qwen27b": "750"})
    staging = f"/var/lib/{STAGING_PREFIX}{hashlib.sha256(dest.encode()).hexdigest()[:12]}"
    assert mkdir == f'rm -rf {staging} && mkdir -m 0700 {staging} && chown "$SUDO_USER" {staging}'
    assert upload.dest == f"{staging}/a.whl.part" and upload.connector_arguments == {"_sudo": False}
    assert (f"chown root:root {staging}/a.whl.part && chmod 644 {staging}/a.whl.part && "
            f"mv -f {staging}/a.whl.part {dest}/.a.whl.part && mv -f {dest}/.a.whl.part {dest}/a.whl") in verify
    assert cleanup == f"rm -rf {staging}"
    assert staging in staging_candidates(dest)  # where the progress probe counts the bytes too


@pytest.mark.parametrize("modes, where", [
    ({}, "/opt/q/w/.incoming"),  # every level searchable: beside the files, as before
    ({"/opt": "700"}, "/"),  # only the root is
    ({"/opt/q/w": "751"}, "/opt/q/w/.incoming"),  # o+x is what counts, not o+r
    ({"/opt/q": "1750"}, "/opt"),
])
def test_the_staging_dir_is_below_the_deepest_level_that_others_can_search(modes, where):
    levels = ["/", "/opt", "/opt/q", "/opt/q/w"]
    states = [{**DIR, "mode": modes.get(level, "755")} for level in levels]
    chosen = staging_dir("/opt/q/w", states)
    assert chosen == where if where.endswith(STAGING_DIR) else chosen.startswith(where.rstrip("/") + "/" + STAGING_PREFIX)


def test_a_missing_level_or_a_symlink_ends_the_walk():
    """A level this run's `mkdir -p` makes, or a symlink (its target's mode unknown), is not counted."""
    states = [{**DIR, "mode": "755"}, {**DIR, "mode": "777", "type": "symbolic link"}, None, None]
    assert staging_dir("/opt/q/w", states).startswith("/" + STAGING_PREFIX)
    states = [{**DIR, "mode": "755"}, {**DIR, "mode": "755"}, None, None]
    assert staging_dir("/opt/q/w", states).startswith("/opt/" + STAGING_PREFIX)


needs_sudo = pytest.mark.skipif(shutil.which("sudo") is None or os.geteuid() != 0,
                                reason="needs root and sudo (./run installs it)")


class _RealHost(_Host):
    """A host whose facts are read for real: each fact's own command, run here by the shell."""

    def get_fact(self, fact, **kwargs):
        result = subprocess.run(["bash", "-c", fact().command(**kwargs)], capture_output=True, text=True, check=True)
        return fact().process(result.stdout.splitlines())


@needs_sudo
def test_the_ssh_user_reaches_its_staging_dir_and_root_puts_the_verified_file_in_place(tmp_path):
    """The plan run for real on a tree shaped as the host's (a 0750 dir above the destination, which
    does not exist yet): the facts' own commands read it, root runs the plan's commands with sudo's
    $SUDO_USER, and `nobody` (the SSH user, no member of the dir's group) writes the upload, as SFTP
    does. Before issue 48 `nobody` was sent into the 0750 dir: Permission denied."""
    base = Path(tempfile.mkdtemp(prefix="q27-stage-", dir="/tmp"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir(mode=0o750)
        (state / "models").mkdir(mode=0o750)
        dest = state / "models" / "ckpt@1"
        src = tmp_path / "src"
        src.mkdir()
        (src / "model.safetensors").write_bytes(os.urandom(1 << 16))
        (src / "config.json").write_text("{}")
        manifest = {name: hashlib.sha256((src / name).read_bytes()).hexdigest() for name in os.listdir(src)}
        with ctx_host.use(_RealHost({"_sudo": True}, {})):
            commands = list(push_files._inner(str(src), str(dest), manifest))
        for command in commands:
            if isinstance(command, FileUploadCommand):
                assert command.connector_arguments == {"_sudo": False}
                with open(command.src, "rb") as data:  # the SSH user writes it
                    sent = subprocess.run(["sudo", "-n", "-u", "nobody", "sh", "-c", 'cat > "$1"', "sh", command.dest],
                                          stdin=data, capture_output=True, text=True)
                assert sent.returncode == 0, f"the SSH user cannot write {command.dest}: {sent.stderr}"
            else:
                ran = subprocess.run(["bash", "-c", str(command)], env={**os.environ, "SUDO_USER": "nobody"},
                                     capture_output=True, text=True)
                assert ran.returncode == 0, (str(command), ran.stderr)
        assert _RealHost({}, {}).get_fact(FileHashes, directory=str(dest)) == manifest
        for name in manifest:
            info = (dest / name).stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o644)
        assert sorted(os.listdir(dest)) == sorted(manifest)  # no part left beside the files
        assert sorted(os.listdir(base)) == ["state"]  # the staging dir is gone
    finally:
        shutil.rmtree(base)
