"""What the deploy installs is what was meant (issue 25): a wheelhouse path that is not there is
refused rather than silently replaced by the indexes, and qwen27b_require_hashes refuses every
artifact the stack does not pin by sha256 (without it, the gate warns)."""

from __future__ import annotations

import pytest

from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

HOST = "v100x4-2204-fresh"
STACK = load_stack()


def test_a_wheelhouse_path_that_is_not_there_or_holds_no_wheel_is_refused(tmp_path):
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    for path, problem in ((tmp_path / "whelhouse", "is not a directory"), (empty, "no directory with wheels"),
                          (tmp_path / "file.whl", "is not a directory")):
        if path.name == "file.whl":
            path.write_text("")
        with pytest.raises(BadHostData) as caught:
            settings_for("h", {"qwen27b_wheelhouse_dir": str(path)})
        assert caught.value.key == "qwen27b_wheelhouse_dir" and problem in caught.value.problem
        assert "internet" in caught.value.problem and caught.value.fix
    (empty / "vllm-1.0-py3-none-any.whl").write_text("")
    assert settings_for("h", {"qwen27b_wheelhouse_dir": str(empty)}).wheelhouse_dir == str(empty)


def _decide(data: dict):
    return decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, data))


def test_require_hashes_refuses_the_unpinned_engine_wheel_which_is_otherwise_a_warning():
    assert any("has no sha256" in w for w in _decide({}).warnings)  # the stack's wheel is unpinned today
    with pytest.raises(RefusedHost) as caught:
        _decide({"qwen27b_require_hashes": True})
    causes = [cause for cause, _ in caught.value.problems]
    assert any("qwen27b_require_hashes" in c and ".whl has no sha256" in c for c in causes), causes


def test_require_hashes_passes_once_the_wheel_is_pinned_and_refuses_pypi_by_name():
    pinned = {"qwen27b_require_hashes": True, "qwen27b_stack_overrides": {"vllm": {"sha256": "a" * 64}}}
    decision = _decide(pinned)
    assert not any("has no sha256" in w for w in decision.warnings)
    with pytest.raises(RefusedHost) as caught:
        _decide({**pinned, "qwen27b_dflash_cli": True})
    assert [cause for cause, _ in caught.value.problems] == [
        "qwen27b_require_hashes: qwen27b_dflash_cli installs PyPI's dflash by name, without a hash"]
