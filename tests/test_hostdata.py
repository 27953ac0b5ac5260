"""Inventory data is refused before any host is touched, naming host, key and fix."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen27b.hostdata import KEYS, BadHostData, settings_for, validate_inventory


def test_defaults():
    s = settings_for("h", {"ssh_hostname": "10.0.0.5"})
    assert s.port == 8000 and s.speculative and s.tensor_parallel_size is None


@pytest.mark.parametrize("data, key, text", [
    ({"qwen27b_port": "8000"}, "qwen27b_port", "expected int, got str '8000'"),
    ({"qwen27b_port": True}, "qwen27b_port", "expected int, got bool"),
    ({"qwen27b_tensor_parallel_size": 0}, "qwen27b_tensor_parallel_size", "must be a positive number"),
    ({"qwen27b_port": 70000}, "qwen27b_port", "is not a TCP port"),
    ({"qwen27b_prot": 8000}, "qwen27b_prot", "did you mean 'qwen27b_port'"),
    ({"qwen27b_tensor_paralel_size": 2}, "qwen27b_tensor_paralel_size", "did you mean 'qwen27b_tensor_parallel_size'"),
    ({"qwen27b_gpu_indices": [0, 1], "qwen27b_tensor_parallel_size": 4}, "qwen27b_tensor_parallel_size", "more than the 2 GPUs"),
    ({"qwen27b_gpu_indices": [0, 0]}, "qwen27b_gpu_indices", "repeats a GPU"),
    ({"qwen27b_bind_address": "lab-net"}, "qwen27b_bind_address", "is not an IP address"),
    ({"qwen27b_serve_flags": {"max-model-len": 4}}, "qwen27b_serve_flags", "not a vllm serve flag"),
])
def test_bad_data_names_host_key_and_fix(data, key, text):
    with pytest.raises(BadHostData) as caught:
        settings_for("gpu-a", data)
    message = str(caught.value)
    assert message.startswith(f"gpu-a: {key}: ") and text in message and "Fix: " in message


def test_other_data_keys_pass():
    assert settings_for("h", {"ssh_user": "admin", "_sudo": True, "my_lab_rack": 3}).port == 8000


def test_port_used_twice_on_one_machine():
    hosts = [("a", {"ssh_hostname": "10.0.0.5"}), ("b", {"ssh_hostname": "10.0.0.6"}),
             ("c", {"ssh_hostname": "10.0.0.5", "qwen27b_port": 8000})]
    with pytest.raises(BadHostData, match="c: qwen27b_port: port 8000 is already used by host entry 'a'"):
        validate_inventory(hosts)
    hosts[2][1]["qwen27b_port"] = 8001
    assert set(validate_inventory(hosts)) == {"a", "b", "c"}


@pytest.mark.parametrize("overrides, key, text", [
    ({"model": {"id": "../../etc/passwd"}}, "qwen27b_stack_overrides.model.id", "is not a hub id"),
    ({"model": {"id": "org/../x"}}, "qwen27b_stack_overrides.model.id", "is not a hub id"),
    ({"model_revision": "v1/../../x"}, "qwen27b_stack_overrides.model_revision", "is not a commit or tag"),
    ({"draft": {"revision": "a b"}}, "qwen27b_stack_overrides.draft_revision", "is not a commit or tag"),
    ({"vllm": {"sha256": "abc123"}}, "qwen27b_stack_overrides.vllm.sha256", "64 hex digits"),
])
def test_overrides_that_reach_paths_and_downloads_are_checked(overrides, key, text):
    with pytest.raises(BadHostData) as caught:
        settings_for("gpu-a", {"qwen27b_stack_overrides": overrides})
    assert caught.value.key == key and text in str(caught.value)


def test_good_overrides_pass():
    s = settings_for("h", {"qwen27b_stack_overrides": {"model_revision": "0123abc", "draft": {"revision": "v1.2"},
                                                       "vllm": {"sha256": "a" * 64}}})
    assert s.stack_overrides["model_revision"] == "0123abc"


def test_secret_files_must_be_private(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("k")
    key.chmod(0o644)
    with pytest.raises(BadHostData, match=r"qwen27b_api_key_file: .* is mode 644, readable by others. Fix: chmod 600"):
        settings_for("h", {"qwen27b_api_key_file": str(key)})
    key.chmod(0o600)
    assert settings_for("h", {"qwen27b_api_key_file": str(key)}).api_key_file == str(key)
    with pytest.raises(BadHostData, match="qwen27b_hf_token_file: cannot read"):
        settings_for("h", {"qwen27b_hf_token_file": str(tmp_path / "missing")})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS + ["qwen27b_prot", "ssh_user", "qwen27b_x"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.text(max_size=20),
                                 st.lists(st.integers(-2, 9), max_size=4),
                                 st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers()),
                                                 max_size=3)),
                       max_size=6))
def test_fuzzed_host_data_is_accepted_or_refused_clearly(data):
    try:
        settings_for("fuzz", data)
    except BadHostData as error:
        assert str(error).startswith("fuzz: ") and "Fix: " in str(error)
