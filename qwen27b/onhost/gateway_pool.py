"""The gateway's pool: which qwen27b backends nginx may send requests to, and drains.

Why this glue exists: the gateway is nginx's upstream module (docs/scale-out.md says why nginx),
and open-source nginx has passive health checks only: a request that fails marks a server failed
for `fail_timeout`, and the request is retried on the next one. It cannot read a backend's own
verdict (qwen27b-health-http on :9120 answers 503 for CRITICAL or STALE while vLLM may still
answer), nor take a backend out on purpose before a restart. This process does those two things
and nothing else:

- every `interval_s` it asks each backend's health endpoint (:9120/health, 200 for OK/WARNING)
  and vLLM's own /health (:8000, open without the key); a backend leaves the pool after `fall`
  failed rounds in a row and returns after `rise` good ones;
- a backend named in the drain directory stays out whatever its health (`drain NAME`);
- when the pool changed it rewrites nginx's upstream file (`server ADDR:PORT;` or `... down;`)
  and sends nginx's master SIGHUP: nginx's graceful reload, new workers use the new pool while
  the old ones finish the requests they hold. `drain NAME --wait S` waits for those old workers
  to exit: then no request is left on the drained backend.

If no backend is healthy the pool fails open (every backend not drained is listed): a broken
health endpoint must not take the whole lab offline, and nginx's passive checks still skip a
backend that refuses connections.

Runs on the gateway host with the system python3 (3.8 on Ubuntu 20.04): standard library only,
no import of the package's other modules.

    python3 -m qwen27b_onhost.gateway_pool --config /etc/qwen27b-gateway/backends.json watch
    ... render | status | drain NAME [--wait 600] | undrain NAME | usage [--since 1d]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

DEFAULT_CONFIG = "/etc/qwen27b-gateway/backends.json"
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def load_config(path: str) -> dict:
    """The rendered config: backends (name, address, port, health_port) and the files used."""
    with open(path) as fh:
        config = json.load(fh)
    state_dir = config["state_dir"]
    config.setdefault("upstream_file", os.path.join(state_dir, "upstream.conf"))
    config.setdefault("pool_file", os.path.join(state_dir, "pool.json"))
    config.setdefault("drain_dir", os.path.join(state_dir, "drained"))
    config.setdefault("lock_file", os.path.join(state_dir, "pool.lock"))
    config.setdefault("pid_file", os.path.join(state_dir, "nginx.pid"))
    for key, default in (("interval_s", 1.0), ("timeout_s", 1.0), ("fall", 2), ("rise", 2),
                         ("max_fails", 1), ("fail_timeout_s", 5)):
        config.setdefault(key, default)
    return config


# ------------------------------------------------------------------ pure: the pool from what was seen

def next_counts(previous: dict, probes: dict) -> dict:
    """Per backend, how many rounds in a row it was healthy (> 0) or not (< 0), after one round of
    probes {name: bool}. A backend never seen starts from its first probe."""
    counts = {}
    for name, healthy in probes.items():
        before = previous.get(name, 0)
        if healthy:
            counts[name] = before + 1 if before > 0 else 1
        else:
            counts[name] = before - 1 if before < 0 else -1
    return counts


def members(backends: list, counts: dict, was_in: set, drained: set, fall: int, rise: int) -> tuple:
    """(names in the pool, whether it failed open). In the pool: not drained, and healthy for `rise`
    rounds, or already in and not yet unhealthy for `fall` rounds. A backend with no round yet is in
    (nginx's passive checks cover it until the first round). None healthy: every one not drained."""
    chosen = []
    for backend in backends:
        name = backend["name"]
        if name in drained:
            continue
        count = counts.get(name)
        if count is None or (name in was_in and count > -fall) or count >= rise:
            chosen.append(name)
    if chosen:
        return chosen, False
    return [b["name"] for b in backends if b["name"] not in drained], True


def upstream_text(config: dict, pool: list) -> str:
    """nginx's upstream servers: every backend, those out of the pool marked `down` (the order and
    the set of lines stay the same, so nginx keeps each server's state across reloads)."""
    lines = ["# Written by qwen27b-gateway-pool: the backends in the pool; `down` = out (unhealthy or drained)."]
    for backend in config["backends"]:
        down = "" if backend["name"] in pool else " down"
        host = f"[{backend['address']}]" if ":" in backend["address"] else backend["address"]  # IPv6
        lines.append(f"server {host}:{backend['port']} max_fails={config['max_fails']} "
                     f"fail_timeout={config['fail_timeout_s']}s{down};")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ host I/O

def probe(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http to the lab)
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def healthy(backend: dict, timeout: float) -> bool:
    """The backend's verdict (qwen27b-health-http: 200 for OK/WARNING) and vLLM answering."""
    host = backend["address"]
    host = f"[{host}]" if ":" in host else host
    # a copy of qwen27b_instances: its own verdict at /health/NAME of its host's endpoint
    return (probe(f"http://{host}:{backend['health_port']}{backend.get('health_path', '/health')}", timeout)
            and probe(f"http://{host}:{backend['port']}/health", timeout))


def probe_all(config: dict, pool: ThreadPoolExecutor) -> dict:
    names = [b["name"] for b in config["backends"]]
    results = pool.map(lambda b: healthy(b, config["timeout_s"]), config["backends"])
    return dict(zip(names, results))


def drained_names(config: dict) -> set:
    try:
        return {name for name in os.listdir(config["drain_dir"]) if not name.startswith(".")}
    except FileNotFoundError:
        return set()


def read_json(path: str, default):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    part = f"{path}.part"
    with open(part, "w") as fh:
        fh.write(text)
    os.chmod(part, mode)
    os.replace(part, path)


def nginx_master(config: dict):
    """The running nginx master's PID (from its pid file, checked against /proc), or None."""
    try:
        with open(config["pid_file"]) as fh:
            pid = int(fh.read().strip())
        with open(f"/proc/{pid}/comm") as fh:
            return pid if fh.read().strip() == "nginx" else None
    except (OSError, ValueError):
        return None


def workers_of(master: int) -> set:
    """The master's children (nginx's workers, the old ones included while they finish)."""
    children = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == master:
                children.add(int(entry))
    return children


def apply(config: dict, counts: dict | None = None, drain: str | None = None, undrain: str | None = None) -> dict:
    """Under the pool lock: mark or unmark a drain, then the pool from the counts (None: the last
    ones recorded) and the drains; the upstream file rewritten and nginx reloaded when it changed,
    the master's workers of that moment recorded (the ones a drain waits for). Returns the pool
    record (also written to pool_file)."""
    os.makedirs(os.path.dirname(config["lock_file"]), exist_ok=True)
    with open(config["lock_file"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = read_json(config["pool_file"], {})
        counts = before.get("counts", {}) if counts is None else counts
        if drain:
            os.makedirs(config["drain_dir"], mode=0o700, exist_ok=True)
            open(os.path.join(config["drain_dir"], drain), "a").close()
        if undrain:
            try:
                os.unlink(os.path.join(config["drain_dir"], undrain))
            except FileNotFoundError:
                pass
        drained = drained_names(config)
        pool, failed_open = members(config["backends"], counts, set(before.get("pool", [])), drained,
                                    config["fall"], config["rise"])
        text = upstream_text(config, pool)
        try:
            with open(config["upstream_file"]) as fh:
                changed = fh.read() != text
        except OSError:
            changed = True
        old_workers = []
        if changed:
            write_atomic(config["upstream_file"], text)
            master = nginx_master(config)
            if master is not None:
                old_workers = sorted(workers_of(master))
                os.kill(master, signal.SIGHUP)
        record = {"pool": pool, "failed_open": failed_open, "drained": sorted(drained), "counts": counts,
                  "changed_at": time.time() if changed else before.get("changed_at"),
                  "old_workers": old_workers if changed else before.get("old_workers", [])}
        write_atomic(config["pool_file"], json.dumps(record, sort_keys=True) + "\n")
    if changed:
        out = sorted(set(b["name"] for b in config["backends"]) - set(pool))
        say(f"pool: {', '.join(pool) or 'none'}" + (f"; out: {', '.join(out)}" if out else "")
            + (" (none healthy: failing open)" if failed_open else ""))
    return record


def say(text: str) -> None:
    print(f"qwen27b-gateway-pool: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ commands

def watch(config: dict, rounds: int | None = None) -> None:
    """Probe, apply, sleep; forever (or `rounds` times)."""
    counts = read_json(config["pool_file"], {}).get("counts", {})
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, len(config["backends"]))) as pool:
        while rounds is None or done < rounds:
            started = time.monotonic()
            counts = next_counts(counts, probe_all(config, pool))
            apply(config, counts)
            done += 1
            time.sleep(max(0.0, config["interval_s"] - (time.monotonic() - started)))


def render(config: dict) -> None:
    """One round (nginx's ExecStartPre): the upstream file exists before nginx reads it."""
    with ThreadPoolExecutor(max_workers=max(1, len(config["backends"]))) as pool:
        probes = probe_all(config, pool)
    apply(config, {name: (config["rise"] if ok else -config["fall"]) for name, ok in probes.items()})


def _backend(config: dict, name: str) -> str:
    known = [b["name"] for b in config["backends"]]
    if name not in known or not set(name) <= NAME_CHARS:
        raise SystemExit(f"qwen27b-gateway-pool: no backend {name!r} here (backends: {', '.join(known)})")
    return name


def drain(config: dict, name: str, wait_s: float) -> int:
    """Take NAME out of the pool now and wait (up to wait_s) until nginx's workers that could still
    hold a request on it have exited. Exit 0 when drained, 1 when old workers were still busy."""
    name = _backend(config, name)
    started = time.monotonic()
    record = apply(config, drain=name)
    waiting = [pid for pid in record.get("old_workers", []) if os.path.exists(f"/proc/{pid}")]
    while waiting and time.monotonic() - started < wait_s:
        time.sleep(0.2)
        waiting = [pid for pid in waiting if os.path.exists(f"/proc/{pid}")]
    result = {"backend": name, "drained": not waiting, "waited_s": round(time.monotonic() - started, 2),
              "old_workers_busy": len(waiting), "pool": record["pool"]}
    print(json.dumps(result, sort_keys=True))
    return 0 if not waiting else 1


def undrain(config: dict, name: str) -> int:
    """NAME may return: it rejoins the pool once healthy (at once if its last rounds were good)."""
    record = apply(config, undrain=_backend(config, name))
    print(json.dumps({"backend": name, "drained": False, "pool": record["pool"]}, sort_keys=True))
    return 0


def status(config: dict) -> int:
    record = read_json(config["pool_file"], {})
    record["drained"] = sorted(drained_names(config))
    record["backends"] = [b["name"] for b in config["backends"]]
    print(json.dumps(record, sort_keys=True))
    return 0


WINDOW = re.compile(r"[1-9][0-9]{0,5}(s|min|h|d)")
USAGE_FIELDS = ("requests", "errors", "limited", "prompt_tokens", "completion_tokens")


def usage_of(lines) -> dict:
    """Each key name's requests, errors (>= 400), 429s, tokens and seconds, from request-log lines
    (JSON, nginx's qwen27b log format); lines of no key (refused, /health) are not counted."""
    keys: dict = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not record.get("key"):
            continue
        row = keys.setdefault(record["key"], {**{f: 0 for f in USAGE_FIELDS}, "seconds": 0.0})
        status = int(record.get("status") or 0)
        row["requests"] += 1
        row["errors"] += status >= 400
        row["limited"] += status == 429
        for field in ("prompt_tokens", "completion_tokens"):
            row[field] += int(record.get(field) or 0)
        row["seconds"] = round(row["seconds"] + float(record.get("request_time") or 0), 3)
    return keys


def usage(window: str) -> int:
    """Usage per key over the last `window` (e.g. 1h, 30min, 7d), read from the request log in the
    journal: kept as long as journald keeps it, where nginx's counters (:9121) restart with nginx."""
    if not WINDOW.fullmatch(window):
        raise SystemExit(f"qwen27b-gateway-pool: --since {window!r}: give N followed by s, min, h or d (e.g. 1h)")
    out = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-t", "qwen27b_gateway", f"--since=-{window}"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"qwen27b-gateway-pool: journalctl failed: {out.stderr.strip()[-300:]}")
    print(json.dumps({"since": window, "keys": usage_of(out.stdout.splitlines())}, sort_keys=True))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="qwen27b-gateway-pool", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("watch", help="probe every backend and keep nginx's pool (the service)")
    sub.add_parser("render", help="one round: write the upstream file (before nginx starts)")
    sub.add_parser("status", help="the pool, drains and counts as JSON")
    p_drain = sub.add_parser("drain", help="take a backend out and wait for its requests to end")
    p_drain.add_argument("name")
    p_drain.add_argument("--wait", type=float, default=600.0, help="seconds to wait for busy workers")
    p_undrain = sub.add_parser("undrain", help="let a drained backend return once healthy")
    p_undrain.add_argument("name")
    p_usage = sub.add_parser("usage", help="each key's requests and tokens over a window, from the request log")
    p_usage.add_argument("--since", default="1d", help="N followed by s, min, h or d (default 1d)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    if args.command == "watch":
        watch(config)
        return 0
    if args.command == "render":
        render(config)
        return 0
    if args.command == "drain":
        return drain(config, args.name, args.wait)
    if args.command == "undrain":
        return undrain(config, args.name)
    if args.command == "usage":
        return usage(args.since)
    return status(config)


if __name__ == "__main__":
    sys.exit(main())
