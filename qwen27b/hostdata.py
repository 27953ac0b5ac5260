"""Inventory data: every `qwen27b_*` key, its type, default and meaning, checked before any host
is touched. A mistake is refused naming the host, the key and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import stat
from dataclasses import dataclass, fields
from typing import Any


class BadHostData(ValueError):
    """Inventory data that cannot be deployed; str() names host, key and fix."""

    def __init__(self, host: str, key: str, problem: str, fix: str):
        self.host, self.key, self.problem, self.fix = host, key, problem, fix
        super().__init__(f"{host}: {key}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class Settings:
    """One host's validated qwen27b data (the field name is the inventory key minus 'qwen27b_')."""

    profile: str | None = None  # None: chosen from the GPUs; "cpu-smoke" for the CPU profile
    stack_overrides: dict | None = None  # merged into the stack profile (see stack.resolve_stack)
    tensor_parallel_size: int | None = None  # None: all (visible) GPUs
    gpu_indices: list | None = None  # None: every GPU; else CUDA_VISIBLE_DEVICES
    port: int = 8000
    bind_address: str | None = None  # None: the host's lab address when known, else 127.0.0.1
    served_model_name: str | None = None  # None: the stack model's served_name
    api_key_file: str | None = None  # controller-side file holding the API key (mode 0600)
    serve_flags: dict | None = None  # pinned vllm serve flags, e.g. {"--max-model-len": 4096}
    speculative: bool = True  # DFlash2 speculative decoding where the profile has a draft
    prefix_caching: bool = True
    skip_reboot: bool = False  # never reboot this host; the plan says a reboot is pending
    mok_key_path: str | None = None  # MOK signing key for secure boot hosts
    hold_kernel: bool = False  # apt-mark hold the running kernel too
    min_free_disk_gib: int = 10  # headroom beyond the weights on the model disk
    health_interval_s: int = 30
    health_failures_before_restart: int = 3
    python_mirror: str | None = None  # UV_PYTHON_INSTALL_MIRROR for air-gapped labs
    wheelhouse_dir: str | None = None  # controller dir with the vLLM build's wheels + manifest.json
    wheel_mirror: str | None = None  # a lab mirror (pip --find-links URL) when no wheelhouse is pushed
    model_source: str | None = None  # hub | mirror | controller; None: the stack model's default_source
    model_mirror: str | None = None  # base URL of a lab mirror holding <id>@<revision>/ with manifest.json
    model_local_dir: str | None = None  # controller dir holding the checkpoint (model_source controller)
    draft_local_dir: str | None = None  # controller dir holding the DFlash2 draft
    hf_token_file: str | None = None  # controller file (0600) with a Hugging Face token
    http_proxy: str | None = None  # proxy the host uses to reach mirrors/hubs
    keep_model_revisions: int = 1  # old revisions kept for rollback
    dflash_cli: bool = False  # also install PyPI's `dflash` CLI (benchmarks against the server)


_TYPES: dict[str, tuple[type, ...]] = {
    "profile": (str,),
    "stack_overrides": (dict,),
    "tensor_parallel_size": (int,),
    "gpu_indices": (list,),
    "port": (int,),
    "bind_address": (str,),
    "served_model_name": (str,),
    "api_key_file": (str,),
    "serve_flags": (dict,),
    "speculative": (bool,),
    "prefix_caching": (bool,),
    "skip_reboot": (bool,),
    "mok_key_path": (str,),
    "hold_kernel": (bool,),
    "min_free_disk_gib": (int,),
    "health_interval_s": (int,),
    "health_failures_before_restart": (int,),
    "python_mirror": (str,),
    "wheelhouse_dir": (str,),
    "wheel_mirror": (str,),
    "model_source": (str,),
    "model_mirror": (str,),
    "model_local_dir": (str,),
    "draft_local_dir": (str,),
    "hf_token_file": (str,),
    "http_proxy": (str,),
    "keep_model_revisions": (int,),
    "dflash_cli": (bool,),
}
PREFIX = "qwen27b_"
KEYS = [PREFIX + f.name for f in fields(Settings)]
_POSITIVE = {"tensor_parallel_size", "min_free_disk_gib", "health_interval_s", "health_failures_before_restart",
             "keep_model_revisions"}
MODEL_SOURCES = ("hub", "mirror", "controller")


def _check_type(host: str, key: str, name: str, value: Any) -> None:
    wanted = _TYPES[name]
    # bool is an int in Python: a `True` port is a typo, not a number.
    if isinstance(value, bool) and bool not in wanted:
        ok = False
    else:
        ok = isinstance(value, wanted)
    if not ok:
        kind = " or ".join(t.__name__ for t in wanted)
        example = {"int": "8000", "str": '"text"', "bool": "True", "dict": "{...}", "list": "[0, 1]"}[wanted[0].__name__]
        raise BadHostData(host, key, f"expected {kind}, got {type(value).__name__} {value!r}", f"write it as {example}")


def settings_for(host: str, data: dict) -> Settings:
    """Validate one host's data -> Settings. Unknown qwen27b_* keys (and near-misses) are refused."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in KEYS:
            name = key[len(PREFIX):]
            if value is None:
                continue
            _check_type(host, key, name, value)
            values[name] = value
            continue
        close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.8)
        if key.startswith(PREFIX) or close:
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(KEYS)}"
            raise BadHostData(host, key, "unknown key", hint)
    settings = Settings(**values)
    _check_values(host, settings)
    return settings


def _check_values(host: str, s: Settings) -> None:
    for name in _POSITIVE:
        value = getattr(s, name)
        if value is not None and value <= 0:
            raise BadHostData(host, PREFIX + name, f"must be a positive number, got {value}", "use a value of 1 or more")
    if not 1 <= s.port <= 65535:
        raise BadHostData(host, "qwen27b_port", f"{s.port} is not a TCP port", "use 1-65535 (default 8000)")
    if s.gpu_indices is not None:
        if not s.gpu_indices or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in s.gpu_indices):
            raise BadHostData(host, "qwen27b_gpu_indices", f"{s.gpu_indices!r} is not a list of GPU indices", "e.g. [0, 1]")
        if len(set(s.gpu_indices)) != len(s.gpu_indices):
            raise BadHostData(host, "qwen27b_gpu_indices", f"{s.gpu_indices!r} repeats a GPU", "list each GPU once")
        if s.tensor_parallel_size and s.tensor_parallel_size > len(s.gpu_indices):
            raise BadHostData(host, "qwen27b_tensor_parallel_size",
                              f"{s.tensor_parallel_size} is more than the {len(s.gpu_indices)} GPUs in qwen27b_gpu_indices",
                              "lower the TP size or list more GPUs")
    if s.bind_address is not None:
        try:
            ipaddress.ip_address(s.bind_address)
        except ValueError:
            raise BadHostData(host, "qwen27b_bind_address", f"{s.bind_address!r} is not an IP address",
                              "give the lab interface's address, e.g. 192.168.1.20") from None
    if s.model_source is not None and s.model_source not in MODEL_SOURCES:
        close = difflib.get_close_matches(s.model_source, MODEL_SOURCES, n=1)
        raise BadHostData(host, "qwen27b_model_source", f"{s.model_source!r} is not a model source",
                          f"use one of {', '.join(MODEL_SOURCES)}" + (f" (did you mean '{close[0]}'?)" if close else ""))
    if s.model_source == "mirror" and not s.model_mirror:
        raise BadHostData(host, "qwen27b_model_mirror", "model_source is 'mirror' but no mirror URL is set",
                          "set qwen27b_model_mirror to the lab mirror's base URL")
    if s.model_source == "controller" and not s.model_local_dir:
        raise BadHostData(host, "qwen27b_model_local_dir", "model_source is 'controller' but no local dir is set",
                          "set qwen27b_model_local_dir to the checkpoint directory on this machine")
    if s.stack_overrides:
        _check_overrides(host, s.stack_overrides)
    for name in ("api_key_file", "hf_token_file"):
        if getattr(s, name):
            _check_secret_file(host, PREFIX + name, getattr(s, name))
    if s.serve_flags:
        for flag in s.serve_flags:
            if not (isinstance(flag, str) and flag.startswith("--")):
                raise BadHostData(host, "qwen27b_serve_flags", f"{flag!r} is not a vllm serve flag",
                                  'write flags with their dashes, e.g. {"--max-model-len": 4096}')


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION = re.compile(r"^(?:[0-9a-f]{7,40}|[A-Za-z0-9][A-Za-z0-9._-]{0,99})$")  # a commit, or a tag/branch name
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def _check_overrides(host: str, overrides: dict) -> None:
    """The values in stack overrides that end up in paths and downloads: ids, revisions, hashes."""
    key = "qwen27b_stack_overrides"
    for section in ("model", "draft"):
        entry = overrides.get(section) or {}
        if not isinstance(entry, dict):
            raise BadHostData(host, f"{key}.{section}", f"expected a dict, got {type(entry).__name__}", "e.g. {'id': 'org/name'}")
        if "id" in entry and not (isinstance(entry["id"], str) and HUB_ID.match(entry["id"]) and ".." not in entry["id"]):
            raise BadHostData(host, f"{key}.{section}.id", f"{entry['id']!r} is not a hub id 'org/name'",
                              "use the checkpoint's hub id, e.g. 'nvidia/Qwen3.8-27B-NVFP4' (no paths, no '..')")
        revision = entry.get("revision", overrides.get(f"{section}_revision"))
        if revision is not None and not (isinstance(revision, str) and REVISION.match(revision) and ".." not in revision):
            raise BadHostData(host, f"{key}.{section}_revision", f"{revision!r} is not a commit or tag",
                              "pin a commit hash (7-40 hex) or a tag name")
    vllm = overrides.get("vllm") or {}
    if isinstance(vllm, dict) and vllm.get("sha256") is not None and not (
            isinstance(vllm["sha256"], str) and SHA256.match(vllm["sha256"])):
        raise BadHostData(host, f"{key}.vllm.sha256", f"{vllm['sha256']!r} is not a sha256 (64 hex digits)",
                          "copy the wheel's full sha256 (sha256sum FILE)")


def _check_secret_file(host: str, key: str, path: str) -> None:
    """A key or token file the controller reads must exist and be private to its owner."""
    try:
        mode = stat.S_IMODE(os.stat(os.path.expanduser(path)).st_mode)
    except OSError as error:
        raise BadHostData(host, key, f"cannot read {path}: {error.strerror}", "create it (chmod 600) or fix the path") from None
    if mode & 0o077:
        raise BadHostData(host, key, f"{path} is mode {mode:o}, readable by others", f"chmod 600 {path}")


def lab_address(data: dict) -> str | None:
    """The host's address on the lab network when the inventory states one as an IP."""
    for key in ("ssh_hostname",):
        value = data.get(key)
        if isinstance(value, str):
            try:
                return str(ipaddress.ip_address(value))
            except ValueError:
                return None
    return None


def validate_inventory(hosts: list[tuple[str, dict]]) -> dict[str, Settings]:
    """Check every host's data and what hosts share (ports on one machine) before any is touched."""
    settings = {name: settings_for(name, data) for name, data in hosts}
    seen: dict[tuple[str, int], str] = {}
    for name, data in hosts:
        machine = data.get("ssh_hostname") or name
        key = (str(machine), settings[name].port)
        if key in seen:
            raise BadHostData(name, "qwen27b_port",
                              f"port {key[1]} is already used by host entry '{seen[key]}' on the same machine {machine}",
                              "give each entry on one machine its own port")
        seen[key] = name
    return settings
