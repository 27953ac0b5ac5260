"""The run report, at a deploy's end: the verify table, every host's outcome with the re-run
command, and one report file (reports/deploy-RUN_ID.json). Here, not in a role: the run's end
(controller/runlife.py) writes it for every run, also one whose deploy file never started."""

from __future__ import annotations

import time

import click

from qwen27b.controller import engineword_read
from qwen27b.controller import postdeploy as V
from qwen27b.controller import runstate, runsummary
from qwen27b.controller.report import reports_dir
from qwen27b.controller.verifyplan import summary_detail

RUN_ID = time.strftime("%Y%m%d-%H%M%S")


def finish_run(run: runstate.RunState, results: list[runsummary.Outcome], argv: list[str]) -> None:
    """At exit: the verify table, every host's outcome with the re-run command, one report file."""
    path = V.write_report(run.results, reports_dir(), RUN_ID, runsummary.as_json(results)) if results or run.results else None
    if run.results:
        click.echo(f"\n--> qwen27b verify report ({path})\n{V.report_table(run.results)}\n"
                   f"{engineword_read.report_text(run.results)}", err=True)
    if results:
        click.echo("\n" + runsummary.summary_text(results, argv), err=True)


def verified(run: runstate.RunState) -> dict[str, tuple[str, str]]:
    """Host -> (status, the summary's detail: for an ok row, which check ran)."""
    return {r.host: (r.status, summary_detail(r.status, r.reason, r.check, r.changed, r.ttft_s, r.decode_tok_s))
            for r in run.results}
