"""DFlash2 speculative decoding: the draft weights (kept fp16/bf16: quantized drafts accept ~0%),
placed like the model's, and optionally PyPI's `dflash` CLI for benchmarks against the server.
The gate already refused a quantized draft or a target whose lm_head is quantized; the
`--speculative-config` the planner chose is in the rendered unit.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.operations import server

from qwen27b.plan.gate import Decision
from qwen27b.controller.host_facts import VenvPackages

from ._common import fetch_prefix, note
from ._common import release_venv
from .weights import place


def dflash(decision: Decision) -> None:
    if decision.draft_path is None:
        spec = decision.serve.spec
        why = (f"speculative method {spec.method} (the checkpoint's own MTP layer), no draft to fetch" if spec.on
               else f"speculative decoding off: {spec.reason}" if decision.stack.draft else "this profile has no draft model")
        note(f"dflash: skipped - {why}")
        return
    place(decision, decision.stack.draft, decision.draft_path, decision.settings.draft_local_dir)
    if decision.serve.has("--speculative-config"):
        note(f"dflash: --speculative-config {decision.serve.value('--speculative-config')}")
    else:  # the flags that verified were carried over (a retry fell back): the draft stays placed
        note(f"dflash: draft placed, unused on this start: speculative {decision.serve.spec.method}, "
             f"{decision.serve.spec.reason}")
    if decision.settings.dflash_cli:
        venv = release_venv(decision)
        if "dflash" not in (host.get_fact(VenvPackages, venv=venv) or {}):
            server.shell(name="PyPI dflash CLI (dflash benchmark against the server)",
                         commands=[f"{fetch_prefix(decision)}{venv}/bin/python -m pip install dflash"])
