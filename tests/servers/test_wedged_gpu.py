"""A wedged GPU never hangs the deploy (issue 52 item 2), on real processes: the deploy's NvidiaGpus
fact read over pyinfra's @local connector (its own process, gevent patched as the CLI patches it),
with a fake `nvidia-smi` first on PATH that never returns (a V100 cannot be wedged here: the fake
stands for the driver call that blocks). The shipped fact command, bound and verdict are used."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from qwen27b.controller import facts as F
from qwen27b.plan.gatetypes import HostFacts
from qwen27b.plan.gpubound import HUNG
from qwen27b.plan.gpustate import gpu_troubles
from tests.support.paths import ROOT


def _read(tmp_path, script: str, *bound: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "tests.support.wedged_read", str(bin_dir), *bound], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_nvidia_smi_that_never_returns_is_stopped_at_its_bound_and_refused(tmp_path):
    """The host's own bound: timeout(1) ends the fake (exit 124); the fact answers the hang within its
    bound, the host is not failed by pyinfra, and the gate's reading refuses it with the fix."""
    answer = _read(tmp_path, "exec sleep 100000\n")
    assert F.BOUND.seconds <= answer["seconds"] < F.BOUND.seconds + F.BOUND.kill_after_s + 5, answer  # the batch's answer
    assert not answer["failed"]
    assert answer["value"] == [{"problem": HUNG, "bus_id": None, "message":
                                f"nvidia-smi --query-gpu did not return within {F.BOUND.seconds} s (timeout exit 124)"}]
    facts = HostFacts(os={"id": "ubuntu"}, kernel="", gpus=answer["value"], pci_gpus=[], kernel_module={},
                      nouveau_loaded=False, secure_boot="disabled", disk={}, memory={}, pythons={})
    (trouble,) = gpu_troubles(facts)
    assert trouble.kind == HUNG and trouble.blocks and "nvidia-smi -r" in trouble.fix


def test_the_controller_stops_waiting_where_the_process_cannot_be_ended(tmp_path):
    """A D-state nvidia-smi ignores KILL and keeps the output pipe open past timeout(1): here a child
    the fake leaves behind holds the pipe (timeout ends only the fake). pyinfra's `_timeout`
    (factcache.fact_timeout, 6 s here) ends the batch read (then read one by one) and the fact's own
    read: 2 x 6 s; the host is failed for the preflight to refuse."""
    answer = _read(tmp_path, "sleep 40 &\nexec sleep 100000\n", "6")
    assert 12 <= answer["seconds"] < 20, answer
    assert answer["failed"]
