"""Parsing (pure) of what doctor reads besides the journal: the unit's ExecStart flags, the model
directory listing, the checkpoint's declared weights format, /metrics, version specifiers."""

from __future__ import annotations

import json
import re


def exec_argv(exec_start: str) -> list[str]:
    """`systemctl show -p ExecStart`'s '{ path=... ; argv[]=A B C ; ... }' -> argv (the last entry).

    systemd 252 prints argv joined by spaces, unquoted: fine for vllm serve flags, whose values
    (paths, numbers, compact JSON) hold no spaces; a token a newer systemd wraps in single
    quotes is unwrapped."""
    entries = re.findall(r"argv\[\]=(.*?) ; (?:ignore_errors|flags)=", exec_start)
    if not entries:
        return []
    return [t[1:-1] if len(t) > 1 and t[0] == t[-1] == "'" else t for t in entries[-1].split()]


def running_flags(exec_start: str) -> dict[str, str | None]:
    """The `--flag value` / `--switch` pairs of the ExecStart argv (after the program and module)."""
    argv = exec_argv(exec_start)
    flags: dict[str, str | None] = {}
    i = next((n for n, a in enumerate(argv) if a.startswith("--")), len(argv))
    while i < len(argv):
        name = argv[i]
        if not name.startswith("--"):
            i += 1
            continue
        if "=" in name:
            name, value = name.split("=", 1)
            flags[name] = value
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name] = argv[i + 1]
            i += 2
        else:
            flags[name] = None
            i += 1
    return flags


def env_file(text: str | None) -> dict[str, str]:
    """An EnvironmentFile= as systemd reads the lines the deploy writes (controller.unitwords.env_value):
    NAME=value, a double-quoted value with its backslash escapes undone; comments skipped."""
    env = {}
    for line in (text or "").splitlines():
        name, eq, value = line.strip().partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        env[name] = value
    return env


def expand_env(exec_start: str, env: dict[str, str]) -> str:
    """ExecStart as `systemctl show` prints it (a copy's `$QWEN27B_SERVE_ARGS` unexpanded) with the
    unit's environment put in, as systemd does at exec: `$NAME` and `${NAME}` (an unset one is empty)."""
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: env.get(m[1] or m[2], ""), exec_start)


def parse_model(text: str | None) -> dict:
    out = {"link": None, "resolved": None, "dir": None, "config": None, "files": {}, "revisions": []}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("link", "resolved"):
            out[key] = value.strip() or None
        elif key in ("dir", "config"):
            out[key] = value.strip() == "yes"
        elif key == "file":
            size, _, name = value.partition(" ")
            if size.isdigit():
                out["files"][name] = int(size)
        elif key == "revision":
            out["revisions"].append(value.strip())
    return out


def weights_format(config: dict | None, hf_quant: dict | None) -> str | None:
    """nvfp4 / fp8 / int4 / mxfp4 / bf16 / fp16 / fp32, from what the checkpoint declares."""
    if config is None:
        return None
    quant = config.get("quantization_config") or (hf_quant or {}).get("quantization") or {}
    if quant:
        method = str(quant.get("quant_method") or "").lower()
        algo = str(quant.get("quant_algo") or quant.get("format") or "").lower()
        text = json.dumps(quant).lower()
        if "nvfp4" in algo or "nvfp4" in text or "modelopt_fp4" in method:
            return "nvfp4"
        if "mxfp4" in algo or method == "mxfp4":
            return "mxfp4"
        if "fp8" in algo or method in ("fp8", "fbgemm_fp8") or "float-quantized" in text:
            return "fp8"
        if method in ("awq", "gptq", "bitsandbytes", "gguf") or "int4" in algo or '"num_bits": 4' in text:
            return "int4"
        return method or algo or "quantized"
    dtype = str((config.get("text_config") or {}).get("torch_dtype") or config.get("torch_dtype") or config.get("dtype") or "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype.replace("torch.", ""), dtype or None)


DENSE = {"bf16", "fp16", "fp32"}


METRIC_FAMILIES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions", "vllm:spec_decode_",
                   "vllm:request_prompt_tokens", "vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_metrics(text: str | None) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if not match:
            continue
        try:
            value = float(match[3])
        except ValueError:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[2] or ""))
        out.setdefault(match[1], []).append((labels, value))
    return out


def metric_sum(metrics: dict, name: str) -> float | None:
    rows = metrics.get(name)
    return sum(v for _, v in rows) if rows else None


def version_in(version: str | None, spec: str | None) -> bool:
    if version is None:
        return False
    if not spec or spec in ("*", "any"):
        return True
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version
    try:
        # a specifier ('>=2.8,<2.11') or a whole requirement ('torch==2.13.0', as the stack's torch entry)
        specifier = Requirement(spec).specifier if spec[:1].isalpha() else SpecifierSet(spec)
        return Version(version) in specifier
    except (InvalidRequirement, InvalidSpecifier, InvalidVersion):
        return False
