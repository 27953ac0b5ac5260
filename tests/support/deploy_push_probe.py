"""A push of PUSH_SRC's files to /tmp/q27t-push on each test host, watched by the progress probe
every 50 ms, with paramiko renegotiating its session keys every 4 MiB sent instead of every 512 MiB
(test_testhosts.py: a channel closing during a key exchange deadlocked pyinfra's connection and
broke the wheelhouse upload in CI; the probe now has its own connection).

    PUSH_SRC=DIR pyinfra -y INVENTORY tests/support/deploy_push_probe.py     (on a terminal)
"""

import os
from pathlib import Path

from paramiko.packet import Packetizer
from pyinfra import host

from qwen27b.controller import progress
from qwen27b.controller.artifacts import dir_manifest
from qwen27b.controller.operations import push_files
from qwen27b.controller.runlife import watch_ctrl_c

Packetizer.REKEY_BYTES = 4 << 20  # test only: a key exchange every 4 MiB of the upload
watch_ctrl_c()  # as preflight does: the run's callbacks, progress among them
src = os.environ["PUSH_SRC"]
manifest = dir_manifest(Path(src))
push = push_files(name="push the files", src_dir=src, dest_dir="/tmp/q27t-push", manifest=manifest)
progress.watch(push, host, "push", ["/tmp/q27t-push"], sum(os.path.getsize(os.path.join(src, n)) for n in manifest),
               every_s=0.05)
