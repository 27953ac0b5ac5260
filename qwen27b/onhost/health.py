"""qwen27b-health: one health check of the vLLM service, run by a systemd timer on each host.

One run: probe ``/health`` and ``/v1/models``, watch the engine's forward progress (``/metrics``'
token counter while requests wait; a 1-token completion when idle, rate-limited: the API process can
answer /health while its engine core is hung), read the GPUs (gpu.py), turn the readings into a
nagios verdict (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN when the check itself broke), persist it to
the status file (statusfile.py) and, after K consecutive CRITICAL runs, restart the unit,
rate-limited (unit.py). Every finding is one sentence saying what to do. The same readings go to
node_exporter's textfile collector (metrics.py).

Runs from the release venv (stdlib plus the stack's host_packages), so this package imports
nothing from the rest of qwen27b. The pure parts (:func:`verdict`, :func:`next_failures`,
:func:`restart_decision`) take plain values: unit-tested without a server, a GPU or systemd.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import httpx

from .contract import (COPY_ENV, GPUS_ENV, CRITICAL, ENGINE_STALLED_FINDING, IDLE_PROBE_DEADLINE_ENV, IDLE_PROBE_EVERY_ENV, INFO, LEVELS,
                       MODEL_REF_ENV, RELEASE_RECORD_ENV, SLOTS_ENV, SPECULATIVE_ENV, OK, QUIET_ENV, RESTART_LOOP_FINDING, RESTART_REQUEST_ENV,
                       SERVICE_UNIT, STALL_AFTER_ENV, TEXTFILE_DIR, TEXTFILE_DIR_ENV, TEXTFILE_NAME, UNKNOWN, WARNING,
                       XID_ADVICE, XID_FATAL, restart_loop, NEEDS, NEEDS_HUMAN_FINDING, NEEDS_REBOOT_FINDING,
                       XID_NEEDS)
from .gpu import THROTTLE_BAD, own_xids, read_gpus, read_xids
from .idleprobe import frozen, generate_one, idle_probe_due, judge
from .listener import check_owner, main_pid_of
from .metrics import accumulate_xids, export_metrics
from .secretfile import SecretFileError, load_secret
from .statusfile import epoch, iso, load_status, push_history, read_previous, write_status
from .unit import request_restart, restart_unit, unit_properties

HOT_C = 85  # V100 slows down at ~87 C (nvidia-smi "GPU Slowdown Temp"); warn before it does
XID_FIRST_LOOKBACK_S = 600  # first run (no status file yet): look this far back for Xids


# ------------------------------------------------------------------------------- pure parts

def finding(level: int, text: str, kind: str | None = None) -> dict:
    """One sentence at a level; `kind` names the findings other code acts on (the restart loop)."""
    out = {"level": "INFO" if level == INFO else LEVELS[level], "text": text}
    return {**out, "kind": kind} if kind else out


def verdict(r: dict, slow_ms: float = 1000.0, hot_c: int = HOT_C) -> tuple[int, list[dict]]:
    """Readings -> (nagios code, findings).  ``r`` holds what :func:`collect` measured:

    url, unit, served_name, key_error, health {status, latency_ms, error},
    models {status, ids, error}, gpu (list or None), xids (list or None).
    """
    f: list[tuple] = []  # (level, text) or (level, text, kind)
    url, unit = r.get("url", "the server"), r.get("unit", "the unit")
    h = r.get("health") or {}
    if h.get("error"):
        f.append((CRITICAL, f"/health unreachable ({h['error']}): vLLM is down or not listening on {url}; "
                            f"check `systemctl status {unit}` and `journalctl -u {unit}`."))
    elif h.get("status") == 503:
        f.append((CRITICAL, f"/health returned 503: the vLLM engine died; read `journalctl -u {unit}` "
                            f"for the cause and restart {unit} (the watchdog does after K failures)."))
    elif h.get("status") != 200:
        f.append((CRITICAL, f"/health returned {h.get('status')}: something else answers on {url}; "
                            f"check the port and `systemctl status {unit}`."))
    elif h.get("latency_ms") is not None and h["latency_ms"] > slow_ms:
        f.append((WARNING, f"/health took {h['latency_ms']:.0f} ms (> {slow_ms:.0f} ms): the host is "
                           f"overloaded or swapping; check load, memory and vllm:num_requests_waiting."))

    owner = r.get("listener") or {}
    squatter = owner.get("listening") and not owner.get("ours")
    if squatter:
        f.append((CRITICAL, f"not {unit}'s process answers on {url}: {owner['text']}; the API key was not sent "
                            f"to it. Stop that process (it may be reading clients' keys), then `systemctl restart "
                            f"{unit}`."))
    if r.get("key_error"):
        f.append((CRITICAL, f"cannot use the API key file ({r['key_error']}); if it is "
                            f"a permission error, run the check as root or fix the file's owner/mode."))
    m = r.get("models") or {}
    if m.get("skipped"):  # no key sent: to a squatter (said above), or nothing of the unit listens
        if not h.get("error") and not squatter:
            f.append((CRITICAL, f"/v1/models not asked ({m['skipped']}): the API key goes only to {unit}'s own "
                                f"process; check `systemctl status {unit}`."))
    elif m.get("error"):
        if not h.get("error"):  # one sentence for one outage
            f.append((CRITICAL, f"/v1/models unreachable ({m['error']}): the API server is not answering; "
                                f"check `journalctl -u {unit}`."))
    elif m.get("status") == 401:
        f.append((CRITICAL, "/v1/models returned 401: the API key does not match the server's VLLM_API_KEY; "
                            "point --api-key-file at the service's key file."))
    elif m.get("status") != 200:
        f.append((CRITICAL, f"/v1/models returned {m.get('status')}: the OpenAI API is not serving; "
                            f"check `journalctl -u {unit}`."))
    elif r.get("served_name") and r["served_name"] not in (m.get("ids") or []):
        f.append((CRITICAL, f"served model {r['served_name']!r} is not listed by /v1/models "
                            f"(it lists {', '.join(m.get('ids') or []) or 'nothing'}): clients asking for it "
                            f"get 404; fix --served-model-name in {unit} or --served-name here."))

    stall, idle = r.get("stall"), r.get("idle_probe")
    if stall:
        f.append((CRITICAL, f"engine stalled: {stall['running']:.0f} running and {stall['waiting']:.0f} waiting "
                            f"request(s), but vllm:generation_tokens_total has stayed at {stall['tokens']:.0f} for "
                            f"{stall['for_s']:.0f} s while /health answers: the engine core is hung (vLLM #39863; "
                            f"NCCL or shared memory at TP 2/4 on V100 is the usual cause); the watchdog restarts "
                            f"{unit}, read `journalctl -u {unit}`.", ENGINE_STALLED_FINDING))
    elif frozen(idle):
        f.append((CRITICAL, f"the engine generates nothing: a 1-token completion got no answer within "
                            f"{idle['deadline_s']:.0f} s ({idle['error']}) while /health answers and no request "
                            f"runs: the engine core is hung or dead (vLLM #39863); the watchdog restarts {unit}, "
                            f"read `journalctl -u {unit}`.", ENGINE_STALLED_FINDING))

    for g in r.get("gpu") or []:
        i = g.get("index")
        if g.get("error"):
            f.append((CRITICAL, f"GPU {i} unreadable via NVML ({g['error']}): check `nvidia-smi` and the "
                                f"kernel log for Xid 79; reboot the host, then check its power and seating "
                                f"(needs a human: restarting {unit} cannot help).", NEEDS_HUMAN_FINDING))
            continue
        if (g.get("ecc_uncorrected") or 0) > 0:
            f.append((CRITICAL, f"GPU {i} has {g['ecc_uncorrected']} uncorrected ECC errors since driver load: "
                                f"drain the host and reboot (needs a reboot: restarting {unit} cannot help); "
                                f"replace the card if it repeats.", NEEDS_REBOOT_FINDING))
        if g.get("retired_pages_pending"):
            f.append((WARNING, f"GPU {i} has retired pages pending: reboot (or reset the GPU) so they are "
                               f"retired (needs a reboot: restarting {unit} cannot help).", NEEDS_REBOOT_FINDING))
        if g.get("temperature_c") is not None and g["temperature_c"] >= hot_c:
            f.append((WARNING, f"GPU {i} at {g['temperature_c']} C (>= {hot_c} C): check fans and airflow "
                               f"before it slows down."))
        bad = [n for n in (g.get("throttle") or {}).get("reasons", []) if n in THROTTLE_BAD]
        if bad:
            f.append((WARNING, f"GPU {i} slowed down by {', '.join(bad)}: a cooling or power-delivery problem; "
                               f"check fans, PSU cables and `nvidia-smi -q -d PERFORMANCE`."))

    for x in r.get("xids") or []:
        level = CRITICAL if x["xid"] in XID_FATAL else WARNING
        advice = XID_ADVICE.get(x["xid"], "look it up in NVIDIA's Xid catalog and read the kernel log")
        needs = XID_NEEDS.get(x["xid"])
        f.append((level, f"Xid {x['xid']} on {x['pci']} at {x['time'] or 'unknown time'}: {advice}"
                         + (f" (needs a {NEEDS[needs]}: restarting {unit} cannot help)." if needs else "."))
                  + ((needs,) if needs else ()))

    code = max([entry[0] for entry in f], default=OK)
    return code, [finding(*entry) for entry in f]


PROGRESS_SERIES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
                   "vllm:generation_tokens_total": "tokens"}


def progress_reading(metrics_text: str) -> dict | None:
    """vLLM's /metrics text -> {running, waiting, tokens}, each summed over its label sets (one per
    engine); None when one is missing (not vLLM, or a vLLM that names them otherwise). Three exact
    names need no Prometheus parser: a sample line is `NAME{labels} VALUE [timestamp]`."""
    out: dict = {}
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in PROGRESS_SERIES:
            continue
        rest = line.rsplit("}", 1)[1] if "{" in line else line[len(name):]
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out[PROGRESS_SERIES[name]] = out.get(PROGRESS_SERIES[name], 0.0) + value
    return out if len(out) == len(PROGRESS_SERIES) else None


def liveness(prev: dict | None, reading: dict | None, now: float, stall_after_s: float) -> tuple[dict | None, dict | None]:
    """-> (the stall's readings, or None; the memory for the next run). Stalled: requests running or
    waiting while vllm:generation_tokens_total has not moved for `stall_after_s`, counted from the
    first run that saw requests on an unmoved counter (a counter that went down is a restart: moved).
    No reading: no judgement, the memory is kept."""
    if reading is None:
        return None, prev
    prev = prev or {}
    busy = reading["running"] + reading["waiting"] > 0
    moved = reading["tokens"] != prev.get("tokens")
    since = None if not busy else (now if moved or prev.get("busy_since") is None else prev["busy_since"])
    memory = {**reading, "busy_since": since, "last_probe": prev.get("last_probe")}
    if since is not None and now - since >= stall_after_s:
        return {**reading, "for_s": round(now - since, 1)}, memory
    return None, memory


def needs_attention(findings: list[dict]) -> str | None:
    """"human" or "reboot" when a finding is a GPU fault no restart of the service fixes (a human's
    outranks a reboot's: a card off the bus stays off after one), else None."""
    kinds = {f.get("kind") for f in findings}
    for kind in (NEEDS_HUMAN_FINDING, NEEDS_REBOOT_FINDING):
        if kind in kinds:
            return NEEDS[kind]
    return None


def next_failures(previous: int, code: int) -> int:
    """Consecutive CRITICAL runs.  Any non-CRITICAL run ends the streak: WARNING means the
    endpoint answered (only GPU health or slowness is off), so there is nothing to restart."""
    return previous + 1 if code == CRITICAL else 0


def restart_decision(*, code: int, failures: int, restart_after: int, last_restart: float | None, needs: str | None = None,
                     now: float, min_interval_s: float, unit_state: str | None,
                     enabled: bool, unit: str) -> tuple[str, str]:
    """-> (action, reason) with action "none", "skip" or "restart".

    Skips, each with its reason: --no-restart; the unit is still "activating" (a 27B model takes
    minutes to load and a restart would only start the wait again); the last restart was less
    than ``min_interval_s`` ago (a crash loop must not become a restart storm).
    """
    if code != CRITICAL or failures < restart_after:
        return "none", ""
    why = f"{failures} consecutive CRITICAL runs (restart after {restart_after})"
    if not enabled:
        return "skip", f"{why}: would restart {unit}, but --no-restart is set."
    if unit_state == "activating":
        return "skip", f"{why}: {unit} is still starting (activating); not restarting it, wait for the model to load."
    if needs:
        return "skip", (f"{why}: not restarting {unit}: a GPU fault needs a {needs} (see the findings); "
                        "a restart cannot fix it and would only loop.")
    if last_restart is not None and now - last_restart < min_interval_s:
        return "skip", (f"{why}: {unit} was restarted {now - last_restart:.0f} s ago "
                        f"(< {min_interval_s:.0f} s); not again yet, read `journalctl -u {unit}`.")
    return "restart", f"{why}: restarting {unit}."


# ------------------------------------------------------------------------------- readings

def probe(url: str, key: str | None, timeout: float, skip_models: str | None = None) -> tuple[dict, dict]:
    """GET /health (open) and /v1/models (guarded by --api-key) -> (health, models). With
    `skip_models` (why), /v1/models is not asked: the listener is not the unit's, the key stays here.

    Both at once: a hung server (its process stopped, its socket still accepting) costs the run one
    timeout, not one per request, so a watchdog of K runs acts K timeouts sooner. Errors are recorded
    as the exception's class and text; httpx's messages name the URL but never the request headers,
    so the key cannot leak through them.
    """
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    health: dict = {"status": None, "latency_ms": None, "error": None}
    models: dict = {"status": None, "ids": None, "error": None}
    if skip_models:
        models["skipped"] = skip_models

    def get_health(client: httpx.Client) -> None:
        t0 = time.monotonic()
        try:
            resp = client.get(f"{base}/health")
            health["status"] = resp.status_code
            health["latency_ms"] = round((time.monotonic() - t0) * 1000, 1)
        except httpx.HTTPError as e:
            health["error"] = f"{type(e).__name__}: {e}"

    def get_models(client: httpx.Client) -> None:
        try:
            resp = client.get(f"{base}/v1/models", headers=headers)
            models["status"] = resp.status_code
            if resp.status_code == 200:
                models["ids"] = [m.get("id") for m in resp.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            models["error"] = f"{type(e).__name__}: {e}"

    with httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False) as client:
        beside = threading.Thread(target=get_models, args=(client,), daemon=True)
        if not skip_models:
            beside.start()
        get_health(client)
        if not skip_models:
            beside.join()
    return health, models


def read_progress(url: str, key: str | None, timeout: float) -> tuple[dict | None, str | None]:
    """GET /metrics (with the key: the route guard lets it through) -> (progress_reading, why not)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False) as client:
            resp = client.get(f"{url.rstrip('/')}/metrics", headers=headers)
    except httpx.HTTPError as e:
        return None, f"/metrics: {type(e).__name__}: {e}"
    if resp.status_code != 200:
        return None, f"/metrics returned {resp.status_code}"
    reading = progress_reading(resp.text)
    return reading, None if reading else "/metrics has no vllm:num_requests_*/generation_tokens_total"


# ------------------------------------------------------------------------------- one run

def check(args: argparse.Namespace, now: float | None = None) -> dict:
    """Probe, judge, persist, maybe restart -> the status dict (also the --json output)."""
    now = time.time() if now is None else now
    prev, bad_status = read_previous(args.status_file)

    key, key_error = None, None
    if args.api_key_file:
        try:
            key = load_secret(args.api_key_file)
        except SecretFileError as e:
            key_error = f"{args.api_key_file}: {e}"

    systemd = unit_properties(args.unit)  # {}: no systemd or no such unit
    # the key goes only to a listener of the unit's own processes (listener.py; issue 51)
    owner = check_owner(args.url, main_pid_of(systemd))
    health, models = probe(args.url, key, args.timeout, skip_models=None if owner["ours"] else owner["text"])
    unit_state = systemd.get("ActiveState") or None  # unknown is never "activating"
    stall, idle, live, progress_note = None, None, prev.get("liveness"), None
    # progress is judged once the unit is in service (a warming-up engine compiles; the probe would
    # race its warm-up), and where vLLM answers (else the /health and /v1/models findings say why)
    if health["status"] == 200 and models["status"] == 200 and unit_state != "activating" and owner["ours"]:
        reading, progress_note = read_progress(args.url, key, args.timeout)
        stall, live = liveness(live, reading, now, args.stall_after_s)
        if reading is not None and args.served_name and idle_probe_due(live, now, args.idle_probe_every_s):
            idle = generate_one(args.url, key, args.served_name, args.idle_probe_deadline_s)
            if not idle["ok"]:  # late while the counter moved: busy with others (idleprobe.judge)
                idle = judge(idle, reading, read_progress(args.url, key, args.timeout)[0])
            live = {**live, "last_probe": {"time": now, "ok": idle["ok"], "latency_ms": idle["latency_ms"]}}
    others: list[str] = []  # a copy's check: the other copies' GPUs, and their Xid lines, are theirs
    gpus, gpu_note = read_gpus(only=getattr(args, "gpus", None), others=others)
    since = epoch(prev.get("time")) or now - XID_FIRST_LOOKBACK_S
    xids, xid_source = read_xids(since)
    xids = own_xids(xids, others)

    readings = {"url": args.url, "unit": args.unit, "served_name": args.served_name,
                "key_error": key_error, "health": health, "models": models, "gpu": gpus, "xids": xids,
                "stall": stall, "idle_probe": idle, "listener": owner}
    code, findings = verdict(readings, slow_ms=args.slow_ms)
    if idle and idle.get("busy"):
        findings.append(finding(INFO, f"the idle 1-token probe missed its {idle['deadline_s']:.0f} s deadline, but "
                                      f"{idle['busy']}: busy, not hung."))
    if progress_note:
        findings.append(finding(INFO, f"engine progress not watched this run ({progress_note})."))
    if bad_status:
        note = (f"the previous status {args.status_file} {bad_status}: starting fresh (failure counter 0, "
                "no history); this run's status replaces it.")
        findings.append(finding(INFO, note))
        print(f"qwen27b-health: {note}", file=sys.stderr)

    if unit_state == "activating" and code != CRITICAL:
        # vLLM answers while the unit's start-up warm-up (ExecStartPost) runs its first, compiling
        # request: not in service yet, so the health endpoint says 503 and the gateway's pool waits
        code = CRITICAL
        findings.append(finding(CRITICAL, f"{args.unit} is warming up (activating, start-post): vLLM answers but "
                                          f"its first request is still compiling; in service once systemd calls "
                                          f"it active (`systemctl status {args.unit}`)."))
    failures = next_failures(int(prev.get("consecutive_failures") or 0), code)
    last_restart = prev.get("last_restart")
    loop = restart_loop(systemd, args.unit) if systemd and code == CRITICAL else None
    if loop:
        findings.append(finding(CRITICAL, loop, RESTART_LOOP_FINDING))
    if unit_state == "activating":
        findings.append(finding(INFO, f"{args.unit} is still starting (activating): CRITICAL is expected "
                                      f"until the model has loaded."))
    needs = needs_attention(findings)
    action, reason = restart_decision(
        code=code, failures=failures, restart_after=args.restart_after, needs=needs,
        last_restart=epoch((last_restart or {}).get("time")), now=now,
        min_interval_s=args.restart_min_interval_s, unit_state=unit_state,
        enabled=not args.no_restart, unit=args.unit)
    restart = {"action": action, "reason": reason} if action != "none" else None
    if action == "skip":
        findings.append(finding(INFO, reason))
    elif action == "restart":
        ok, detail = (request_restart(args.restart_request, args.unit, reason) if args.restart_request
                      else restart_unit(args.unit))
        last_restart = {"time": iso(now), "reason": reason, "ok": ok, "detail": detail}
        restart["ok"], restart["detail"] = ok, detail
        findings.append(finding(INFO, reason if ok else f"{reason} It failed ({detail}): restart it by hand."))
    if action != "none":
        print(f"qwen27b-health: {reason}" + ("" if restart.get("ok", True) else f" failed: {restart['detail']}"),
              file=sys.stderr)

    stamp = iso(now)
    return {
        "time": stamp,
        "url": args.url,
        "unit": args.unit,
        "copy": getattr(args, "copy", None),
        "verdict": LEVELS[code],
        "code": code,
        "findings": findings,
        "latency_ms": health["latency_ms"],
        "health_status": health["status"],
        "models": models["ids"],
        "served_name": args.served_name,
        "slots": engine_slots(getattr(args, "slots", None), getattr(args, "release_record", None)),
        "gpu": gpus,
        "gpu_note": gpu_note,
        "xids": xids,
        "xid_source": xid_source,
        "unit_state": unit_state,
        # the memory of the engine's progress (tokens, busy_since, last_probe) and this run's judgement
        "liveness": live,
        "stalled": bool(stall) or frozen(idle),
        "idle_probe": idle,
        "systemd": systemd or None,  # what the restart-loop sentence was read from
        "listener": owner,  # who holds the port: the key went only to the unit's own process
        "consecutive_failures": failures,
        "needs": needs,  # "reboot" / "human": a GPU fault the watchdog does not restart for (issue 27)
        "restart_after": args.restart_after,
        "restart": restart,
        "last_restart": last_restart,
        "history": push_history(prev.get("history"), stamp, code),
    }


def engine_slots(given: int | None, record_file: str | None) -> int | None:
    """Requests the engine runs at once (its --max-num-seqs; the gateway's fair share sums them):
    given (a copy's), else the release record's flags (the one service's: a rollback restores the
    record); None when neither says."""
    if given is not None or not record_file:
        return given
    try:
        with open(record_file) as fh:
            flags = json.load(fh).get("flags") or []
    except (OSError, ValueError, AttributeError):
        return None
    values = [str(f).split()[1] for f in flags if str(f).startswith("--max-num-seqs ") and len(str(f).split()) == 2]
    return int(values[0]) if values and values[0].isdigit() else None


def verdict_changed(s: dict) -> bool:
    """True on a first run or when this run's verdict differs from the previous run's."""
    history = s.get("history") or []
    return len(history) < 2 or history[-2]["code"] != history[-1]["code"]


def one_line(s: dict) -> str:
    """The journal's line for a check whose verdict did not change (``--quiet``): the verdict, since
    when (as far as the history reaches), the counter, and the first finding's sentence."""
    history = s.get("history") or []
    since = s["time"]
    for h in reversed(history):
        if h["code"] != s["code"]:
            break
        since = h["time"]
    gpus = s.get("gpu")
    parts = [f"{s['verdict']} ({s['code']}) unchanged since {since}",
             f"/health {s['health_status']} in {s['latency_ms']} ms" if s.get("health_status") else "/health no answer",
             "no GPU" if gpus is None else f"{sum(1 for g in gpus if not g.get('error'))}/{len(gpus)} GPUs read",
             f"{len(s['xids'])} new Xids" if s.get("xids") is not None else "Xids unknown"]
    if s["code"] == CRITICAL:
        parts.append(f"{s['consecutive_failures']} consecutive failures")
    if s.get("needs"):
        parts.append(f"NEEDS A {s['needs'].upper()}: no restart (a GPU fault)")
    worst = [f for f in s.get("findings") or [] if f["level"] == s["verdict"]]
    if worst:
        parts.append(f"{len(s['findings'])} finding(s), first: {worst[0]['text']}")
    return "; ".join(parts)


def table(s: dict) -> str:
    """A few aligned lines for a person at a terminal (or reading the journal)."""
    rows = [("verdict", f"{s['verdict']} ({s['code']})  {s['time']}"),
            ("url", s["url"]),
            ("/health", f"{s['health_status']} in {s['latency_ms']} ms" if s["health_status"] else "no answer"),
            ("models", ", ".join(s["models"]) if s["models"] else "-")]
    if s["gpu"] is None:
        rows.append(("gpu", f"none ({s['gpu_note']})"))
    for g in s["gpu"] or []:
        if g.get("error"):
            rows.append((f"gpu {g['index']}", f"error: {g['error']}"))
            continue
        thr = ",".join((g.get("throttle") or {}).get("reasons") or []) or "-"
        rows.append((f"gpu {g['index']}", f"{g['name']}  {g['memory_used_mib']}/{g['memory_total_mib']} MiB  "
                                          f"{g['temperature_c']} C  ecc {g['ecc_uncorrected']}  "
                                          f"pending {g['retired_pages_pending']}  clocks {thr}"))
    live = s.get("liveness")
    if live:
        probe_text = ""
        if s.get("idle_probe"):
            p = s["idle_probe"]
            probe_text = ("; idle probe " + (f"ok in {p['latency_ms']} ms" if p['ok'] else
                                              ("late, busy: " if p.get("busy") else "FAILED: ") + str(p['error'])))
        rows.append(("engine", f"{live['running']:.0f} running, {live['waiting']:.0f} waiting, "
                               f"{live['tokens']:.0f} tokens generated{probe_text}"))
    rows.append(("xid", "unknown (no kernel log)" if s["xids"] is None
                 else f"{len(s['xids'])} new ({s['xid_source']})"))
    last = s["last_restart"]
    rows.append(("failures", f"{s['consecutive_failures']} consecutive (restart after {s['restart_after']}); "
                             f"last restart {last['time'] if last else 'never'}"))
    if s.get("needs"):
        rows.append(("needs", f"a {s['needs']}: a GPU fault no restart of {s['unit']} fixes; the watchdog does not restart"))
    rows.append(("history", " ".join(str(h["code"]) for h in s["history"]) + "  (codes, oldest first)"))
    out = [f"{k:<9} {v}" for k, v in rows]
    out += [f"  {f['level']:<8} {f['text']}" for f in s["findings"]] or ["  no findings"]
    return "\n".join(out)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b-health", description=__doc__.split("\n\n")[0],
                                epilog="exit codes: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the check failed)")
    p.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--unit", default=SERVICE_UNIT, help="systemd unit the watchdog restarts")
    p.add_argument("--status-file", help="JSON status, also the memory between runs (counter, history)")
    p.add_argument("--restart-after", type=int, default=3, help="restart after K consecutive CRITICAL runs")
    p.add_argument("--restart-min-interval-s", type=float, default=600.0, help="at most one restart per S s")
    p.add_argument("--api-key-file", help="VLLM_API_KEY=... env file or a bare key (never printed)")
    p.add_argument("--served-name", help="model id /v1/models must list")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in s")
    p.add_argument("--slow-ms", type=float, default=1000.0, help="/health slower than this is a WARNING")
    p.add_argument("--json", action="store_true", help="print the status JSON instead of the table")
    p.add_argument("--no-restart", action="store_true", help="never restart; record what would happen")
    # from the environment too: the unit sets it with Environment=, so that a rollback to a release
    # whose qwen27b-health predates it still runs (an unknown flag would fail every check)
    p.add_argument("--restart-request", default=os.environ.get(RESTART_REQUEST_ENV) or None, metavar="FILE",
                   help="restart by writing FILE for a privileged helper instead of `systemctl restart` "
                        f"(default ${RESTART_REQUEST_ENV}; the health unit runs unprivileged)")
    # these three from the environment as well, for the same reason
    p.add_argument("--quiet", action="store_true", default=os.environ.get(QUIET_ENV) == "1",
                   help=f"the full table only when the verdict changes (and on a first run); else one line "
                        f"(default: ${QUIET_ENV}=1)")
    p.add_argument("--textfile-dir", default=os.environ.get(TEXTFILE_DIR_ENV, TEXTFILE_DIR),
                   help=f"node_exporter textfile dir for {TEXTFILE_NAME} ('' to write none; "
                        f"default ${TEXTFILE_DIR_ENV} or {TEXTFILE_DIR})")
    p.add_argument("--model-ref", default=os.environ.get(MODEL_REF_ENV) or None,
                   help=f"model id@revision, for the qwen27b_build_info metric (default ${MODEL_REF_ENV})")
    p.add_argument("--speculative", default=os.environ.get(SPECULATIVE_ENV) or None,
                   help=f"the speculative method in use (mtp:7, dflash2:7, off), for qwen27b_build_info "
                        f"(default ${SPECULATIVE_ENV})")
    p.add_argument("--slots", type=int, default=int(os.environ[SLOTS_ENV]) if os.environ.get(SLOTS_ENV, "").isdigit()
                   else None, help=f"requests the engine runs at once (its --max-num-seqs), for the health "
                                   f"endpoint and the gateway's fair share (default ${SLOTS_ENV})")
    p.add_argument("--release-record", default=os.environ.get(RELEASE_RECORD_ENV) or None, metavar="FILE",
                   help=f"the release record whose --max-num-seqs is the engine's slots when --slots is not given "
                        f"(default ${RELEASE_RECORD_ENV})")
    p.add_argument("--stall-after-s", type=float, default=float(os.environ.get(STALL_AFTER_ENV) or 120),
                   help="requests waiting on an unmoved token counter this long is CRITICAL 'engine stalled' "
                        f"(default ${STALL_AFTER_ENV} or 120)")
    p.add_argument("--idle-probe-every-s", type=float, default=float(os.environ.get(IDLE_PROBE_EVERY_ENV) or 20),
                   help="when idle, a 1-token completion at most this often (0: never; "
                        f"default ${IDLE_PROBE_EVERY_ENV} or 20)")
    p.add_argument("--idle-probe-deadline-s", type=float,
                   default=float(os.environ.get(IDLE_PROBE_DEADLINE_ENV) or 20),
                   help=f"the idle probe's deadline (default ${IDLE_PROBE_DEADLINE_ENV} or 20)")
    p.add_argument("--copy", default=os.environ.get(COPY_ENV) or None, metavar="NAME",
                   help=f"the copy of qwen27b_instances this check watches: its metrics file and `copy` label "
                        f"(default ${COPY_ENV})")
    p.add_argument("--gpus", default=os.environ.get(GPUS_ENV) or None, metavar="I,J",
                   help=f"read only these GPU indices, the copy's own (default ${GPUS_ENV}; unset: every GPU)")
    args = p.parse_args(argv)
    if args.restart_after < 1:
        p.error("--restart-after must be >= 1")
    try:
        args.gpus = None if args.gpus is None else sorted({int(i) for i in args.gpus.split(",") if i.strip()})
    except ValueError:
        p.error(f"--gpus must be GPU indices separated by commas, got {args.gpus!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        status = check(args)
    except Exception as e:  # noqa: BLE001 - a broken check is UNKNOWN, not a service outage
        print(f"qwen27b-health: UNKNOWN: the check itself failed: {type(e).__name__}: {e}", file=sys.stderr)
        return UNKNOWN
    status["xid_counts"] = accumulate_xids(load_status(args.status_file).get("xid_counts"), status["xids"])
    problem = export_metrics(args, status)
    if problem:
        print(f"qwen27b-health: {problem}", file=sys.stderr)
    if args.status_file:
        try:
            write_status(args.status_file, status)
        except OSError as e:
            print(f"qwen27b-health: cannot write {args.status_file} ({e.strerror}): the failure counter "
                  f"and history are not kept", file=sys.stderr)
    if args.json:
        print(json.dumps(status, indent=2))
    elif args.quiet and not verdict_changed(status):
        print(one_line(status))
    else:
        print(table(status))
    return status["code"]


if __name__ == "__main__":
    raise SystemExit(main())
