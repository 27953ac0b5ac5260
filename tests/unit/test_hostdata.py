"""Inventory data is refused before any host is touched, naming host, key and fix."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.settings import KEYS
from qwen27b.plan.inventory import validate_inventory
from fuzz_budget import examples
from tests.support.paths import ROOT


def test_defaults():
    s = settings_for("h", {"ssh_hostname": "10.0.0.5"})
    assert s.port == 8000 and s.speculative and s.tensor_parallel_size is None


def _token_file(tmp_path, mode):
    token = tmp_path / "hf.token"
    token.write_text("hf_x")
    token.chmod(mode)
    return {"qwen27b_hf_token_file": str(token)}


def _api_key_file(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("sk-x")
    key.chmod(0o600)
    return {"qwen27b_api_key_file": str(key)}


def _two(first: dict, second: dict) -> list:
    return [("gpu-0", {"ssh_hostname": "10.0.0.5", **first}), ("gpu-a", {"ssh_hostname": "10.0.0.5", **second})]


# Every bad input of the audit: (data or hosts, key named, text); the id names the input. `data` may be
# a function of tmp_path, or a list of (host, data) pairs checked together (the refused one is gpu-a).
BAD_INPUTS = [
    # unknown keys, with a "did you mean"
    pytest.param({"qwen27b_prot": 8000}, "qwen27b_prot", "did you mean 'qwen27b_port'", id="typo-prot"),
    pytest.param({"qwen27b_tensor_paralel_size": 2}, "qwen27b_tensor_paralel_size",
                 "did you mean 'qwen27b_tensor_parallel_size'", id="typo-tensor-paralel"),
    pytest.param({"qwen27b_gpus": [0]}, "qwen27b_gpus", "known keys: qwen27b_profile", id="unknown-prefixed-key"),
    # wrong types
    pytest.param({"qwen27b_port": "8000"}, "qwen27b_port", "expected int, got str '8000'", id="port-as-string"),
    pytest.param({"qwen27b_port": True}, "qwen27b_port", "expected int, got bool", id="port-as-bool"),
    pytest.param({"qwen27b_port": 8000.0}, "qwen27b_port", "expected int, got float", id="port-as-float"),
    pytest.param({"qwen27b_speculative": "no"}, "qwen27b_speculative", "'no' is not a speculative method", id="bool-as-string"),
    pytest.param({"qwen27b_speculative": "mpt"}, "qwen27b_speculative", "did you mean 'mtp'? use one of auto, mtp, dflash2, ngram, off",
                 id="speculative-misspelt"),
    pytest.param({"qwen27b_speculative": 7}, "qwen27b_speculative", "expected str or bool, got int", id="speculative-int"),
    pytest.param({"qwen27b_agent_parsers": "yes"}, "qwen27b_agent_parsers", "expected bool, got str", id="agent-parsers-str"),
    pytest.param({"qwen27b_model": "qwen3.8-27b-dflash2"}, "qwen27b_model", "is not a checkpoint of the stack's models table",
                 id="model-is-a-draft"),
    pytest.param({"qwen27b_model": "qwen3.8-27b-nvfp5"}, "qwen27b_model", "did you mean 'qwen3.8-27b-nvfp4'?", id="model-misspelt"),
    # issue 25: an unknown profile was refused later as a problem of qwen27b_stack_overrides
    pytest.param({"qwen27b_profile": "sm7"}, "qwen27b_profile", "did you mean 'sm70'?", id="profile-misspelt"),
    pytest.param({"qwen27b_profile": "gb200"}, "qwen27b_profile", "'gb200' is not a profile of the stack file",
                 id="profile-unknown"),
    pytest.param({"qwen27b_gpu_indices": "0,1"}, "qwen27b_gpu_indices", "expected list", id="gpu-indices-as-string"),
    pytest.param({"qwen27b_gpu_indices": [0, "1"]}, "qwen27b_gpu_indices", "is not a list of GPU indices",
                 id="gpu-index-as-string"),
    pytest.param({"qwen27b_stack_overrides": {"model": "org/name"}}, "qwen27b_stack_overrides.model",
                 "expected a dict", id="override-model-not-a-dict"),
    # negative or zero sizes
    pytest.param({"qwen27b_tensor_parallel_size": 0}, "qwen27b_tensor_parallel_size", "must be a positive number",
                 id="tp-zero"),
    pytest.param({"qwen27b_min_free_disk_gib": -5}, "qwen27b_min_free_disk_gib", "must be a positive number",
                 id="disk-headroom-negative"),
    pytest.param({"qwen27b_health_interval_s": 0}, "qwen27b_health_interval_s", "must be a positive number",
                 id="health-interval-zero"),
    pytest.param({"qwen27b_keep_model_revisions": -1}, "qwen27b_keep_model_revisions", "must be a positive number",
                 id="keep-revisions-negative"),
    pytest.param({"qwen27b_gpu_indices": [-1]}, "qwen27b_gpu_indices", "is not a list of GPU indices",
                 id="gpu-index-negative"),
    # issue 25: no upper bound (10**18 s made the health timer ignore its interval), a key in another
    # case ignored by pyinfra without a word, a network with host bits widened without one
    pytest.param({"qwen27b_health_interval_s": 10**18}, "qwen27b_health_interval_s", "is more than 86400",
                 id="health-interval-huge"),
    pytest.param({"qwen27b_keep_releases": 10**9}, "qwen27b_keep_releases", "is more than 100", id="keep-releases-huge"),
    pytest.param({"qwen27b_health_failures_before_restart": 10**6}, "qwen27b_health_failures_before_restart",
                 "is more than 1000", id="health-failures-huge"),
    pytest.param({"QWEN27B_PORT": 8001}, "QWEN27B_PORT", "write it 'qwen27b_port'", id="key-upper-case"),
    pytest.param({"Qwen27b_Api_Key_File": "x"}, "Qwen27b_Api_Key_File", "write it 'qwen27b_api_key_file'",
                 id="key-mixed-case"),
    pytest.param({"qwen27b_firewall_allow": ["10.0.0.7/8"]}, "qwen27b_firewall_allow",
                 "would allow all of 10.0.0.0/8. Fix: write '10.0.0.0/8' for the whole network, or '10.0.0.7/32'",
                 id="firewall-network-host-bits"),
    pytest.param({"qwen27b_metrics_allow": ["fd00::7/64"]}, "qwen27b_metrics_allow", "'fd00::7/128' for the one host",
                 id="metrics-network-host-bits-v6"),
    pytest.param({"qwen27b_gpu_indices": []}, "qwen27b_gpu_indices", "is not a list of GPU indices", id="gpu-indices-empty"),
    pytest.param({"qwen27b_serve_flags": {"--max-model-len": -1}}, "qwen27b_serve_flags.--max-model-len",
                 "must be a positive whole number", id="pinned-max-model-len-negative"),
    pytest.param({"qwen27b_serve_flags": {"--max-num-seqs": 0}}, "qwen27b_serve_flags.--max-num-seqs",
                 "must be a positive whole number", id="pinned-max-num-seqs-zero"),
    pytest.param({"qwen27b_serve_flags": {"--gpu-memory-utilization": 1.5}}, "qwen27b_serve_flags.--gpu-memory-utilization",
                 "is not a fraction of GPU memory", id="pinned-utilization-above-1"),
    pytest.param({"qwen27b_stack_overrides": {"serve": {"max_num_seqs": 0}}}, "qwen27b_stack_overrides.serve.max_num_seqs",
                 "must be a positive whole number", id="override-max-num-seqs-zero"),
    pytest.param({"qwen27b_stack_overrides": {"serve": {"runtime_overhead_mib": -768}}},
                 "qwen27b_stack_overrides.serve.runtime_overhead_mib", "must be a size of 0 or more",
                 id="override-overhead-negative"),
    pytest.param({"qwen27b_stack_overrides": {"serve": {"gpu_memory_utilization": 0}}},
                 "qwen27b_stack_overrides.serve.gpu_memory_utilization", "is not a fraction", id="override-utilization-zero"),
    # GPU selection and TP (what needs the host's GPUs is in test_gate.py)
    pytest.param({"qwen27b_gpu_indices": [0, 0]}, "qwen27b_gpu_indices", "repeats a GPU", id="gpu-index-repeated"),
    pytest.param({"qwen27b_gpu_indices": [0, 1], "qwen27b_tensor_parallel_size": 4}, "qwen27b_tensor_parallel_size",
                 "more than the 2 GPUs", id="tp-above-listed-gpus"),
    pytest.param({"qwen27b_gpu_indices": [0, 1, 2], "qwen27b_tensor_parallel_size": 2}, "qwen27b_tensor_parallel_size",
                 "2 does not divide the 3 GPUs", id="tp-not-dividing-listed-gpus"),
    pytest.param({"qwen27b_gpu_indices": [0, 1, 2], "qwen27b_serve_flags": {"--tensor-parallel-size": 2}},
                 "qwen27b_serve_flags.--tensor-parallel-size", "2 does not divide the 3 GPUs",
                 id="pinned-tp-not-dividing-listed-gpus"),
    pytest.param({"qwen27b_tensor_parallel_size": 2, "qwen27b_serve_flags": {"--tensor-parallel-size": 4}},
                 "qwen27b_tensor_parallel_size", "disagrees with", id="tp-set-twice-differently"),
    # ports: range, privileged, duplicated on one machine, shadowed by a flag
    pytest.param({"qwen27b_port": 70000}, "qwen27b_port", "is not a TCP port", id="port-above-65535"),
    pytest.param({"qwen27b_port": 0}, "qwen27b_port", "is not a TCP port", id="port-zero"),
    pytest.param({"qwen27b_port": 80}, "qwen27b_port", "privileged port", id="port-privileged"),
    pytest.param(_two({}, {}), "qwen27b_port", "port 8000 is already used by host entry 'gpu-0'", id="port-duplicated"),
    pytest.param(_two({"qwen27b_port": 8001}, {}), "ssh_hostname", "already deploys qwen27b to the same machine",
                 id="two-entries-one-machine"),
    pytest.param({"qwen27b_serve_flags": {"--port": 8001}}, "qwen27b_serve_flags.--port", "set qwen27b_port instead",
                 id="port-as-serve-flag"),
    # flags, names and addresses that reach unit files and shell commands
    pytest.param({"qwen27b_serve_flags": {"max-model-len": 4}}, "qwen27b_serve_flags", "not a vllm serve flag",
                 id="flag-without-dashes"),
    pytest.param({"qwen27b_serve_flags": {"--x\nExecStartPre=/bin/true": 1}}, "qwen27b_serve_flags",
                 "contains a control character", id="flag-with-newline"),
    pytest.param({"qwen27b_serve_flags": {"--enforce-eager": False}}, "qwen27b_serve_flags.--enforce-eager",
                 "is not a flag value", id="flag-switch-false"),
    pytest.param({"qwen27b_serve_flags": {"--api-key": "sk-1"}}, "qwen27b_serve_flags.--api-key",
                 "qwen27b_api_key_file", id="api-key-as-flag"),
    pytest.param({"qwen27b_serve_flags": {"--middleware": "mymod.Open"}}, "qwen27b_serve_flags.--middleware",
                 "qwen27b_api_key_file", id="middleware-as-flag"),
    pytest.param({"qwen27b_serve_flags": {"--ssl-keyfile": "/etc/k.pem"}}, "qwen27b_serve_flags.--ssl-keyfile",
                 "reverse proxy", id="tls-as-flag"),
    # the scrapers' allow-list: networks
    pytest.param(lambda tmp: {**_api_key_file(tmp), "qwen27b_metrics_allow": ["prometheus.lab"]},
                 "qwen27b_metrics_allow", "is not a network", id="metrics-allow-hostname"),
    pytest.param(lambda tmp: {**_api_key_file(tmp), "qwen27b_metrics_allow": []}, "qwen27b_metrics_allow",
                 "allows no scraper", id="metrics-allow-empty"),
    pytest.param({"qwen27b_metrics_allow": "10.0.0.5/32"}, "qwen27b_metrics_allow", "expected list",
                 id="metrics-allow-not-a-list"),
    # the health endpoint's port and node_exporter's
    pytest.param({"qwen27b_health_port": 80}, "qwen27b_health_port", "privileged port", id="health-port-privileged"),
    pytest.param({"qwen27b_health_port": 70000}, "qwen27b_health_port", "is not a TCP port", id="health-port-above-65535"),
    pytest.param({"qwen27b_health_port": "9120"}, "qwen27b_health_port", "expected int", id="health-port-as-string"),
    pytest.param({"qwen27b_health_port": 8000}, "qwen27b_health_port", "also qwen27b_port", id="health-port-is-vllm-port"),
    pytest.param({"qwen27b_port": 8100, "qwen27b_health_port": 8100}, "qwen27b_health_port", "also qwen27b_port",
                 id="health-port-is-moved-vllm-port"),
    pytest.param({"qwen27b_node_exporter": True, "qwen27b_health_port": 9100}, "qwen27b_health_port",
                 "node_exporter's port", id="health-port-is-node-exporter-port"),
    pytest.param({"qwen27b_node_exporter": True, "qwen27b_port": 9100}, "qwen27b_port", "node_exporter's port",
                 id="port-is-node-exporter-port"),
    pytest.param({"qwen27b_node_exporter": "yes"}, "qwen27b_node_exporter", "expected bool", id="node-exporter-not-bool"),
    pytest.param({"qwen27b_served_model_name": "my model"}, "qwen27b_served_model_name", "is not a plain model name",
                 id="served-name-with-space"),
    pytest.param({"qwen27b_bind_address": "lab-net"}, "qwen27b_bind_address", "is not an IP address",
                 id="bind-address-not-ip"),
    pytest.param({"qwen27b_http_proxy": "A://["}, "qwen27b_http_proxy", "is not a http/https/socks5",
                 id="url-that-urlsplit-refuses"),  # hypothesis found it: ValueError 'Invalid IPv6 URL' escaped
    pytest.param({"qwen27b_http_proxy": "proxy.lab:3128"}, "qwen27b_http_proxy", "is not a http/https/socks5",
                 id="proxy-without-scheme"),
    pytest.param({"qwen27b_python_mirror": "http://m.lab/x; rm -rf /"}, "qwen27b_python_mirror", "plain URL characters",
                 id="mirror-with-shell-characters"),
    pytest.param({"qwen27b_model_source": "mirror"}, "qwen27b_model_mirror", "no mirror URL is set",
                 id="mirror-source-without-url"),
    pytest.param({"qwen27b_model_source": "s3"}, "qwen27b_model_source", "is not a model source",
                 id="unknown-model-source"),
    # model ids, revisions, hashes
    pytest.param({"qwen27b_stack_overrides": {"model": {"id": "../../etc/passwd"}}}, "qwen27b_stack_overrides.model.id",
                 "is not a hub id", id="model-id-path-traversal"),
    pytest.param({"qwen27b_stack_overrides": {"draft": {"id": "org/../x"}}}, "qwen27b_stack_overrides.draft.id",
                 "is not a hub id", id="draft-id-path-traversal"),
    pytest.param({"qwen27b_stack_overrides": {"model": {"id": "/srv/models/qwen"}}}, "qwen27b_stack_overrides.model.id",
                 "is not a hub id", id="model-id-absolute-path"),
    pytest.param({"qwen27b_stack_overrides": {"model_revision": "v1/../../x"}}, "qwen27b_stack_overrides.model_revision",
                 "is not a commit or tag", id="revision-path-traversal"),
    pytest.param({"qwen27b_stack_overrides": {"draft": {"revision": "a b"}}}, "qwen27b_stack_overrides.draft_revision",
                 "is not a commit or tag", id="revision-with-space"),
    pytest.param({"qwen27b_stack_overrides": {"model_revision": "-rf"}}, "qwen27b_stack_overrides.model_revision",
                 "is not a commit or tag", id="revision-like-an-option"),
    pytest.param({"qwen27b_stack_overrides": {"vllm": {"sha256": "abc123"}}}, "qwen27b_stack_overrides.vllm.sha256",
                 "64 hex digits", id="sha256-too-short"),
    pytest.param({"qwen27b_stack_overrides": {"vllm": {"sha256": "a" * 65}}}, "qwen27b_stack_overrides.vllm.sha256",
                 "64 hex digits", id="sha256-too-long"),
    pytest.param({"qwen27b_stack_overrides": {"serve": {"env": {"X": "1\nLD_PRELOAD=/tmp/x.so"}}}},
                 "qwen27b_stack_overrides.serve.env.X", "contains a control character", id="override-env-with-newline"),
    # secret files
    pytest.param(lambda tmp: _token_file(tmp, 0o644), "qwen27b_hf_token_file", "readable by others",
                 id="hf-token-file-mode-644"),
    pytest.param(lambda tmp: _token_file(tmp, 0o640), "qwen27b_hf_token_file", "readable by others",
                 id="hf-token-file-group-readable"),
    pytest.param(lambda tmp: {"qwen27b_api_key_file": str(tmp / "missing.key")}, "qwen27b_api_key_file", "cannot read",
                 id="api-key-file-missing"),
]


@pytest.mark.parametrize("data, key, text", BAD_INPUTS)
def test_bad_input_is_refused_naming_host_key_and_fix(data, key, text, tmp_path):
    data = data(tmp_path) if callable(data) else data
    hosts = data if isinstance(data, list) else [("gpu-a", data)]
    with pytest.raises(BadHostData) as caught:
        validate_inventory(hosts)
    error, message = caught.value, str(caught.value)
    assert (error.host, error.key) == ("gpu-a", key), message
    assert message.startswith(f"gpu-a: {key}: ") and text in message, message
    assert error.fix and message.endswith(f". Fix: {error.fix}")


def test_monitoring_keys_default_and_scrapers_need_no_api_key():
    """node_exporter off and the health endpoint on 9120 by default; qwen27b_metrics_allow alone is
    accepted: it opens the health endpoint and node_exporter's port, not only vLLM's /metrics."""
    s = settings_for("h", {})
    assert (s.node_exporter, s.health_port, s.metrics_allow) == (False, 9120, None)
    s = settings_for("h", {"qwen27b_node_exporter": True, "qwen27b_health_port": 9200,
                           "qwen27b_metrics_allow": ["10.0.0.5/32"]})
    assert (s.node_exporter, s.health_port, s.metrics_allow, s.api_key_file) == (True, 9200, ["10.0.0.5/32"], None)
    assert settings_for("h", {"qwen27b_health_port": 9100}).health_port == 9100  # no node_exporter: free


def test_an_allow_list_open_to_every_address_is_accepted_with_a_warning():
    """Issue 25: 0.0.0.0/0 and ::/0 passed without a word; the firewall role notes each warning."""
    from qwen27b.plan.addresses import open_to_all

    wide = settings_for("h", {"qwen27b_firewall_allow": ["0.0.0.0/0", "10.0.0.0/8"], "qwen27b_metrics_allow": ["::/0"]})
    warnings = open_to_all(wide)
    assert len(warnings) == 2 and "qwen27b_firewall_allow lists 0.0.0.0/0" in warnings[0]
    assert "qwen27b_metrics_allow lists ::/0" in warnings[1] and "without the key" in warnings[1]
    assert open_to_all(settings_for("h", {"qwen27b_firewall_allow": ["10.0.0.0/8", "10.0.0.7/32"]})) == []


def test_other_data_keys_pass():
    assert settings_for("h", {"ssh_user": "admin", "_sudo": True, "my_lab_rack": 3}).port == 8000


def test_port_used_twice_on_one_machine():
    hosts = [("a", {"ssh_hostname": "10.0.0.5"}), ("b", {"ssh_hostname": "10.0.0.6"}),
             ("c", {"ssh_hostname": "10.0.0.5", "qwen27b_port": 8000})]
    with pytest.raises(BadHostData, match="c: qwen27b_port: port 8000 is already used by host entry 'a'"):
        validate_inventory(hosts)
    hosts[2][1]["ssh_hostname"] = "10.0.0.7"
    assert set(validate_inventory(hosts)) == {"a", "b", "c"}
    # another sshd behind the same address (a container, a forwarded port) is another machine
    hosts[2][1].update(ssh_hostname="10.0.0.5", ssh_port=2222, qwen27b_port=8001)
    assert set(validate_inventory(hosts)) == {"a", "b", "c"}


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


@settings(max_examples=examples(300), deadline=None)
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


def test_good_values_pass():
    s = settings_for("h", {
        "qwen27b_port": 1024, "qwen27b_gpu_indices": [2, 3], "qwen27b_tensor_parallel_size": 2,
        "qwen27b_serve_flags": {"--max-model-len": 4096, "--gpu-memory-utilization": 0.9, "--enforce-eager": True,
                                "--tensor-parallel-size": "2", "--kv-cache-dtype": "fp8_e5m2",
                                "--speculative-config": '{"method": "dflash"}'},
        "qwen27b_served_model_name": "Qwen/Qwen3.8-27B", "qwen27b_python_mirror": "file:///srv/mirror/python",
        "qwen27b_wheel_mirror": "http://10.0.0.1:8080/wheels/", "qwen27b_model_source": "mirror",
        "qwen27b_model_mirror": "https://mirror.lab/models", "qwen27b_http_proxy": "http://user:p%40ss@proxy.lab:3128",
        "qwen27b_stack_overrides": {"serve": {"max_num_seqs": 2, "gpu_memory_utilization": 0.85,
                                              "cuda_graph_reserve_mib": 0}}})
    assert s.port == 1024 and s.serve_flags["--max-model-len"] == 4096


# Shapes the validators look into (flags, overrides, URLs), with values of every type.
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(), st.text(max_size=12),
                      st.lists(st.integers(-1, 3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
FLAGS = st.dictionaries(st.sampled_from(["--max-model-len", "--max-num-seqs", "--tensor-parallel-size", "--port",
                                         "--gpu-memory-utilization", "--enforce-eager", "max-model-len", "--x\n", "--a b"]),
                        ANY_VALUE, max_size=4)
SECTION = st.one_of(ANY_VALUE, st.fixed_dictionaries({}, optional={"id": ANY_VALUE, "revision": ANY_VALUE,
                                                                   "sha256": ANY_VALUE}))
OVERRIDES = st.fixed_dictionaries({}, optional={
    "model": SECTION, "draft": SECTION, "vllm": SECTION, "model_revision": ANY_VALUE, "draft_revision": ANY_VALUE,
    "serve": st.one_of(ANY_VALUE, st.dictionaries(st.sampled_from(["max_model_len", "max_num_seqs", "runtime_overhead_mib",
                                                                   "gpu_memory_utilization", "env"]), ANY_VALUE, max_size=3))})
URLISH = st.one_of(st.text(max_size=20), st.builds(lambda a, b: a + b, st.sampled_from(["http://", "file://", "socks5://", ""]),
                                                   st.text(max_size=15)))
STRUCTURED = st.fixed_dictionaries({}, optional={
    "qwen27b_serve_flags": FLAGS, "qwen27b_stack_overrides": OVERRIDES, "qwen27b_tensor_parallel_size": ANY_VALUE,
    "qwen27b_gpu_indices": st.one_of(ANY_VALUE, st.lists(st.one_of(st.integers(-1, 8), st.text(max_size=2)), max_size=5)),
    "qwen27b_http_proxy": URLISH, "qwen27b_python_mirror": URLISH, "qwen27b_model_mirror": URLISH,
    "qwen27b_served_model_name": ANY_VALUE, "qwen27b_port": ANY_VALUE, "qwen27b_model_source": ANY_VALUE})


@settings(max_examples=examples(300), deadline=None)
@given(STRUCTURED)
def test_fuzzed_structured_data_is_accepted_or_refused_clearly(data):
    try:
        validate_inventory([("fuzz", data)])
    except BadHostData as error:
        assert str(error).startswith("fuzz: qwen27b_") and str(error).endswith(f"Fix: {error.fix}") and error.fix


def test_pyinfra_dry_run_with_a_bad_key_stops_before_any_host_clearly(tmp_path):
    """The real `pyinfra inventory deploy.py --dry` on @fake recorded hosts (as tests/plans/test_plans.py runs it)."""
    import os
    import subprocess
    import sys

    root = ROOT
    inventory = tmp_path / "typo.py"
    inventory.write_text("from inventory.recorded import _fake\n"
                         "hosts = [_fake('v100x4-2204-fresh'), _fake('v100x1-2004', qwen27b_tensor_paralel_size=1)]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(root)
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y"], cwd=root,
                            capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-2000:]
    assert ("bad inventory data, no host was touched: @fake/v100x1-2004: qwen27b_tensor_paralel_size: unknown key. "
            "Fix: did you mean 'qwen27b_tensor_parallel_size'?") in out, out[-2000:]
    assert "Traceback" not in out and "Loaded fact" not in out and "operation(s) planned" not in out, out[-2000:]


@pytest.mark.parametrize("groups, host, key, text", [
    ({"lab": [("gpu-1", {}), ("gpu-2", {}), ("gpu-1", {"qwen27b_port": 8001})]}, "gpu-1", "inventory",
     "listed twice in group 'lab'"),
    ({"lab": (["gpu-1", "gpu-1"], {})}, "gpu-1", "inventory", "listed twice in group 'lab'"),
    ({"a": [("gpu-1", {"qwen27b_port": 8000})], "b": [("gpu-1", {"qwen27b_port": 8001})]}, "gpu-1", "qwen27b_port",
     "8001 in group 'b' but 8000 in group 'a'"),
    ({"lab": []}, "(inventory)", "hosts", "the inventory lists no host"),
    ({}, "(inventory)", "hosts", "the inventory lists no host"),
])
def test_inventory_entries_pyinfra_would_merge_or_an_empty_inventory_are_refused(groups, host, key, text):
    """Issue 25: pyinfra keeps one host per name (merging the entries' data) and runs nothing for an
    empty inventory, exiting 0 without a word."""
    from qwen27b.plan.inventory import check_listed_once

    with pytest.raises(BadHostData) as caught:
        check_listed_once(groups)
    assert (caught.value.host, caught.value.key) == (host, key) and text in str(caught.value) and caught.value.fix


def test_a_host_in_two_groups_with_agreeing_data_passes():
    from qwen27b.plan.inventory import check_listed_once

    check_listed_once({"lab": [("gpu-1", {"qwen27b_port": 8000}), "gpu-2"], "qwen27b_gateway": ["gpu-1"],
                       "pair": [("gpu-1", {"qwen27b_port": 8000})]})


@pytest.mark.parametrize("text, message", [
    ("lab = []\n", "the inventory lists no host"),
    ("lab = [('@local', {}), ('@local', {'qwen27b_port': 8001})]\n", "@local: inventory: listed twice in group 'lab'")])
def test_pyinfra_dry_run_of_an_empty_or_duplicated_inventory_fails_clearly(tmp_path, text, message):
    """The real `pyinfra inventory deploy.py --dry`: before, both exited 0 (the duplicate deployed one entry)."""
    import os
    import subprocess
    import sys

    root = ROOT
    inventory = tmp_path / "inv.py"
    inventory.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(root)
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y"], cwd=root,
                            capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "bad inventory, no host was touched: " in out and message in out, out[-2000:]
    assert "Traceback" not in out and "Loaded fact" not in out, out[-2000:]
