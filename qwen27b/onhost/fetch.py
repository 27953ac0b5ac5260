#!/usr/bin/env python3
"""qwen27b-fetch: download files listed in a manifest from a mirror, resumable and verified.

Shipped with the on-host package and run from the release venv as `python -m qwen27b_onhost.fetch`
(standard library only). Each file goes to NAME.part, resumes from where an interrupted transfer stopped (HTTP
Range), is checked against its sha256, then renamed into place. Files already present with the
right hash are skipped, so a re-run after Ctrl-C, a dropped SSH session or a reboot converges.
A full disk stops the transfer with the space needed and keeps the part file for the re-run; a
lock on DIR makes a second fetch wait its turn, and a fetch whose caller is gone (Ctrl-C of the
controller, a dropped SSH session: the reader of its stderr closed) stops at once, not at its next
progress line (an orphan writing on, unobserved, beside a re-run was seen).

    qwen27b-fetch --base URL --dest DIR --manifest FILE.json [--token-file FILE]

FILE.json: {"files": {"name": {"size": N, "sha256": "..."}}} (the manifest qwen27b writes).
Exit codes: 0 all verified; 1 a file failed its checksum or the mirror failed; 2 usage.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import fcntl
import hashlib
import json
import os
import select
import shutil
import stat
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1 << 20


def _hash_rest(handle, digest, buffer: memoryview) -> None:
    """Feed digest from handle's position to its end (one buffer, no allocation per block)."""
    while count := handle.readinto(buffer):
        digest.update(buffer[:count])


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        _hash_rest(handle, digest, memoryview(bytearray(CHUNK)))
    return digest.hexdigest()


def _progress(name: str, done: int, total: int, started: float, resumed_from: int) -> None:
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = (done - resumed_from) / elapsed
    eta = (total - done) / rate if rate > 0 else 0
    print(f"  {name}: {done / 2**20:,.1f}/{total / 2**20:,.1f} MiB  {rate / 2**20:,.1f} MiB/s  ETA {eta:,.0f} s",
          file=sys.stderr, flush=True)


def _receive(request, part: str, have: int, size: int, name: str):
    """Append the response to part and return the sha256 of the whole part file, hashed as the
    bytes arrive: a resumed part's prefix is read once first, and nothing is read after the
    transfer (reading every file back made a LAN peer copy CPU-bound; rsync hashes as it receives)."""
    started, last = time.monotonic(), 0.0
    buffers = [memoryview(bytearray(CHUNK)) for _ in range(2)]
    digest = hashlib.sha256()
    with urllib.request.urlopen(request, timeout=60) as response, \
            concurrent.futures.ThreadPoolExecutor(1) as hasher:
        if have and response.status != 206:
            have = 0  # the mirror ignored Range: start over
        with open(part, "r+b" if have else "wb") as out:
            if have:
                _hash_rest(out, digest, buffers[0])  # the kept prefix; the handle ends at its end
                out.seek(have)
            done, hashing = have, None
            # Two buffers: while one block is hashed (hashlib drops the GIL) the next is received
            # and written; a block is hashed before its buffer is filled again, in order.
            while count := response.readinto(buffers[0]):
                out.write(buffers[0][:count])
                if hashing:
                    hashing.result()
                hashing = hasher.submit(digest.update, buffers[0][:count])
                buffers.reverse()
                done += count
                if time.monotonic() - last > 2:
                    _progress(name, done, size, started, have)
                    last = time.monotonic()
            if hashing:
                hashing.result()
        if done < size:  # the server went away mid-file (a seed stopped, a mirror restarted)
            raise OSError(f"the connection ended after {done:,} of {size:,} bytes; "
                          "the part file is kept: a re-run resumes it")
    return digest


def fetch_one(base: str, name: str, size: int, sha256: str, dest: str, token: str | None = None) -> None:
    final = os.path.join(dest, name)
    if os.path.exists(final) and os.path.getsize(final) == size and sha256_of(final) == sha256:
        return
    part = final + ".part"
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if have > size:
        os.remove(part)
        have = 0
    url = base.rstrip("/") + "/" + urllib.parse.quote(name)
    headers = {"Range": f"bytes={have}-"} if have else {}
    if token:  # a fan-out seed's per-run token (read from --token-file, never in argv)
        headers["Authorization"] = f"Bearer {token}"
    if have < size or not os.path.exists(part):  # an empty file is fetched too: its part is created
        got = _receive(urllib.request.Request(url, headers=headers), part, have, size, name).hexdigest()
    else:  # complete but not yet verified (stopped between the last byte and the rename)
        got = sha256_of(part)
    if got != sha256:
        os.remove(part)  # a corrupt part must not be resumed
        raise ValueError(f"{name}: sha256 {got} does not match the manifest's {sha256}; the part file was removed")
    os.chmod(part, 0o644)  # whatever the umask: the service user (and a fan-out seed) read it via the group
    os.replace(part, final)


def _still_needed(dest: str, files: dict) -> int:
    """Bytes still to download: files not yet in place, less what their part files already hold."""
    needed = 0
    for name, meta in files.items():
        final = os.path.join(dest, name)
        if os.path.exists(final) and os.path.getsize(final) == int(meta["size"]):
            continue
        part = final + ".part"
        have = os.path.getsize(part) if os.path.exists(part) else 0
        needed += max(0, int(meta["size"]) - have)
    return needed


def _lock(dest: str):
    """Hold DIR/.qwen27b-fetch.lock; if another fetch holds it, say so and wait for it."""
    handle = open(os.path.join(dest, ".qwen27b-fetch.lock"), "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        print(f"qwen27b-fetch: another fetch ({handle.read().strip() or 'unknown pid'}) is writing {dest}: "
              "waiting for it", file=sys.stderr, flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def stop_when_the_caller_goes(fd: int = 2) -> threading.Thread | None:
    """When fd (stderr) is a pipe or socket, exit as soon as its reader is gone (poll reports POLLERR
    or POLLHUP). Over SSH that reader is sshd's session: it closes when the controller is interrupted
    or the link drops. What is on disk is always a prefix of each file (appended in order), so the
    part file is kept for the re-run; the lock goes with the process."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None  # a terminal, a file, /dev/null: nobody to lose

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: only POLLERR / POLLHUP / POLLNVAL wake it
        while True:
            for _, events in poller.poll():
                if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                    os._exit(1)  # noqa: SLF001 - nothing to say it to; stop writing now

    watcher = threading.Thread(target=watch, name="caller-gone", daemon=True)
    watcher.start()
    return watcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="mirror URL of the directory holding the files; "
                        "$VARS in it are expanded here (a URL with a password stays out of argv and `ps`)")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--token-file", help="a 0600 file holding the bearer token a fan-out seed asks for")
    args = parser.parse_args(argv)
    args.base = os.path.expandvars(args.base)
    token = None
    if args.token_file:
        with open(args.token_file, encoding="ascii") as handle:
            token = handle.read().strip()
    with open(args.manifest, encoding="utf-8") as handle:
        files = json.load(handle)["files"]
    os.makedirs(args.dest, exist_ok=True)
    os.chmod(args.dest, 0o755)  # the models dir above it (root:service user 0750) is the gate
    stop_when_the_caller_goes()
    lock = _lock(args.dest)  # noqa: F841 (held until exit)
    free = shutil.disk_usage(args.dest).free
    needed = _still_needed(args.dest, files)
    if needed > free:
        print(f"qwen27b-fetch: {needed / 2**30:.2f} GiB still to download into {args.dest}, "
              f"{free / 2**30:.2f} GiB free: free space there, then re-run (nothing more was downloaded; "
              "finished and partial files are kept)", file=sys.stderr)
        return 1
    failed = []
    for number, (name, meta) in enumerate(sorted(files.items()), 1):
        if "/" in name or name.startswith("."):
            failed.append(f"{name}: refused (not a plain file name)")
            continue
        try:
            print(f"[{number}/{len(files)}] {name}", file=sys.stderr, flush=True)
            fetch_one(args.base, name, int(meta["size"]), meta["sha256"], args.dest, token)
        except OSError as error:
            if error.errno == errno.EPIPE:
                return 1  # whoever ran us (pyinfra over SSH) is gone: stop, the part file is kept
            if error.errno != errno.ENOSPC:
                failed.append(f"{name}: {error}")
                continue
            part = os.path.join(args.dest, name + ".part")
            kept = os.path.getsize(part) if os.path.exists(part) else 0
            print(f"qwen27b-fetch: FAILED disk full in {args.dest} while writing {name} "
                  f"({kept / 2**20:,.0f} of {int(meta['size']) / 2**20:,.0f} MiB kept in {name}.part): "
                  f"free {_still_needed(args.dest, files) / 2**30:.2f} GiB there, then re-run; "
                  "the transfer resumes where it stopped", file=sys.stderr)
            return 1
        except ValueError as error:
            failed.append(f"{name}: {error}")
    for line in failed:
        print(f"qwen27b-fetch: FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
