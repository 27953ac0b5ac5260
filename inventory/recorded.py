"""Recorded hosts: pyinfra @fake hosts answering with real machines' command output.

    pyinfra inventory/recorded.py deploy.py --dry -y

shows, for each recorded machine, exactly what the deploy would do or why it refuses - without
touching anything. The recordings live in tests/fixtures/hosts/<name>/ (each has a README saying
which machine it stands for).
"""

from pathlib import Path

from tests.support.recorded import fake_responses

RECORDINGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hosts"


def _fake(name: str, **data):
    return (f"@fake/{name}", {"fake_responses": fake_responses(RECORDINGS / name), "fake_delay": 0,
                              "fake_delay_jitter": 0, **data})


recorded_hosts = [
    _fake("v100x4-2204-fresh"),
    _fake("v100x1-2004"),
    _fake("v100x2-16gb"),
    _fake("v100x4-converged"),
    _fake("t4x1-2204"),
    _fake("a100x2-2204"),
    _fake("nogpu-2204"),
    _fake("centos7"),
    _fake("v100x1-secureboot"),
    _fake("h200"),
    _fake("v100x1-open-loaded"),
    _fake("v100x2-open-unloaded", qwen27b_skip_reboot=True),
    _fake("v100x2-r470"),
    _fake("v100x4-pg500"),
    _fake("v100x4-noheaders"),
    _fake("v100x4-converged-8g"),
]
