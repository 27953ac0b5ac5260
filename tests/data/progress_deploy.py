"""A deploy for tests/unit/slow/test_progress.py over @local: one slow step writing 8 MiB in 1 MiB chunks,
watched the way the weights role watches its fetch (the bytes in a directory against a total),
then a quick step that is not watched."""

import os

from pyinfra import host
from pyinfra.operations import server

from qwen27b.controller import progress
from qwen27b.controller.runlife import watch_ctrl_c

watch_ctrl_c()  # as preflight does: the run's callbacks, progress among them
target = os.environ["PROGRESS_DIR"]
step = server.shell(name="slow write", commands=[
    f"for i in 1 2 3 4 5 6 7 8; do head -c 1048576 /dev/zero >> {target}/model.part; sleep 0.6; done"])
progress.watch(step, host, "weights", [target], 8 * 1048576)
server.shell(name="quick step", commands=["true"])
