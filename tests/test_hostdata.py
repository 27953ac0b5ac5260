"""Inventory data is refused before any host is touched, naming host, key and fix."""

import pytest

from qwen27b.hostdata import BadHostData, settings_for, validate_inventory


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
