"""The health check's sentence for a unit that keeps exiting, from systemd's own counters (the
deploy's verify quotes the same sentence, so systemd, the health check and the report agree).
The values are what `systemctl show` printed on the test host for a vLLM started with a bad flag."""

import pytest

from qwen27b.onhost import contract

UNIT = "qwen27b.service"


@pytest.mark.parametrize(("props", "expected"), [
    ({"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0"}, None),
    ({"ActiveState": "activating", "SubState": "start", "Result": "success", "NRestarts": "0"}, None),
    ({}, None),  # systemctl unavailable (containers): say nothing rather than guess
    ({"ActiveState": "activating", "SubState": "auto-restart", "Result": "signal", "NRestarts": "1"},
     "its process exited (Result=signal); systemd restarts it (1 restart(s) so far)"),
    ({"ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code", "NRestarts": "2"},
     "crash loop, its process exited (Result=exit-code) and systemd restarted it 2 times; a start-up failure"),
    ({"ActiveState": "activating", "SubState": "start", "Result": "exit-code", "NRestarts": "3"},
     "crash loop, its process exited (Result=exit-code) and systemd restarted it 3 times"),
    ({"ActiveState": "failed", "SubState": "failed", "Result": "start-limit-hit", "NRestarts": "4",
      "StartLimitBurst": "5"},
     "systemd gave up on it, start limit hit after 4 automatic restart(s) (StartLimitBurst=5)"),
    # systemd reset Result at the third start: only NRestarts still says it keeps dying
    ({"ActiveState": "activating", "SubState": "start", "Result": "success", "NRestarts": "3"},
     "crash loop, systemd restarted it 3 times and it is starting again"),
    ({"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "3"}, None),
    ({"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "NRestarts": "bogus"},
     "its process exited (Result=exit-code); systemd restarts it (0 restart(s) so far)"),
], ids=["running", "first-start", "unknown", "one-crash", "crash-loop", "crash-loop-restarting",
        "start-limit", "restarting-again", "recovered-after-restarts", "garbled-count"])
def test_restart_loop_sentence(props, expected):
    text = contract.restart_loop(props, UNIT)
    if expected is None:
        assert text is None
    else:
        assert text.startswith(f"{UNIT} is not serving: ") and expected in text, text
