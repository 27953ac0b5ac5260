"""The unit's start-up check (ExecStartPost): wait for /health, then send one short completion.

The first real request on V100 can spend 1-3 minutes compiling kernels (1Cat-vLLM, FACTS.md). Sent
here, before systemd counts the unit as started (`activating (start-post)` meanwhile), that compile
is over before verify, the gateway's pool or a user sends anything. The API key comes from the
environment (the unit's EnvironmentFile=, VLLM_API_KEY), never from argv; the URL is the bound
address the controller built (IPv6 bracketed). Exit 0 when the completion answered, 1 otherwise,
with one `qwen27b-warmup:` line in the journal saying why.

The key goes only to the unit's own listener: before the first request that carries it, every socket
listening where the URL leads must belong to $MAINPID (systemd sets it for ExecStartPost=) or its
descendants (listener.py says how and why that channel). Another process there (a squatter that bound
the port first and answers /health) is named and gets nothing; the unit fails.

    python -m qwen27b_onhost.warmup --url http://127.0.0.1:8000 [--served-name NAME] --timeout-s 600
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

from .listener import check_owner

KEY_ENV = "VLLM_API_KEY"
# no proxy from the environment: the service is on this host, at its bound address
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
FAILURES = (OSError, ValueError, KeyError, IndexError, TypeError)  # urllib's errors are OSErrors
PROMPT = "Say hello."
POLL_S = 0.5  # a refused connection costs microseconds; each poll saved is start-up time (issue 31)


def alive(pid: int | None) -> bool:
    """The main process still runs (no PID known: assume so; systemd's timeout bounds the wait)."""
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main_pid(env=os.environ) -> int | None:
    """systemd's $MAINPID for ExecStartPost= (unset or garbage: None)."""
    try:
        return int(env.get("MAINPID", "")) or None
    except ValueError:
        return None


def headers(env=os.environ) -> dict:
    key = env.get(KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def call(url: str, timeout: float, auth: dict | None = None, body: dict | None = None) -> dict:
    """GET (or POST body as JSON) -> the JSON answer; raises on a non-2xx (urllib.error.HTTPError), a
    refused connection or a timeout. Its messages name the URL, never the request headers."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={**(auth or {}), "Content-Type": "application/json"})
    with _OPENER.open(request, timeout=timeout) as response:  # noqa: S310 (http to this host)
        return json.loads(response.read() or b"{}")


def wait_health(base: str, pid: int | None, sleep=time.sleep) -> str | None:
    """Poll /health until 200; the reason (None when up) once the main process has died."""
    while True:
        try:
            call(f"{base}/health", timeout=5)
            return None
        except FAILURES:
            pass
        if not alive(pid):
            return f"the main process {pid} exited before /health answered"
        sleep(POLL_S)


def request_body(model: str, max_tokens: int) -> dict:
    """One short greedy completion: enough tokens to run the decode (and a speculative draft) path."""
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}


def warm_up(base: str, model: str | None, max_tokens: int, timeout_s: float, auth: dict) -> tuple[int, float]:
    """POST the completion -> (completion tokens, seconds). Without a model name, the first one
    /v1/models lists (a copy's unit is one template for every copy)."""
    started = time.monotonic()
    model = model or call(f"{base}/v1/models", 30, auth)["data"][0]["id"]
    answer = call(f"{base}/v1/completions", timeout_s, auth, request_body(model, max_tokens))
    return (answer.get("usage") or {}).get("completion_tokens") or 0, time.monotonic() - started


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b-warmup", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the service's base URL (its bound address)")
    p.add_argument("--served-name", help="the model name to ask for (default: the first /v1/models lists)")
    p.add_argument("--timeout-s", type=float, required=True, help="the completion's deadline, in s")
    p.add_argument("--max-tokens", type=int, default=16)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    base, pid = args.url.rstrip("/"), main_pid()
    died = wait_health(base, pid)
    if died:
        print(f"qwen27b-warmup: {died}; the unit fails", file=sys.stderr, flush=True)
        return 1
    print(f"qwen27b-warmup: /health answers; one completion of {args.max_tokens} tokens before the unit "
          f"counts as started (the first request compiles; deadline {args.timeout_s:.0f} s)", flush=True)
    owner = check_owner(base, pid)
    if not owner["ours"]:
        print(f"qwen27b-warmup: the API key is not sent: not this unit's process (MAINPID {pid}) listens on "
              f"{base}: {owner['text']}; the unit fails. Stop that process, then start the unit again",
              file=sys.stderr, flush=True)
        return 1
    try:
        tokens, took = warm_up(base, args.served_name, args.max_tokens, args.timeout_s, headers())
    except FAILURES as error:
        print(f"qwen27b-warmup: the warm-up completion failed ({type(error).__name__}: {error}); the unit "
              f"fails: read vLLM's lines above", file=sys.stderr, flush=True)
        return 1
    print(f"qwen27b-warmup: warm-up completion done in {took:.1f} s ({tokens} tokens)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
