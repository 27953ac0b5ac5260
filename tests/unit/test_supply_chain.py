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
    assert not any("has no sha256" in w for w in _decide({}).warnings)  # 1.5.1's is pinned in the stack (issue 49)
    unpinned = {"qwen27b_stack_overrides": {"vllm": {"sha256": None}}}
    assert any("has no sha256" in w for w in _decide({**unpinned, "qwen27b_require_hashes": False}).warnings)
    with pytest.raises(RefusedHost) as caught:
        _decide({**unpinned, "qwen27b_require_hashes": True})
    causes = [cause for cause, _ in caught.value.problems]
    assert any("qwen27b_require_hashes" in c and ".whl has no sha256" in c for c in causes), causes


def _wheelhouse(tmp_path) -> str:
    (tmp_path / "wheels").mkdir(exist_ok=True)
    (tmp_path / "wheels" / "vllm-1.0-py3-none-any.whl").write_text("")
    return str(tmp_path / "wheels")


@pytest.mark.parametrize("extra, source", [
    ({}, "from the package indexes (torch from https://download.pytorch.org/"),
    ({"qwen27b_wheel_mirror": "http://u:pw@10.0.0.1:8080/wheels/"}, "from the lab mirror http://u:***@10.0.0.1:8080/")])
def test_require_hashes_refuses_installing_by_name_without_a_wheelhouse(tmp_path, extra, source):
    """Issue 25: with the engine wheel pinned, torch (cu128 index) and the engine's dependencies still
    installed by name without hashes when no wheelhouse was pushed: refused before any host is touched."""
    pinned = {"qwen27b_require_hashes": True, "qwen27b_stack_overrides": {"vllm": {"sha256": "a" * 64}}, **extra}
    with pytest.raises(RefusedHost) as caught:
        _decide(pinned)
    (cause, fix), = caught.value.problems
    assert cause.startswith("qwen27b_require_hashes: without qwen27b_wheelhouse_dir, ") and source in cause, cause
    assert "pw" not in cause and "qwen27b_wheelhouse_dir" in fix
    _decide({**pinned, "qwen27b_wheelhouse_dir": _wheelhouse(tmp_path)})


def test_require_hashes_passes_once_the_wheel_is_pinned_and_refuses_pypi_by_name(tmp_path):
    pinned = {"qwen27b_require_hashes": True, "qwen27b_stack_overrides": {"vllm": {"sha256": "a" * 64}},
              "qwen27b_wheelhouse_dir": _wheelhouse(tmp_path)}
    decision = _decide(pinned)
    assert not any("has no sha256" in w for w in decision.warnings)
    with pytest.raises(RefusedHost) as caught:
        _decide({**pinned, "qwen27b_dflash_cli": True})
    assert [cause for cause, _ in caught.value.problems] == [
        "qwen27b_require_hashes: qwen27b_dflash_cli installs PyPI's dflash by name, without a hash"]


def test_the_release_record_keeps_the_engine_wheels_hash_when_it_is_known_before_the_install(tmp_path):
    """Issue 25: the release record says which engine wheel was installed, by its sha256: the pushed
    wheelhouse's (hashed here from the file's bytes), else the stack URL's pin; nothing when the wheel
    came by name from a mirror or an index (no hash is known before the install)."""
    import hashlib
    import json

    from qwen27b.plan.lifecycle import parse_record, record_text
    from roles.service import release_record

    vllm = STACK["profiles"]["sm70"]["vllm"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = f"{vllm['dist']}-{vllm['version']}-cp312-cp312-manylinux_2_35_x86_64.whl"
    (wheels / name).write_bytes(b"not a real wheel, but real bytes")
    (wheels / "ninja-1.11.1-py3-none-manylinux1_x86_64.whl").write_bytes(b"another")
    record = release_record(_decide({"qwen27b_wheelhouse_dir": str(wheels)}))
    assert record.engine_wheel == (name, hashlib.sha256(b"not a real wheel, but real bytes").hexdigest(),
                                   "controller wheelhouse")
    assert parse_record(json.loads(record_text(record))) == record

    pinned = {"qwen27b_stack_overrides": {"vllm": {"sha256": "ab" * 32}}}
    assert release_record(_decide(pinned)).engine_wheel == (vllm["url"].rsplit("/", 1)[-1], "ab" * 32,
                                                             "stack release URL")
    assert release_record(_decide({**pinned, "qwen27b_wheel_mirror": "http://10.0.0.1:8080/wheels/"})).engine_wheel == ()
    assert release_record(_decide({})).engine_wheel == (vllm["url"].rsplit("/", 1)[-1], vllm["sha256"], "stack release URL")
    unpinned = release_record(_decide({"qwen27b_stack_overrides": {"vllm": {"sha256": None}},
                                       "qwen27b_require_hashes": False}))  # else refused on sm70 (issue 49)
    assert unpinned.engine_wheel == () and "engine_wheel" not in record_text(unpinned)
    forged = {**json.loads(record_text(record)), "engine_wheel": {"file": name, "sha256": "x; rm -rf /", "from": "w"}}
    assert parse_record(forged).engine_wheel == ()


def test_sm70_requires_hashes_by_default_now_that_its_engine_wheel_is_pinned():
    """Issue 49 item 4: on sm70, qwen27b_require_hashes left out is on for what the stack pins (the
    engine wheel; the checkpoint files are checked on the host): an override dropping the wheel's
    sha256 is refused, naming the way out; the plan prints the policy. By-name installs (no
    wheelhouse) stay allowed by default: only the host's explicit true refuses them."""
    decision = _decide({})
    row = next(c for c in decision.choices if c.what == "hashes")
    assert row.value == "required (profile default)" and "[1cat-release-151, 1cat-verified-models]" in row.reason
    with pytest.raises(RefusedHost) as caught:
        _decide({"qwen27b_stack_overrides": {"vllm": {"sha256": None}}})
    (cause, fix), = caught.value.problems
    assert cause == ("qwen27b_require_hashes (the profile default): 1cat_vllm-1.5.1-cp312-cp312-linux_x86_64.whl has "
                     "no sha256 in the stack file"), cause
    assert "qwen27b_require_hashes false" in fix
    off = _decide({"qwen27b_require_hashes": False})
    assert not any(c.what == "hashes" for c in off.choices)
    a100 = decide("a100x2-2204", recorded_facts("a100x2-2204"), STACK, settings_for("a100x2-2204", {}))
    assert not any(c.what == "hashes" for c in a100.choices)  # sm75plus pins no engine wheel: not its default
