"""`qwen27b mirror DEST ...`: the directory an air-gapped lab's mirror serves, laid out from what was
fetched on a connected machine, for the three mirror keys of the host data:

    DEST/<org>--<name>@<revision>/   the checkpoint's files and manifest.json (name -> size, sha256):
                                     qwen27b_model_source: mirror, qwen27b_model_mirror: http://MIRROR:8800
                                     (qwen27b-fetch reads the manifest, resumes, checks every file)
    DEST/wheels/                     every wheel the build needs, flat (a find-links page):
                                     qwen27b_wheel_mirror: http://MIRROR:8800/wheels/
    DEST/python/<release>/<archive>  python-build-standalone archives where uv looks for them:
                                     qwen27b_python_mirror: http://MIRROR:8800/python

    qwen27b mirror DEST --model DIR [--draft DIR] [--wheels DIR] [--python ARCHIVE ...]
                        [--profile sm70] [--engine-profile NAME] [--model-revision REV] [--draft-revision REV]
    python3 -m qwen27b.onhost.mirror DEST --host MIRROR --port 8800   # serve it (Range: hosts resume)

The checkpoint directories are named from the stack file's entries for the profile (the names the
hosts will ask for; `--engine-profile`: a catalog entry's target and draft, as qwen27b_engine_profile), with the revision the hosts pin (pass the one given to qwen27b_stack_overrides).
Files are hard-linked when DEST is on the same filesystem, else copied; a second run adds what is
new and re-hashes only files whose size changed (manifest.json is reused, as for the wheelhouse).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from qwen27b.controller.artifacts import SIDECARS, dir_manifest
from qwen27b.plan.catalog import CatalogError, entry_stack
from qwen27b.plan.stack import StackError, load_stack, resolve_stack, revision_dir_name

PYTHON_RELEASE = re.compile(r"\+(\d{8})-")  # cpython-3.12.12+20251014-x86_64-unknown-linux-gnu-...


def _place(src: Path, dest: Path) -> None:
    """dest as a hard link to src (same filesystem), else a copy; an identical file is left alone."""
    if dest.exists():
        if dest.stat().st_size == src.stat().st_size and (dest.samefile(src) or _same(src, dest)):
            return
        dest.unlink()
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _same(a: Path, b: Path) -> bool:
    with open(a, "rb") as left, open(b, "rb") as right:
        while True:
            x, y = left.read(1 << 20), right.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def add_checkpoint(dest: Path, source: Path, entry: dict) -> Path:
    """DEST/<org>--<name>@<revision>/ from a checkpoint directory (its plain files), with manifest.json."""
    files = [p for p in sorted(Path(source).iterdir())
             if p.is_file() and not p.name.startswith(".") and p.name not in SIDECARS]
    if not any(p.name == "config.json" for p in files):
        raise ValueError(f"{source} holds no config.json: not a checkpoint directory")
    target = dest / revision_dir_name(entry)
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        _place(path, target / path.name)
    dir_manifest(target)
    return target


def add_wheels(dest: Path, source: Path) -> Path:
    wheels = sorted(Path(source).glob("*.whl"))
    if not wheels:
        raise ValueError(f"{source} holds no wheels")
    target = dest / "wheels"
    target.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        _place(wheel, target / wheel.name)
    return target


def add_python(dest: Path, archive: Path) -> Path:
    match = PYTHON_RELEASE.search(archive.name)
    if not match:
        raise ValueError(f"{archive.name}: not a python-build-standalone archive name (cpython-X.Y.Z+RELEASE-...)")
    target = dest / "python" / match.group(1)
    target.mkdir(parents=True, exist_ok=True)
    _place(archive, target / archive.name)
    return target / archive.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen27b mirror", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path, help="the directory the mirror serves")
    parser.add_argument("--profile", default="sm70", help="the stack profile whose model and draft are laid out")
    parser.add_argument("--engine-profile", help="a catalog entry (qwen27b_engine_profile) whose target and draft are laid "
                        "out (default: the profile's default entry)")
    parser.add_argument("--model", type=Path, help="the checkpoint directory (e.g. from `hf download --local-dir`)")
    parser.add_argument("--model-revision", help="the revision the hosts pin (default: the stack file's)")
    parser.add_argument("--draft", type=Path, help="the DFlash2 draft's directory")
    parser.add_argument("--draft-revision", help="the draft revision the hosts pin (default: the stack file's)")
    parser.add_argument("--wheels", type=Path, help="a directory of wheels (e.g. from `pip download`)")
    parser.add_argument("--python", type=Path, nargs="*", default=[], help="python-build-standalone archives")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("model_revision", args.model_revision), ("draft_revision", args.draft_revision)) if v}
    try:
        full = load_stack()
        profile = full["catalog"][args.engine_profile]["profile"] if args.engine_profile in (full.get("catalog") or {}) \
            else args.profile
        chosen = entry_stack(full, profile, args.engine_profile) if profile in full["profiles"] else full
        stack = resolve_stack(chosen, profile, overrides)
    except (StackError, CatalogError, KeyError) as error:
        print(f"qwen27b mirror: {error}", file=sys.stderr)
        return 2
    if not any((args.model, args.draft, args.wheels, args.python)):
        parser.error("nothing to add: give --model, --draft, --wheels or --python")
    dest = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    keys = []
    try:
        if args.model:
            print(f"model  {add_checkpoint(dest, args.model, stack.model)}")
            keys.append("qwen27b_model_source: mirror, qwen27b_model_mirror: http://MIRROR:PORT")
        if args.draft:
            if stack.draft is None:
                raise ValueError(f"profile {args.profile} has no draft model")
            print(f"draft  {add_checkpoint(dest, args.draft, stack.draft)}")
        if args.wheels:
            print(f"wheels {add_wheels(dest, args.wheels)}")
            keys.append("qwen27b_wheel_mirror: http://MIRROR:PORT/wheels/")
        for archive in args.python:
            print(f"python {add_python(dest, archive)}")
        if args.python:
            keys.append("qwen27b_python_mirror: http://MIRROR:PORT/python")
    except (OSError, ValueError) as error:
        print(f"qwen27b mirror: {error}", file=sys.stderr)
        return 1
    print(f"\nserve it: python3 -m qwen27b.onhost.mirror {dest} --host MIRROR --port 8800\nhost data: " + "; ".join(keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
