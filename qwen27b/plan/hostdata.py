"""Inventory data: every `qwen27b_*` key, its type, default and meaning, checked before any host
is touched. A mistake is refused naming the host, the key and the fix.

settings_for and the checks of single keys are here; the keys themselves (Settings) are in
settings.py, and the checks are cut at their seams (issue 50 item 3): addresses (addresses and
networks), urlsecret (URLs, secrets, key files), overridekeys (qwen27b_stack_overrides), copykeys
(qwen27b_instances, beside instances.py), nodekeys (qwen27b_node_*, beside multinode.py).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import replace
from functools import lru_cache
from typing import Any

from qwen27b.plan import allowlist
from qwen27b.plan.addresses import ADDRESS_KEYS, NETWORK_KEYS, check_ssh_address, parse_address, parse_network
from qwen27b.plan.urlsecret import (NO_LOGIN_URL_KEYS, SECRET_FLAG, SECRET_FLAG_FIX, URL_KEYS, _check_apt_mirror, _check_url,
                                    check_secret_file, redact_url, url_has_password)
from qwen27b.plan.copykeys import check_instance_keys
from qwen27b.plan.modelsdir import check_models_dir
from qwen27b.plan.stack import load_stack
from qwen27b.plan.nodekeys import check_node_keys
from qwen27b.plan.overridekeys import _check_overrides
from qwen27b.plan.settings import (GATEWAY_KEYS, GATEWAY_TYPES, KEYS, NODE_EXPORTER_PORT, OPEN_API, PREFIX, BadHostData,
                                   Settings)
from qwen27b.onhost.contract import http_base  # noqa: F401 (the one URL builder: plan and controller import it here)


_TYPES: dict[str, tuple[type, ...]] = {
    "profile": (str,),
    "engine_profile": (str,),
    "stack_overrides": (dict,),
    "tensor_parallel_size": (int,),
    "gpu_indices": (list,),
    "port": (int,),
    "bind_address": (str,),
    "served_model_name": (str,),
    "api_key_file": (str,),
    "serve_flags": (dict,),
    "speculative": (str, bool),
    "model": (str,),
    "agent_parsers": (bool,),
    "prefix_caching": (bool,),
    "skip_reboot": (bool,),
    "mok_key_path": (str,),
    "hold_kernel": (bool,),
    "min_free_disk_gib": (int,),
    "models_dir": (str,),
    "health_interval_s": (int,),
    "health_failures_before_restart": (int,),
    "python_mirror": (str,),
    "release_mirror": (str,),
    "hf_endpoint": (str,),
    "modelscope_endpoint": (str,),
    "pypi_index": (str,),
    "torch_index": (str,),
    "apt_mirror": (str,),
    "wheelhouse_dir": (str,),
    "require_hashes": (bool,),
    "wheel_mirror": (str,),
    "model_source": (str,),
    "model_mirror": (str,),
    "model_local_dir": (str,),
    "draft_local_dir": (str,),
    "hf_token_file": (str,),
    "http_proxy": (str,),
    "keep_model_revisions": (int,),
    "keep_releases": (int,),
    "rollback_on_regression": (bool,),
    "dflash_cli": (bool,),
    "weights_fanout": (str,),
    "firewall_allow": (list,),
    "metrics_allow": (list,),
    "node_exporter": (bool,),
    "take_over_unit": (bool,),
    "health_port": (int,),
    "node_group": (str,),
    "node_role": (str,),
    "node_address": (str,),
    "node_interface": (str,),
    "interconnect_gbps": (int, float),
    "instances": (list,),
    "power_limit_w": (int, dict),
    "ecc": (str, bool),  # YAML 1.1 reads a bare `on` as True
    "uninstall_weights": (bool,),
    "uninstall_driver": (bool,),
    "uninstall_chat_data": (bool,),
}
# Whole-number keys: (least, most). The tops are far past any real use; without them a health
# interval of 10**18 s passed and the timer ignored it (systemd takes spans up to ~584 years).
_RANGES = {"tensor_parallel_size": (1, 64), "min_free_disk_gib": (1, 100_000), "health_interval_s": (1, 86_400),
           "health_failures_before_restart": (1, 1000), "keep_model_revisions": (1, 100), "keep_releases": (1, 100)}
MODEL_SOURCES = ("hub", "modelscope", "mirror", "controller")
SPECULATIVE_MODES = ("auto", "mtp", "dflash2", "ngram", "off")
WEIGHTS_FANOUT = ("none", "tree")  # qwen27b.plan.fanout.MODES
# The unit drops every capability (CapabilityBoundingSet=), so user qwen27b cannot bind below 1024.
FIRST_UNPRIVILEGED_PORT = 1024
# Names end up unquoted in unit lines and the health timer's ExecStart: no spaces, no quotes.
SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
SERVE_FLAG = re.compile(r"^--[a-z0-9][a-z0-9_-]*$")
_TLS_FIX = ("TLS on vLLM's port is not wired into the readiness check, health timer and verify (http://): "
            "terminate TLS in a reverse proxy on the host or in front of it (docs/security.md)")
# Flags that have their own key (the plan, health check and verify read that key, not the flag).
OWN_KEY_FLAGS = {
    "--port": "set qwen27b_port instead",
    "--host": "set qwen27b_bind_address instead",
    "--served-model-name": "set qwen27b_served_model_name instead",
    "--model": "override the checkpoint with qwen27b_stack_overrides {'model': {'id': ...}}",
    "--middleware": "the route guard (qwen27b_auth.RequireKey) comes with qwen27b_api_key_file",
    # the readiness check, the health timer and verify speak http:// to the port
    "--ssl-keyfile": _TLS_FIX,
    "--ssl-certfile": _TLS_FIX,
}
POSITIVE_FLAGS = ("--tensor-parallel-size", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_type(host: str, key: str, name: str, value: Any) -> None:
    wanted = _TYPES.get(name) or GATEWAY_TYPES[name]
    # bool is an int in Python: a `True` port is a typo, not a number.
    if isinstance(value, bool) and bool not in wanted:
        ok = False
    else:
        ok = isinstance(value, wanted)
    if not ok:
        kind = " or ".join(t.__name__ for t in wanted)
        example = {"int": "8000", "str": '"text"', "bool": "True", "dict": "{...}", "list": "[0, 1]"}[wanted[0].__name__]
        example = EXAMPLES.get(name, example)
        raise BadHostData(host, key, f"expected {kind}, got {type(value).__name__} {value!r}", f"write it as {example}")


def _check_no_control_chars(host: str, key: str, value: Any) -> None:
    """A newline in any string (or dict key) would add lines to the rendered unit or env file."""
    if isinstance(value, str):
        if CONTROL.search(value):
            raise BadHostData(host, key, f"{value!r} contains a control character (newline, tab, ...)",
                              "remove it: values end up in unit files, env files and shell commands")
    elif isinstance(value, dict):
        for sub, item in value.items():
            _check_no_control_chars(host, key, sub)
            _check_no_control_chars(host, f"{key}.{sub}" if isinstance(sub, str) else key, item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_no_control_chars(host, key, item)


ASCII_DIGITS = re.compile(r"[0-9]+")


def canonical_flag(name: str) -> str:
    """vLLM's argument parser reads `--max_model_len` as `--max-model-len`: every check and the
    planner see the dashed spelling."""
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _positive_int(value: Any) -> int | None:
    """An int (or a string of ASCII digits) above 0, else None; bools are not numbers here.
    str.isdigit() and int() also take '４０９６' and Arabic-Indic digits: never here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and ASCII_DIGITS.fullmatch(value.strip()):
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


@lru_cache(maxsize=256)
def _near_misses(key: str) -> tuple[str, ...]:
    """The known key a host data key is a near-miss of (every host has the same other keys: once)."""
    return tuple(difflib.get_close_matches(key, KEYS, n=1, cutoff=0.8))


def settings_for(host: str, data: dict) -> Settings:
    """Validate one host's data -> Settings. Unknown qwen27b_* keys (and near-misses) are refused."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in KEYS:
            name = key[len(PREFIX):]
            if value is None or (name == "api_key_file" and value == OPEN_API):
                continue
            _check_type(host, key, name, value)
            _check_no_control_chars(host, key, value)
            if key in GATEWAY_KEYS:
                continue  # the gateway's own settings (qwen27b/plan/gateway.py)
            if name == "serve_flags":
                value = _normalise_serve_flags(host, value)
            if name == "ecc" and value is True:
                value = "on"
            if name in ADDRESS_KEYS:
                value = parse_address(host, key, value, ADDRESS_KEYS[name])
            if name in NETWORK_KEYS:
                value = [parse_network(host, key, network) for network in value]
            values[name] = value
            continue
        if isinstance(key, str) and key.lower() in KEYS:  # pyinfra's data keys are case-sensitive: it would be ignored
            raise BadHostData(host, key, "host data keys are lower case: this one would be ignored",
                              f"write it '{key.lower()}'")
        close = _near_misses(key)
        if key.startswith(PREFIX) or close:
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(KEYS)}"
            raise BadHostData(host, key, "unknown key", hint)
    check_ssh_address(host, data)
    settings = Settings(**values)
    if settings.models_dir is not None:
        settings = replace(settings, models_dir=check_models_dir(host, settings.models_dir, load_stack()["paths"]))
    _check_values(host, settings)
    settings = _engine_profile(host, settings)
    check_instance_keys(host, settings, set(values))
    return settings


def _check_networks(host: str, key: str, networks: list, empty: str) -> None:
    if not networks:
        raise BadHostData(host, key, empty, "list the lab networks, e.g. ['10.0.0.0/24'], or leave the key out")


POWER_RANGE_W = (50, 1000)
EXAMPLES = {"power_limit_w": "275 (watts for every GPU) or {0: 275, 1: 250}", "ecc": '"on"'}  # past any card's range either way; each card's own range is checked by the gate


def _check_power(host: str, s: Settings) -> None:
    """qwen27b_power_limit_w: whole watts (they reach `nvidia-smi -i N -pl W` in a unit line) per host or
    per GPU index; qwen27b_ecc: on only (turning ECC off on used cards hides the wear issue 27 reads)."""
    key, low, high = PREFIX + "power_limit_w", *POWER_RANGE_W
    per_gpu = s.power_limit_w if isinstance(s.power_limit_w, dict) else {"*": s.power_limit_w}
    if s.power_limit_w is not None:
        if not per_gpu:
            raise BadHostData(host, key, "is an empty mapping", "leave it out, or give {GPU index: watts}, e.g. {0: 275}")
        for gpu, watts in per_gpu.items():
            if gpu != "*" and not (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0
                                   or isinstance(gpu, str) and gpu.isascii() and gpu.isdigit()):
                raise BadHostData(host, key, f"{gpu!r} is not a GPU index", "key it by nvidia-smi's index, e.g. {0: 275}")
            if isinstance(watts, bool) or not isinstance(watts, int) or not low <= watts <= high:
                raise BadHostData(host, key, f"{watts!r} is not whole watts in {low}-{high}",
                                  "give whole watts within the card's range, e.g. 275 for a V100 (250-300 W)")
    if s.ecc is not None and s.ecc != "on":
        raise BadHostData(host, PREFIX + "ecc", f"{s.ecc!r} is not 'on'",
                          "leave it out (ECC left as found) or set it to on (takes effect after a reboot)")


def _check_values(host: str, s: Settings) -> None:
    for name, (least, most) in _RANGES.items():
        value = getattr(s, name)
        if value is not None and value <= 0:
            raise BadHostData(host, PREFIX + name, f"must be a positive number, got {value}", "use a value of 1 or more")
        if value is not None and value > most:
            raise BadHostData(host, PREFIX + name, f"{value} is more than {most}",
                              f"use {least}-{most} (default {getattr(Settings, name)})")
    _check_ports(host, s)
    _check_power(host, s)
    if s.serve_flags:
        _check_serve_flags(host, s)
    tp = s.tensor_parallel_size or _positive_int((s.serve_flags or {}).get("--tensor-parallel-size"))
    if s.gpu_indices is not None:
        if not s.gpu_indices or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in s.gpu_indices):
            raise BadHostData(host, "qwen27b_gpu_indices", f"{s.gpu_indices!r} is not a list of GPU indices", "e.g. [0, 1]")
        if len(set(s.gpu_indices)) != len(s.gpu_indices):
            raise BadHostData(host, "qwen27b_gpu_indices", f"{s.gpu_indices!r} repeats a GPU", "list each GPU once")
        tp_key = "qwen27b_tensor_parallel_size" if s.tensor_parallel_size else "qwen27b_serve_flags.--tensor-parallel-size"
        if tp and tp > len(s.gpu_indices):
            raise BadHostData(host, tp_key, f"{tp} is more than the {len(s.gpu_indices)} GPUs in qwen27b_gpu_indices",
                              "lower the TP size or list more GPUs")
        if tp and len(s.gpu_indices) % tp:
            fits = [n for n in range(1, len(s.gpu_indices) + 1) if len(s.gpu_indices) % n == 0]
            raise BadHostData(host, tp_key, f"{tp} does not divide the {len(s.gpu_indices)} GPUs in qwen27b_gpu_indices "
                              f"{s.gpu_indices} (vLLM would leave GPUs idle)",
                              f"use a TP size of {' or '.join(map(str, fits))}, or list a multiple of {tp} GPUs")
    if s.speculative_mode not in SPECULATIVE_MODES:
        close = difflib.get_close_matches(str(s.speculative), SPECULATIVE_MODES, n=1)
        raise BadHostData(host, "qwen27b_speculative", f"{s.speculative!r} is not a speculative method",
                          (f"did you mean '{close[0]}'? " if close else "") + f"use one of {', '.join(SPECULATIVE_MODES)} "
                          "(auto: the planner picks from the stack's evidence)")
    if s.profile is not None:
        from qwen27b.plan.stack import load_stack
        profiles = list(load_stack()["profiles"])
        if s.profile not in profiles:
            close = difflib.get_close_matches(s.profile, profiles, n=1)
            raise BadHostData(host, "qwen27b_profile", f"{s.profile!r} is not a profile of the stack file",
                              (f"did you mean '{close[0]}'? " if close else "") + f"use one of {', '.join(profiles)}, "
                              "or leave it out (the GPUs choose it)")
    if s.model is not None:
        from qwen27b.plan.stack import load_stack
        targets = [k for k, v in load_stack()["models"].items() if not v.get("speculative")]
        if s.model not in targets:
            close = difflib.get_close_matches(s.model, targets, n=1)
            raise BadHostData(host, "qwen27b_model", f"{s.model!r} is not a checkpoint of the stack's models table",
                              (f"did you mean '{close[0]}'? " if close else "") + f"use one of {', '.join(targets)}, "
                              "or leave it out (the profile's default)")
    if s.served_model_name is not None and not SERVED_NAME.match(s.served_model_name):
        raise BadHostData(host, "qwen27b_served_model_name", f"{s.served_model_name!r} is not a plain model name",
                          "use letters, digits and . _ - : / @ + only (no spaces or quotes), e.g. 'qwen3.8-27b'")
    for name, schemes in URL_KEYS.items():
        if getattr(s, name) is not None:
            _check_url(host, PREFIX + name, getattr(s, name), schemes)
    for name in NO_LOGIN_URL_KEYS:
        if getattr(s, name) is not None and url_has_password(getattr(s, name)):
            raise BadHostData(host, PREFIX + name, f"{redact_url(getattr(s, name))} carries a login, which would reach "
                              "a command line (the URLs built from it are arguments)",
                              "serve the mirror without a login on the lab network (a proxy's login goes in "
                              "qwen27b_http_proxy, kept in a root-only file)")
    if s.apt_mirror is not None:
        _check_apt_mirror(host, s.apt_mirror)
    if s.model_source is not None and s.model_source not in MODEL_SOURCES:
        close = difflib.get_close_matches(s.model_source, MODEL_SOURCES, n=1)
        raise BadHostData(host, "qwen27b_model_source", f"{s.model_source!r} is not a model source",
                          f"use one of {', '.join(MODEL_SOURCES)}" + (f" (did you mean '{close[0]}'?)" if close else ""))
    if s.model_source == "mirror" and not s.model_mirror:
        raise BadHostData(host, "qwen27b_model_mirror", "model_source is 'mirror' but no mirror URL is set",
                          "set qwen27b_model_mirror to the lab mirror's base URL")
    if s.weights_fanout not in WEIGHTS_FANOUT:
        close = difflib.get_close_matches(s.weights_fanout, WEIGHTS_FANOUT, n=1)
        raise BadHostData(host, "qwen27b_weights_fanout", f"{s.weights_fanout!r} is not a fan-out mode",
                          f"use one of {', '.join(WEIGHTS_FANOUT)}" + (f" (did you mean '{close[0]}'?)" if close else ""))
    if s.weights_fanout == "tree" and s.model_source not in (None, "mirror"):
        raise BadHostData(host, "qwen27b_weights_fanout", f"'tree' fans out a mirror download, but model_source is "
                          f"{s.model_source!r}", "set qwen27b_model_source to 'mirror', or leave the fan-out at 'none'")
    if s.firewall_allow is not None:
        _check_networks(host, "qwen27b_firewall_allow", s.firewall_allow,
                        "an empty list would shut everyone out, the deploy's verify included")
    if s.metrics_allow is not None:
        # also without an API key: the list then opens the health endpoint and node_exporter's port
        _check_networks(host, "qwen27b_metrics_allow", s.metrics_allow, "an empty list allows no scraper")
    if s.model_source == "controller" and not s.model_local_dir:
        raise BadHostData(host, "qwen27b_model_local_dir", "model_source is 'controller' but no local dir is set",
                          "set qwen27b_model_local_dir to the checkpoint directory on this machine")
    if s.stack_overrides:
        _check_overrides(host, s.stack_overrides)
    check_node_keys(host, s)
    if s.mok_key_path is not None and not (allowlist.MOK_KEY_PATH.ok(s.mok_key_path) and ".." not in s.mok_key_path):
        raise BadHostData(host, "qwen27b_mok_key_path", f"{s.mok_key_path!r} is not allowed here ({allowlist.MOK_KEY_PATH.why})",
                          f"give the key's absolute path, e.g. {allowlist.MOK_KEY_PATH.example}")
    if s.wheelhouse_dir is not None:
        name = os.path.basename(os.path.normpath(os.path.expanduser(s.wheelhouse_dir)))
        if not allowlist.WHEELHOUSE_NAME.ok(name):
            raise BadHostData(host, "qwen27b_wheelhouse_dir", f"the folder name {name!r} is not allowed here "
                              f"({allowlist.WHEELHOUSE_NAME.why})", "rename the folder to letters, digits and . _ + - only, "
                              f"e.g. {allowlist.WHEELHOUSE_NAME.example}")
        # without wheels there, the vllm role would install from the indexes instead, with no word
        local = os.path.expanduser(s.wheelhouse_dir)
        if not os.path.isdir(local) or not any(n.endswith(".whl") for n in os.listdir(local)):
            raise BadHostData(host, "qwen27b_wheelhouse_dir", f"{s.wheelhouse_dir} is "
                              + ("no directory with wheels (*.whl)" if os.path.isdir(local) else "not a directory")
                              + " on this controller: the deploy would install from the internet instead",
                              "fix the path, build one (`python3 -m qwen27b.tools.cpu_smoke wheelhouse`), or remove "
                              "the key to install from the stack's indexes")
    for name in ("api_key_file", "hf_token_file"):
        if getattr(s, name):
            check_secret_file(host, PREFIX + name, getattr(s, name))


def _check_ports(host: str, s: Settings) -> None:
    """The service's port and the health endpoint's: unprivileged TCP ports, apart from each other
    and from node_exporter's when the deploy installs it."""
    for key, port, default in (("qwen27b_port", s.port, 8000), ("qwen27b_health_port", s.health_port, 9120)):
        if not 1 <= port <= 65535:
            raise BadHostData(host, key, f"{port} is not a TCP port", f"use 1024-65535 (default {default})")
        if port < FIRST_UNPRIVILEGED_PORT:
            raise BadHostData(host, key, f"{port} is a privileged port: the service runs as user qwen27b "
                              "without capabilities and cannot bind it",
                              f"use 1024-65535 (default {default}); put a reverse proxy in front for 80/443")
    if s.health_port == s.port:
        raise BadHostData(host, "qwen27b_health_port", f"{s.health_port} is also qwen27b_port (vLLM's port)",
                          "give the health endpoint its own port (default 9120)")
    if s.node_exporter:
        for key, port in (("qwen27b_port", s.port), ("qwen27b_health_port", s.health_port)):
            if port == NODE_EXPORTER_PORT:
                raise BadHostData(host, key, f"{port} is node_exporter's port (qwen27b_node_exporter is set)",
                                  "use another port, or leave qwen27b_node_exporter out")


def _normalise_serve_flags(host: str, flags: dict) -> dict:
    """The flags under their dashed names (what vLLM reads); a flag given in two spellings, or a
    secret given as a flag, is refused."""
    key, out, given = "qwen27b_serve_flags", {}, {}
    for flag, value in flags.items():
        if not (isinstance(flag, str) and SERVE_FLAG.match(flag)):
            raise BadHostData(host, key, f"{flag!r} is not a vllm serve flag",
                              'write flags with their dashes, e.g. {"--max-model-len": 4096}')
        name = canonical_flag(flag)
        if SECRET_FLAG.match(name):
            raise BadHostData(host, f"{key}.{flag}", f"{flag} passes a secret on the command line", SECRET_FLAG_FIX)
        if name in out:
            raise BadHostData(host, f"{key}.{flag}", f"{flag} and {given[name]} are one flag ({name}: vLLM reads _ as -)",
                              "give it once, with dashes")
        out[name], given[name] = value, flag
    return out


def _check_serve_flags(host: str, s: Settings) -> None:
    """Checks on the dashed names (settings_for normalised them)."""
    key = "qwen27b_serve_flags"
    for flag, value in s.serve_flags.items():
        where = f"{key}.{flag}"
        if flag in OWN_KEY_FLAGS:
            raise BadHostData(host, where, f"{flag} has its own key", OWN_KEY_FLAGS[flag])
        if value is False or value is None or not isinstance(value, (str, int, float)):
            raise BadHostData(host, where, f"{value!r} is not a flag value",
                              "give a number or a string, True for a switch; remove the flag to leave it out")
        if flag in POSITIVE_FLAGS and _positive_int(value) is None:
            raise BadHostData(host, where, f"must be a positive whole number, got {value!r}", "use a value of 1 or more")
        if isinstance(value, str) and not allowlist.SERVE_FLAG_VALUE.ok(value):
            raise BadHostData(host, where, f"{value!r} is not a plain flag value ({allowlist.SERVE_FLAG_VALUE.why})",
                              "use printable ASCII without quotes ' or backslashes")
        if flag == "--gpu-memory-utilization":
            try:
                util = None if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()) else float(value)
            except ValueError:
                util = None
            if util is None or not 0 < util <= 1:
                raise BadHostData(host, where, f"{value!r} is not a fraction of GPU memory",
                                  "use a value above 0 and at most 1, e.g. 0.88")
    pinned_tp = s.serve_flags.get("--tensor-parallel-size")
    if s.tensor_parallel_size and pinned_tp is not None and _positive_int(pinned_tp) != s.tensor_parallel_size:
        raise BadHostData(host, "qwen27b_tensor_parallel_size", f"{s.tensor_parallel_size} disagrees with "
                          f"qwen27b_serve_flags --tensor-parallel-size {pinned_tp}", "set the TP size in one place only")


def _engine_profile(host: str, s: Settings) -> Settings:
    """qwen27b_engine_profile names a catalog entry (plan/catalog.py); a cpu-smoke entry sets the CPU profile."""
    if s.engine_profile is None:
        return s
    from qwen27b.plan.catalog import CatalogError, check_choice
    from qwen27b.plan.stack import load_stack
    try:
        profile = check_choice(load_stack(), s.profile, s.engine_profile)
    except CatalogError as error:
        raise BadHostData(host, "qwen27b_engine_profile", error.problem, error.fix) from None
    return s if profile == s.profile else replace(s, profile=profile)
