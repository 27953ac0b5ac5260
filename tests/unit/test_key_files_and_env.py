"""Key files and the env allow-list (issue 25, low items): a key file is the file itself, small,
regular, one key; a serve.env name never makes the service load other code."""

from __future__ import annotations

import os
import threading

import pytest

from qwen27b.onhost.secretfile import MAX_BYTES, SecretFileError, load_secret
from qwen27b.plan import allowlist
from qwen27b.plan.hostdata import BadHostData, settings_for


def key(tmp_path, text: str, name: str = "api.key"):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_symlink_to_a_0600_file_is_refused(tmp_path):
    target = key(tmp_path, "the-real-key-0123\n", "other.key")
    link = tmp_path / "api.key"
    link.symlink_to(target)
    with pytest.raises(SecretFileError) as caught:
        load_secret(str(link))
    assert "symlink" in caught.value.problem and "the-real-key" not in str(caught.value)
    with pytest.raises(BadHostData) as refused:
        settings_for("h", {"qwen27b_api_key_file": str(link)})
    assert refused.value.key == "qwen27b_api_key_file"


def test_a_file_over_64_kib_is_refused_not_cut(tmp_path):
    with pytest.raises(SecretFileError) as caught:
        load_secret(str(key(tmp_path, "a" * (MAX_BYTES + 1))))
    assert "64 KiB" in caught.value.problem
    assert load_secret(str(key(tmp_path, "a" * (MAX_BYTES - 1), "ok.key"))) == "a" * (MAX_BYTES - 1)


def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "api.key"
    os.mkfifo(fifo, 0o600)
    result = {}

    def read():
        try:
            load_secret(str(fifo))
        except SecretFileError as error:
            result["error"] = error

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the reader before failing
        with open(fifo, "w"):
            pass
        pytest.fail("load_secret hung on a FIFO")
    assert "not a regular file" in result["error"].problem


@pytest.mark.parametrize("text, name", [("OPENAI_API_KEY=", "VLLM_API_KEY"), ("HF_TOKEN=", "VLLM_API_KEY"),
                                        ("VLLM_API_KEY=", "OPENAI_API_KEY")])
def test_another_names_env_line_is_no_key(text, name):
    with pytest.raises(SecretFileError):
        load_secret_text(text, name)


@pytest.mark.parametrize("text, expected", [("abc==", "abc=="), ("Zm9vYmFy=", "Zm9vYmFy="), ("VLLM_API_KEY=k-1", "k-1")])
def test_keys_with_padding_and_the_own_name_still_load(text, expected):
    assert load_secret_text(text, "VLLM_API_KEY") == expected


def load_secret_text(text: str, name: str) -> str:
    from qwen27b.onhost.secretfile import parse_secret

    return parse_secret(text, name)


@pytest.mark.parametrize("name", ["VLLM_PLUGINS", "PYTHONWARNINGS", "BASH_ENV", "PYTHONBREAKPOINT", "LD_BIND_NOW"])
def test_env_names_that_load_code_are_refused(name):
    found = allowlist.problem("serve.env", {name: "x"})
    assert found and "other code" in found[0]
    assert allowlist.problem("serve.env", {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) is None


@pytest.mark.parametrize("name", ["GCONV_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "TRITON_LIBCUDA_PATH",
                                  "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "NCCL_PROFILER_PLUGIN", "VLLM_TORCH_PROFILER_DIR"])
def test_env_names_outside_the_allow_list_are_refused(name):
    """Issue 51: serve.env names pass by allow-list; each of these loads a library, writes a
    directory or opens a route, and passed the old deny-list."""
    found = allowlist.problem("serve.env", {name: "x"})
    assert found and "ENV_ALLOWED" in found[0], found


def test_every_env_name_the_stack_sets_is_allowed():
    from qwen27b.plan.stack import load_stack

    stack = load_stack()
    names = {n for p in stack["profiles"].values() for n in ((p.get("serve") or {}).get("env") or {})}
    names |= {v["env"] for b in stack["vllm_builds"].values() for v in b.values() if isinstance(v, dict) and "env" in v}
    assert names and names <= allowlist.ENV_ALLOWED, names - allowlist.ENV_ALLOWED
