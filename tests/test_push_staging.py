"""push_files under plain sudo (issue 32): the SSH user uploads straight into a staging dir beside
the files and sudo renames each verified file into place, instead of pyinfra's upload to /tmp and
`cp` (every byte written twice). The e2e tier proves it for real: its lab deploys as `admin` with
`_sudo`, pushing the 878 MiB wheelhouse this way (tests/e2e/test_deploy.py checks what is left)."""

from __future__ import annotations

import hashlib

import pytest
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host

from qwen27b.controller.operations import STAGING_DIR, push_files


class _Host:
    """Just what push_files reads of pyinfra's host: its global arguments and the FileHashes fact."""

    def __init__(self, arguments: dict, present: dict):
        self.current_op_global_arguments, self.present = arguments, present

    def get_fact(self, fact, **kwargs):
        return self.present

    def noop(self, text):
        pass


def _plan(tmp_path, arguments: dict) -> list:
    (tmp_path / "a.whl").write_bytes(b"wheel a")
    manifest = {"a.whl": hashlib.sha256(b"wheel a").hexdigest()}
    with ctx_host.use(_Host(arguments, {"b.whl": "0" * 64})):
        return list(push_files._inner(str(tmp_path), "/opt/qwen27b/wheelhouse", manifest))


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
