"""qwen27b-pincheck: a checkpoint dir's files against the sha256 the stack file pins, before the model link switches.

Run by the weights role from the release venv (`python -m qwen27b_onhost.pincheck`, standard library
only) after the files arrived by any route and before the link switches (qwen27b/plan/filepins.py):

    pincheck --dir DIR --pins PINS.json --stat-cache NAME --listing NAME --fix TEXT

PINS.json: {"name": {"size": N, "sha256": "..."}}. Each pinned file must be in DIR, a regular file of
that size and sha256; files beyond the pins are not judged. Exit 0: all match (one line says how many
were hashed now); 1: one stderr line per file (expected vs got), then one line ending with TEXT (what
to do: the run summary shows a failed operation's last line); 2: usage.

Not re-hashing gigabytes on every run: a file is hashed only when its identity changed since it was
last hashed. Its identity is (size, mtime, ctime, inode), as recorded in the stat cache NAME in DIR
(the one the FileHashes fact keeps: qwen27b/controller/host_facts.py), or, for a file that cache does
not know, a sha256sum-format listing NAME in DIR (the manifest written right after a hub or ModelScope
download) when that listing is newer than the file's mtime and ctime: the file has not changed since it
was hashed for the listing (any write changes ctime, which no user can set). What it hashes goes into
the stat cache (only for files unchanged for 2 s: a write in the same clock tick keeps the stat), so a
second run with good files stats each file and hashes none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import sys
import time


def _load_cache(path: str) -> dict:
    try:
        with open(path) as handle:
            cache = json.load(handle)
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def _load_listing(path: str) -> tuple[dict, int]:
    """{name: sha256} of a sha256sum-format file and its mtime (-1: none)."""
    listed = {}
    try:
        at = os.stat(path).st_mtime_ns
        with open(path) as handle:
            for line in handle:
                digest, _, name = line.rstrip("\n").partition("  ")
                listed[name[2:] if name.startswith("./") else name] = digest
    except (OSError, ValueError):
        return {}, -1
    return listed, at


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check(directory: str, pins: dict, cache_name: str, listing_name: str) -> tuple[list[str], int]:
    """(one line per pinned file that is missing or differs, how many files were hashed)."""
    cache_file = os.path.join(directory, cache_name)
    cache = _load_cache(cache_file)
    listed, listed_at = _load_listing(os.path.join(directory, listing_name))
    bad, hashed, changed = [], 0, False
    for name, pin in sorted(pins.items()):
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            bad.append(f"{name}: missing (expected {pin['size']} bytes, sha256 {pin['sha256']})")
            continue
        if not stat.S_ISREG(st.st_mode):
            bad.append(f"{name}: not a regular file (expected {pin['size']} bytes, sha256 {pin['sha256']})")
            continue
        if st.st_size != pin["size"]:
            bad.append(f"{name}: {st.st_size} bytes, expected {pin['size']} (sha256 {pin['sha256']})")
            continue
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        old = cache.get(name)
        if isinstance(old, list) and len(old) == 5 and old[:4] == key and isinstance(old[4], str):
            got = old[4]
        elif name in listed and listed_at >= max(st.st_mtime_ns, st.st_ctime_ns):
            got = listed[name]
        else:
            got, hashed = _sha256(path), hashed + 1
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 2e9 and old != key + [got]:
            cache[name], changed = key + [got], True
        if got != pin["sha256"]:
            bad.append(f"{name}: sha256 {got}, expected {pin['sha256']}")
    if changed:  # memoization, best effort (as FileHashes writes it)
        try:
            part = f"{cache_file}.{os.getpid()}.tmp"
            with open(part, "w") as handle:
                json.dump(cache, handle)
            os.replace(part, cache_file)
        except OSError:
            pass
    return bad, hashed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen27b-pincheck")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--pins", required=True)
    parser.add_argument("--stat-cache", required=True)
    parser.add_argument("--listing", required=True)
    parser.add_argument("--fix", required=True)
    args = parser.parse_args(argv)
    try:
        with open(args.pins) as handle:
            pins = json.load(handle)
    except (OSError, ValueError) as error:
        print(f"qwen27b: cannot read the pins {args.pins}: {error}", file=sys.stderr)
        return 2
    bad, hashed = check(args.dir, pins, args.stat_cache, args.listing)
    if bad:
        for line in bad:
            print(f"qwen27b: {line}", file=sys.stderr)
        print(f"qwen27b: {len(bad)} of {len(pins)} pinned files in {args.dir} differ from the stack file (above): "
              f"{args.fix}", file=sys.stderr)
        return 1
    print(f"qwen27b: {len(pins)} pinned files verified in {args.dir} ({hashed} hashed now, the rest unchanged since)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
