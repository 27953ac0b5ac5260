"""A deploy for tests/unit/slow/test_runsummary.py over @local: an upload (push_files' own command) that the
connector fails by raising, as paramiko's SFTP raises PermissionError where the SSH user cannot
reach the destination (issue 48). @local's `cp` into a directory that is not there raises OSError
the same way; pyinfra logs one line and records no output for the operation."""

import os

from pyinfra import host
from pyinfra.api import operation

from qwen27b.controller.operations import CheckedUpload
from qwen27b.controller.runlife import watch_ctrl_c


@operation()
def upload_into_a_missing_dir(src: str, dest: str):
    yield CheckedUpload(src, dest, op_hash=host.current_op_hash)


watch_ctrl_c()  # as preflight does: the run summary at exit
target = os.environ["TARGET_DIR"]
upload_into_a_missing_dir(name="push the checkpoint", src=__file__, dest=f"{target}/missing/model.safetensors.part")
