"""The controller-side cache: each artifact is fetched once here and fanned out to every host.

`$QWEN27B_CACHE` (default ~/.cache/qwen27b) holds the uv binary, wheelhouses and model files.
Every directory that is pushed to hosts carries a manifest (file -> sha256) so hosts can be
checked with one command and only missing or different files are sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path

from qwen27b.plan.distname import normalize

MANIFEST = "manifest.json"
SIDECARS = {MANIFEST, "SHA256SUMS"}  # describe a dir's files; never pushed as artifacts


class ArtifactError(RuntimeError):
    """An artifact could not be prepared on the controller; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("QWEN27B_CACHE") or Path.home() / ".cache" / "qwen27b")


def sha256_file(path: Path, chunk: int = 4 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def dir_manifest(directory: Path) -> dict[str, str]:
    """{file name: sha256} for the regular files in directory, reusing manifest.json when its
    recorded sizes still match (hashing GBs of weights on every run would be wasteful)."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name not in SIDECARS and not p.name.startswith("."))
    recorded = directory / MANIFEST
    data: dict = {}
    if recorded.exists():
        try:
            data = json.loads(recorded.read_text())
            entries = data.get("files", {})
            if set(entries) == {p.name for p in files} and all(
                    isinstance(v, dict) and v.get("size") == p.stat().st_size for p, v in ((p, entries[p.name]) for p in files)):
                return {name: v["sha256"] for name, v in entries.items()}
        except (ValueError, AttributeError, KeyError, TypeError):
            data = {}
    manifest = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
    data = data if isinstance(data, dict) else {}
    partial = directory / f".{MANIFEST}.tmp"
    partial.write_text(json.dumps({**data, "files": manifest}, indent=2, sort_keys=True) + "\n")
    partial.replace(recorded)
    return {name: v["sha256"] for name, v in manifest.items()}


def source_manifest(directory: Path) -> dict[str, str]:
    """{file name: sha256} of the Python files of a source package, hashed every time: a size-keyed
    manifest.json (dir_manifest) would miss a same-size edit, and a source tree gets no sidecar."""
    return {p.name: sha256_file(p) for p in sorted(Path(directory).glob("*.py")) if p.is_file()}


def uv_path(version: str) -> Path:
    return cache_root() / "tools" / f"uv-{version}" / "uv"


def python_builds_dir() -> Path:
    """Where the controller keeps uv's Python builds, laid out as uv's mirror wants them
    (<release>/<archive>, as `qwen27b mirror --python` does): dropped there by the user."""
    return cache_root() / "python"


def python_builds() -> tuple[str, ...]:
    """The cached builds as `<release>/<archive>` (plan/sources.cached_archives picks the version's)."""
    root = python_builds_dir()
    return tuple(sorted(f"{p.parent.name}/{p.name}" for p in root.glob("*/*.tar.gz"))) if root.is_dir() else ()


def uv_binary(version: str) -> Path:
    """The uv binary for x86_64 Linux, from PyPI's `uv` wheel (PyPI is reachable where GitHub may
    not be), cached under tools/uv-<version>/uv."""
    target = uv_path(version)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp,
             "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", f"uv=={version}"],
            capture_output=True, text=True)
        wheels = list(Path(tmp).glob("uv-*.whl"))
        if result.returncode != 0 or not wheels:
            raise ArtifactError(f"could not download uv {version} from PyPI: {result.stderr.strip()[-300:]}. "
                                f"Put the uv binary at {target} by hand (air-gapped controller)")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/scripts/uv")), None)
            if member is None:
                raise ArtifactError(f"{wheels[0].name} holds no uv binary")
            partial = target.with_suffix(".part")
            partial.write_bytes(wheel.read(member))
            partial.chmod(0o755)
            partial.replace(target)
    return target


def wheel_pins(manifest: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{normalized name: ("name==version", sha256)} for each wheel of a wheelhouse manifest, from the
    wheel file names (`name-version[-build]-python-abi-platform.whl`)."""
    pins = {}
    for filename, digest in manifest.items():
        if filename.endswith(".whl") and filename.count("-") >= 4:
            name, version = filename.split("-")[:2]
            pins[normalize(name)] = (f"{name}=={version}", digest)
    return pins


def constraints_text(manifest: dict[str, str]) -> str:
    """Every wheel of the wheelhouse pinned with its sha256: what `uv pip install --require-hashes
    --constraints` may install, and nothing else."""
    return "".join(f"{pin} --hash=sha256:{digest}\n" for pin, digest in sorted(wheel_pins(manifest).values()))


@lru_cache(maxsize=8)
def _unpacked(directory: str, stamp: tuple) -> int:
    import zipfile

    total = 0
    for wheel in sorted(Path(directory).glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:  # the central directory only: no file is inflated
            total += sum(info.file_size for info in archive.infolist())
    return total


def unpacked_bytes(directory: Path) -> int:
    """What the wheels of a wheelhouse hold unpacked (the install's progress total), read once per
    run and contents."""
    wheels = sorted(Path(directory).glob("*.whl"))
    return _unpacked(str(directory), tuple((w.name, w.stat().st_size) for w in wheels))
