"""`python3 -m qwen27b.tools.chat_page wheelhouse [--find-links DIR]`: the chat page's wheels (Open
WebUI and every dependency, stack tools.chat_page) for the gateway hosts, fetched once on the
controller like the CPU engine's wheelhouse, so a gateway installs them offline (`--no-index`) and
CI downloads them once.

Two steps, because neither tool does both: uv resolves Open WebUI's ~240 requirements in seconds
(pip's resolver backtracks for minutes) with torch pinned to the CPU build (PyPI's is a CUDA build
of several GB; Open WebUI imports torch at start, it never needs a GPU); pip downloads the pinned
wheels for the target (CPython 3.11, manylinux x86_64), whatever the controller's own Python.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qwen27b.controller.artifacts import uv_binary
from qwen27b.controller.chat_page_render import wheelhouse_dir
from qwen27b.controller.cpu_build import DEFAULT_GLIBC, DEFAULT_TORCH_FIND_LINKS
from qwen27b.plan.stack import load_stack
from qwen27b.tools.cpu_smoke.common import (_existing_find_links, _run, human, manifest_problems, python_tag,
                                            read_manifest, write_manifest)
from qwen27b.tools.cpu_smoke.wheelhouse import manylinux_platforms

# torch's companions that PyPI has only as CUDA builds: nothing Open WebUI imports needs them
LEFT_OUT = ("torchvision", "torchaudio")


def spec() -> dict:
    return load_stack()["tools"]["chat_page"]




def _meta(s: dict) -> dict:
    return {"kind": "wheelhouse", "requirement": f"{s['dist']}=={s['version']}", "also": [s["torch"]],
            "python": s["python"], "implementation": "cp", "platforms": manylinux_platforms(DEFAULT_GLIBC)}


def build(dest: Path, find_links: list[str], force: bool = False) -> dict:
    """Build (or confirm) the wheelhouse at dest; its manifest."""
    s, meta = spec(), _meta(spec())
    if not force and dest.is_dir() and not manifest_problems(dest, expect=meta, hashes=False):
        manifest = read_manifest(dest)
        print(f"[chat_page] wheelhouse up to date: {dest} ({len(manifest['files'])} wheels) - nothing downloaded")
        return manifest
    links = _existing_find_links(find_links)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    started = time.monotonic()
    try:
        pins, overrides = partial / "requirements.txt", partial / "overrides.txt"
        overrides.write_text(s["torch"] + "\n" + "".join(f'{name}; sys_platform == "never"\n' for name in LEFT_OUT))
        link_args = [arg for link in links for arg in ("--find-links", link)]
        _run([str(uv_binary(load_stack()["tools"]["uv"]["version"])), "pip", "compile", "--quiet", "--no-config",
              "--python-version", s["python"], "--python-platform", f"x86_64-manylinux_2_{DEFAULT_GLIBC[1]}",
              "--override", str(overrides), *link_args, "--no-header", "--no-annotate", "-o", str(pins), "-"],
             input=f"{s['dist']}=={s['version']}\n{s['torch']}\n", text=True)
        platforms = [arg for tag in manylinux_platforms(DEFAULT_GLIBC) for arg in ("--platform", tag)]
        _run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary=:all:", "-q",
              "--progress-bar", "off", "-r", str(pins), "-d", str(partial), "--python-version", s["python"],
              "--implementation", "cp", "--abi", python_tag(s["python"]), *platforms, *link_args])
        pins.unlink()
        overrides.unlink()
        if not any(p.name.startswith(f"torch-{s['torch'].split('==')[1]}-") for p in partial.glob("*.whl")):
            raise SystemExit(f"{s['torch']} is not in the wheelhouse: pass --find-links DIR holding it")
        manifest = write_manifest(partial, {**meta, "download_seconds": round(time.monotonic() - started, 1)})
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(partial, dest)
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"the chat page's wheelhouse failed (rc {error.returncode}): a requirement without a wheel "
                         f"for CPython {s['python']} manylinux x86_64 shows as 'No matching distribution'") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    size = sum(f["size"] for f in manifest["files"].values())
    print(f"[chat_page] wheelhouse built: {dest} ({len(manifest['files'])} wheels, {human(size)}) in "
          f"{time.monotonic() - started:.0f} s")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m qwen27b.tools.chat_page", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("wheelhouse", help="fetch the chat page's wheels into the controller cache (once)")
    p.add_argument("--dest", type=Path, default=None, help="default: the cache's (what the deploy pushes)")
    p.add_argument("--find-links", action="append", default=None,
                   help=f"a dir (or URL) holding {spec()['torch']} (default {', '.join(DEFAULT_TORCH_FIND_LINKS)})")
    p.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    build(args.dest or wheelhouse_dir(), args.find_links or list(DEFAULT_TORCH_FIND_LINKS), args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
