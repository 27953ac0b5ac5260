"""A two-operation deploy for tests/unit/slow/test_ctrl_c.py: the first takes a few seconds."""

import os

from pyinfra.operations import server

from qwen27b.controller.runlife import watch_ctrl_c

watch_ctrl_c()
marks = os.environ["CTRL_C_MARKS"]
server.shell(name="slow", commands=[f"echo started > {marks}/started; sleep 4; echo done > {marks}/first"])
server.shell(name="next", commands=[f"echo ran > {marks}/second"])
