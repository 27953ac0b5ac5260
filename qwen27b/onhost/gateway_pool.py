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
- fair share (config "fair_share"): each backend's health endpoint says its slots (the
  --max-num-seqs it runs with); the watcher writes `limit_conn qwen27b_fair N;` with N the
  in-pool backends' slots less one into nginx's fair file, so no key holds every slot (nginx's
  limit_conn does the counting; only the number changes with the pool);
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

from .contract import GATEWAY_UNIT

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
    config.setdefault("fair_file", os.path.join(state_dir, "fair.conf"))
    config.setdefault("fair_share", False)
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


def fair_share(config: dict, pool: list, slots: dict):
    """Each key's most requests at once: the in-pool backends' slots less one, so another key always
    finds a slot (at least 1: a single slot is shared in turn). None while fair share is off or a
    backend in the pool has not said its slots (an older qwen27b-health): nothing is refused then."""
    known = [slots.get(name) for name in pool]
    if not config["fair_share"] or not known or None in known:
        return None
    return max(1, sum(known) - 1)


def fair_text(config: dict, pool: list, slots: dict) -> str:
    """nginx's fair-share lines, included in the keyed location (limit_conn counts per key name)."""
    head = "# Written by qwen27b-gateway-pool: each key's fair share of the pool's slots (limit_conn)."
    share = fair_share(config, pool, slots)
    if share is None:
        why = "off" if not config["fair_share"] else "the slots of " + ", ".join(
            n for n in pool if slots.get(n) is None) + " are not known yet"
        return f"{head}\n# no limit: {why}\n"
    return f"{head}\nset $qwen27b_fair_share {share};\nlimit_conn qwen27b_fair {share};\n"


# ------------------------------------------------------------------ host I/O

def probe(url: str, timeout: float) -> tuple[bool, dict]:
    """(answered 200, its JSON object or {})."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http to the lab)
            ok, body = response.status == 200, response.read(65536)
    except (urllib.error.URLError, OSError, ValueError):
        return False, {}
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        data = {}
    return ok, data if isinstance(data, dict) else {}


def verdict(backend: dict, timeout: float) -> tuple[bool, int | None]:
    """(healthy, slots): the backend's verdict (qwen27b-health-http: 200 for OK/WARNING) and vLLM
    answering; the slots its health endpoint reports (its --max-num-seqs), None when it says none."""
    host = backend["address"]
    host = f"[{host}]" if ":" in host else host
    # a copy of qwen27b_instances: its own verdict at /health/NAME of its host's endpoint
    ok, body = probe(f"http://{host}:{backend['health_port']}{backend.get('health_path', '/health')}", timeout)
    slots = body.get("slots")
    slots = slots if type(slots) is int and 0 < slots <= 100000 else None
    return ok and probe(f"http://{host}:{backend['port']}/health", timeout)[0], slots


def healthy(backend: dict, timeout: float) -> bool:
    return verdict(backend, timeout)[0]


def probe_all(config: dict, pool: ThreadPoolExecutor) -> tuple[dict, dict]:
    """({name: healthy}, {name: slots}) for every backend, probed side by side."""
    names = [b["name"] for b in config["backends"]]
    results = list(pool.map(lambda b: verdict(b, config["timeout_s"]), config["backends"]))
    return ({n: ok for n, (ok, _) in zip(names, results)},
            {n: slots for n, (_, slots) in zip(names, results) if slots is not None})


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


def _rewrite(path: str, text: str) -> bool:
    """Write `text` to `path` unless it already holds it; whether it changed."""
    try:
        with open(path) as fh:
            if fh.read() == text:
                return False
    except OSError:
        pass
    write_atomic(path, text)
    return True


def apply(config: dict, counts: dict | None = None, drain: str | None = None, undrain: str | None = None,
          slots: dict | None = None) -> dict:
    """Under the pool lock: mark or unmark a drain, then the pool from the counts (None: the last
    ones recorded) and the drains, the fair share from the backends' slots (None: the last ones);
    the upstream and fair files rewritten and nginx reloaded when they changed,
    the master's workers of that moment recorded (the ones a drain waits for). Returns the pool
    record (also written to pool_file)."""
    os.makedirs(os.path.dirname(config["lock_file"]), exist_ok=True)
    with open(config["lock_file"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = read_json(config["pool_file"], {})
        counts = before.get("counts", {}) if counts is None else counts
        slots = before.get("slots", {}) if slots is None else slots
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
        changed = _rewrite(config["upstream_file"], upstream_text(config, pool))
        changed = _rewrite(config["fair_file"], fair_text(config, pool, slots)) or changed
        old_workers = []
        if changed:
            master = nginx_master(config)
            if master is not None:
                old_workers = sorted(workers_of(master))
                os.kill(master, signal.SIGHUP)
        record = {"pool": pool, "failed_open": failed_open, "drained": sorted(drained), "counts": counts, "slots": slots,
                  "fair_share": fair_share(config, pool, slots),
                  "changed_at": time.time() if changed else before.get("changed_at"),
                  "old_workers": old_workers if changed else before.get("old_workers", [])}
        write_atomic(config["pool_file"], json.dumps(record, sort_keys=True) + "\n")
    if changed:
        out = sorted(set(b["name"] for b in config["backends"]) - set(pool))
        say(f"pool: {', '.join(pool) or 'none'}" + (f"; out: {', '.join(out)}" if out else "")
            + (" (none healthy: failing open)" if failed_open else "")
            + (f"; fair share: {record['fair_share']} at once per key" if record["fair_share"] else ""))
    return record


def say(text: str) -> None:
    print(f"qwen27b-gateway-pool: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ commands

def watch(config: dict, rounds: int | None = None) -> None:
    """Probe, apply, sleep; forever (or `rounds` times)."""
    record = read_json(config["pool_file"], {})
    counts, slots = record.get("counts", {}), record.get("slots") or {}
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, len(config["backends"]))) as pool:
        while rounds is None or done < rounds:
            started = time.monotonic()
            probes, said = probe_all(config, pool)
            counts = next_counts(counts, probes)
            # a backend's slots are kept until it says others: a probe that timed out on a loaded
            # host must not drop the fair share and reload nginx twice
            slots = {**slots, **said}
            apply(config, counts, slots=slots)
            done += 1
            time.sleep(max(0.0, config["interval_s"] - (time.monotonic() - started)))


def render(config: dict) -> None:
    """One round (nginx's ExecStartPre): the upstream file exists before nginx reads it."""
    with ThreadPoolExecutor(max_workers=max(1, len(config["backends"]))) as pool:
        probes, slots = probe_all(config, pool)
    apply(config, {name: (config["rise"] if ok else -config["fall"]) for name, ok in probes.items()}, slots=slots)


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
    # the lines nginx of the gateway's unit wrote (journald's own _SYSTEMD_UNIT, from the sender's cgroup):
    # `logger -t qwen27b_gateway` from any local user's session is not counted (issue 51)
    out = subprocess.run(["journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_UNIT={GATEWAY_UNIT}",
                          "SYSLOG_IDENTIFIER=qwen27b_gateway", f"--since=-{window}"],
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
