"""A deploy for tests/unit/slow/test_runsummary.py over @local: a step that runs, then an upload whose source
fails with EOFError (as paramiko's SFTP does when the connection drops mid-file, which pyinfra does
not catch: the whole run stops with "An internal exception occurred"), then a step never reached."""

import os

from pyinfra.operations import files, server

from qwen27b.controller.runlife import watch_ctrl_c


class DroppedConnection:
    """A file whose read fails the way a dropped SFTP channel does."""

    def read(self, *args):
        raise EOFError()

    def seek(self, *args):
        return 0


watch_ctrl_c()  # as preflight does: the run summary at exit
target = os.environ["TARGET_DIR"]
server.shell(name="first step", commands=[f"touch {target}/first"])
files.put(name="upload over a connection that drops", src=DroppedConnection(), dest=f"{target}/uploaded")
server.shell(name="never reached", commands=[f"touch {target}/last"])
