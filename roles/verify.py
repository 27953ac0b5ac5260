"""Verify, from the controller: wait for readiness (with progress), the served name in
/v1/models, a streamed chat completion (TTFT, tokens/s) and, with DFlash2 on, the speculative
acceptance rate (~0 is a known V100 failure, 1Cat-vLLM issue 478). A failure marks the host
failed and attaches the unit's journal and the health status to the run report.

It runs on every deploy: it is a check, not a change (the plan counts it apart).
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import click
from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from qwen27b import verify as V
from qwen27b.gate import Decision
from qwen27b.render import SERVICE_UNIT, layout

from ._pending import note

REPORTS = Path(os.environ.get("QWEN27B_REPORTS", "reports"))
_results: list[V.HostResult] = []
RUN_ID = time.strftime("%Y%m%d-%H%M%S")


def _finish() -> None:
    if _results:
        path = V.write_report(_results, REPORTS, RUN_ID)
        click.echo(f"\n--> qwen27b verify report ({path})\n{V.report_table(_results)}\n", err=True)


def api_key(decision: Decision) -> str | None:
    path = decision.settings.api_key_file
    return Path(path).expanduser().read_text().strip() if path else None


def _remote(command: str) -> list[str]:
    ok, output = host.run_shell_command(command)
    return list(output.stdout_lines) if ok else []


def _check(decision: Decision) -> None:
    serve, model = decision.serve, decision.stack.model
    base = f"http://{serve.value('--host')}:{serve.value('--port')}"
    result = V.HostResult(host.name, model=model["id"], revision=model["revision"],
                          served_name=serve.value("--served-model-name"), url=base)
    _results.append(result)
    key = api_key(decision)
    speculative = serve.has("--speculative-config")

    def say(message: str) -> None:
        click.echo(f"    [{host.name}] {message}", err=True)

    def unit_state() -> str:
        return " ".join(_remote(f"systemctl show -p ActiveState,SubState --value {SERVICE_UNIT} | paste -sd/"))

    try:
        result.ready_s = V.wait_ready(base, decision.stack.profile["serve"]["start_timeout_s"], say, unit_state)
        V.check_models(base, result.served_name, key)
        before = V.spec_counters(V.scrape(base)) if speculative else None
        chat = V.chat_stream(base, result.served_name, key)
        result.ttft_s, result.decode_tok_s = chat["ttft_s"], chat["decode_tok_s"]
        result.completion_tokens = chat["completion_tokens"]
        if speculative:
            result.acceptance = V.acceptance(before, V.spec_counters(V.scrape(base)))
            if result.acceptance is not None and result.acceptance < 0.01:
                raise V.VerifyFailed(f"speculative acceptance {result.acceptance:.1%}: the draft is rejected "
                                     "(1Cat-vLLM issue 478: NVFP4 target on V100 TP4); check the draft and target")
        result.status = "ok"
        say(f"verified: TTFT {result.ttft_s * 1000:.0f} ms, {result.decode_tok_s or 0:.1f} tok/s")
    except V.VerifyFailed as failure:
        result.status, result.reason = "failed", str(failure)
        result.journal = _remote(f"journalctl -u {SERVICE_UNIT} -n 80 --no-pager")
        health = _remote(f"cat {layout(decision)['health_status']} 2>/dev/null")
        result.health = {"raw": health} if health else None
        raise OperationError(f"verify failed: {failure} (journal and health status in the run report)") from None


def verify(decision: Decision) -> None:
    address = decision.serve.value("--host")
    if address.startswith("127."):
        note("verify: skipped - the service binds to loopback only, the controller cannot reach it; "
             "set qwen27b_bind_address to the lab address")
        return
    if not _results and not getattr(verify, "_registered", False):
        atexit.register(_finish)
        verify._registered = True
    python.call(name="verify: readiness, /v1/models, streamed completion, acceptance", function=_check,
                decision=decision)
