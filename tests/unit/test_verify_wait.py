"""verify.wait_active: the deploy reports ok only once systemd calls the unit active (CI once saw
"activating" right after an ok deploy: the start-up check polls /health every 2 s)."""

from __future__ import annotations

import pytest

from qwen27b.controller import postdeploy as V


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def states(*sequence):
    it = iter(sequence)
    last = [None]

    def state():
        last[0] = next(it, last[0])
        return last[0]
    return state


def test_waits_through_start_post_until_active():
    clock, seen = Clock(), []
    state = states("activating/start-post", "activating/start-post", "active/running")
    V.wait_active(lambda: seen.append(state()) or seen[-1], clock=clock, sleep=clock.sleep)
    assert seen == ["activating/start-post", "activating/start-post", "active/running"]
    assert clock.now == pytest.approx(1.0)


def test_a_unit_stuck_activating_fails_naming_the_state():
    clock = Clock()
    with pytest.raises(V.VerifyFailed, match=r"still has the unit activating/start-post after 60 s") as info:
        V.wait_active(states("activating/start-post"), clock=clock, sleep=clock.sleep)
    assert not info.value.crashed and clock.now > 60


def test_a_unit_that_died_is_a_crash():
    clock = Clock()
    with pytest.raises(V.VerifyFailed, match="exits during start-up") as info:
        V.wait_active(states("activating/start-post", "activating/auto-restart"), clock=clock, sleep=clock.sleep)
    assert info.value.crashed


def test_no_unit_state_read_does_not_block():
    V.wait_active(lambda: "", clock=Clock(), sleep=lambda s: pytest.fail("slept"))
