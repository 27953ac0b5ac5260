"""The load: streamed requests, at most C in flight, timed as ``vllm bench serve`` times them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Sequence


def request_body(api: str, model: str, text: str, output_tokens: int, temperature: float | None) -> dict:
    body = {"model": model, "max_tokens": output_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if temperature is not None:
        body["temperature"] = temperature
    return body


async def one_request(client, url: str, body: dict, headers: dict) -> dict:
    """One streamed request; TTFT = first chunk with choices, latency = last such chunk (as
    ``vllm bench serve`` measures them); token counts from the usage chunk."""
    t0 = time.perf_counter()
    first = last = None
    usage: dict = {}
    finish = None
    out = {"ok": False, "start": t0}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                detail = (await r.aread())[:300].decode(errors="replace")
                out.update(error=f"HTTP {r.status_code}: {detail}", end=time.perf_counter())
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                now = time.perf_counter()
                choices = obj.get("choices") or []
                if choices:
                    first = first or now
                    last = now
                    finish = choices[0].get("finish_reason") or finish
                if obj.get("usage"):
                    usage = obj["usage"]
    except Exception as error:  # noqa: BLE001 - any transport/parse failure is a failed request
        out.update(error=f"{type(error).__name__}: {error}", end=time.perf_counter())
        return out
    end = time.perf_counter()
    if first is None:
        out.update(error="the stream returned no token", end=end)
        return out
    out.update(ok=True, end=end, ttft_s=first - t0, latency_s=last - t0, finish_reason=finish,
               prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
    return out


async def run_level(base: str, api: str, bodies: Sequence[dict], concurrency: int, headers: dict,
                    timeout: float) -> tuple[list[dict], float]:
    import httpx
    url = f"{base}/v1/chat/completions" if api == "chat" else f"{base}/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30), limits=limits,
                                 trust_env=False) as client:
        async def guarded(body):
            async with sem:
                return await one_request(client, url, body, headers)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(b) for b in bodies))
        wall = time.perf_counter() - t0
    for r in results:
        r["start"] -= t0
        r["end"] -= t0
    return list(results), wall
