"""A report as a table for people (the CLI's --json prints Report.as_dict instead)."""

from __future__ import annotations

import textwrap

from .model import Report


def table(report: Report, widths: tuple[int, int] = (64, 56)) -> str:
    rows = [("step", "check", "verdict", "evidence", "fix")]
    for c in report.checks:
        rows.append((f"{c.step} {c.step_name}", c.check, c.verdict, c.evidence, c.fix))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    out = []
    for n, (a, b, v, e, f) in enumerate(rows):
        ev = textwrap.wrap(e, widths[0]) or [""]
        fx = textwrap.wrap(f, widths[1]) or [""]
        for i in range(max(len(ev), len(fx))):
            cells = (a if i == 0 else "", b if i == 0 else "", v if i == 0 else "",
                     ev[i] if i < len(ev) else "", fx[i] if i < len(fx) else "")
            out.append(f"{cells[0]:<{w0}}  {cells[1]:<{w1}}  {cells[2]:<{w2}}  {cells[3]:<{widths[0]}}  {cells[4]}".rstrip())
        if n == 0:
            out.append(f"{'-' * w0}  {'-' * w1}  {'-' * w2}  {'-' * widths[0]}  {'-' * widths[1]}")
    return "\n".join(out)
