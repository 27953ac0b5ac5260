"""Plain-text tables for people: the plan per host, refusals, warnings, planned operations."""

from __future__ import annotations

import os
import re
import tempfile
import textwrap
from pathlib import Path

from qwen27b.plan.gate import Decision, RefusedHost

def reports_dir() -> Path:
    """Where run reports go and are read from: $QWEN27B_REPORTS, else ./reports (one rule for the
    deploy, its record of reachable sources and every tool that reads them)."""
    return Path(os.environ.get("QWEN27B_REPORTS", "reports"))


def write_private(path: Path, text: str) -> Path:
    """Write a report file mode 0600 from its first byte (a temp file in the same directory, renamed):
    reports carry journals, hosts and errors that are for the operator, not for every local user."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_CITATION = re.compile(r"\[([a-z0-9][a-z0-9, .-]*)\]")


def table(headers: list[str], rows: list[list[str]], widths: list[int]) -> str:
    """A fixed-width table; each cell wraps at its column's width."""
    cells = [[textwrap.wrap(str(c), w, break_on_hyphens=False) or [""] for c, w in zip(r, widths)] for r in rows]
    used = [max([len(h)] + [len(line) for row in cells for line in row[i]]) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, used)).rstrip(), "  ".join("-" * w for w in used)]
    for row in cells:
        for n in range(max(len(c) for c in row)):
            out.append("  ".join((c[n] if n < len(c) else "").ljust(w) for c, w in zip(row, used)).rstrip())
    return "\n".join(out)


def _legend(d: Decision, texts: list[str]) -> list[str]:
    ids: list[str] = []
    for text in texts:
        for group in _CITATION.findall(text):
            ids += [i.strip() for i in group.split(",") if i.strip() in d.stack.sources and i.strip() not in ids]
    return [f"  [{i}] {d.stack.sources[i]}" for i in ids]


def _head(d: Decision) -> str:
    gpus = ", ".join(sorted({g.name for g in d.gpus})) or "none"
    return (f"== {d.host}: profile {d.profile} - {d.stack.profile['description']}\n"
            f"   {len(d.gpus)} GPU(s): {gpus}; release {d.stack.stack_hash}"
            + (f"\n   {d.entry.line()}" if d.entry else ""))


def format_decision(d: Decision) -> str:
    parts = [_head(d), "", table(["install", "action", "value", "why"],
                             [[c.what, c.action, c.value, c.reason] for c in d.choices], [8, 8, 34, 60]), ""]
    group = d.group.rows() if d.group is not None else []  # multinode.NodeGroup: one stage of a serving group
    if group:
        parts += [table(["serving group", "value", "why"], group, [14, 30, 76]), ""]
    serves = [d.serve] if not d.copies else [c.serve for _, c in d.copies]
    for instance, copy in d.copies or [(None, d)]:
        if instance is not None:
            parts += [f"-- copy '{instance.name}': qwen27b@{instance.name}.service, GPU(s) "
                      f"{','.join(map(str, instance.gpus)) or 'none'} (CUDA_VISIBLE_DEVICES), port {instance.port}, "
                      f"sized on its own GPUs (qwen27b_instances)", ""]
        parts.append(table(["vllm serve flag", "value", "why"],
                           [[f.name + (" (pinned)" if f.pinned else ""), f.value if f.value is not None else "(on)",
                             f.reason] for f in copy.serve.flags],
                           [max([28] + [len(f.name) for f in copy.serve.flags]), 44, 60]))  # a flag is never cut
        parts += ["", table(["memory plan", "size"], [list(r) for r in copy.serve.memory.rows()], [34, 20])]
        if instance is not None and instance != d.copies[-1][0]:
            parts.append("")
    reasons = [c.reason for c in d.choices] + [row[2] for row in group] + [f.reason for s in serves for f in s.flags] \
        + d.serve.notes + d.warnings + ([d.entry.line()] if d.entry else [])
    legend = _legend(d, reasons)
    if legend:
        parts += ["", "sources:"] + legend
    parts += [""] + [f"note: {n}" for n in d.serve.notes]
    parts += [f"WARNING: {w}" for w in d.warnings]
    return "\n".join(parts) + "\n"


def format_refusal(r: RefusedHost) -> str:
    head = f"== {r.host}: REFUSED (nothing will be run on this host)\n"
    if len(r.problems) == 1:
        return head + f"   cause: {r.cause}\n   fix:   {r.fix}\n"
    return head + "".join(f"   cause {n}: {cause}\n   fix {n}:   {fix}\n" for n, (cause, fix) in enumerate(r.problems, 1))


def format_operations(host: str, operations: list[tuple[str, bool, list[str]]], every: bool = True) -> str:
    """The operations queued for a host: name, whether it changes anything, the commands it would run;
    `every=False`: only those that change the host."""
    changing = [op for op in operations if op[1]]
    lines = [f"== {host}: {len(operations)} operation(s) planned, {len(changing)} would change the host"]
    for name, changes, commands in operations if every else changing:
        lines.append(f"   {'CHANGE' if changes else 'ok    '}  {name}")
        lines.extend(f"            $ {c}" for c in commands)
    return "\n".join(lines) + "\n"


def format_plan(d: Decision, notes: list[tuple[str, bool]], operations: list[tuple[str, bool, list[str]]],
                verbose: bool) -> str:
    """A host's plan block. With `verbose` (-v): every decision with its reason, every role note and
    every operation. Otherwise what changes: a host with changes gets the decision tables that
    explain them, the role notes and only the operations that change; a converged host its head,
    warnings and the notes that need a reader (`always`), then its operation count. A re-run of a
    converged fleet prints a few lines per host, not the whole plan each time."""
    changes = any(op[1] for op in operations)
    shown = [text for text, always in notes if verbose or changes or always]
    if verbose or changes:
        head = format_decision(d)
    else:
        head = _head(d) + "\n" + "".join(f"WARNING: {w}\n" for w in d.warnings)
    return (head + "".join(f"   {text}\n" for text in shown) + "\n"
            + format_operation_lines(d.host, operations, verbose, hidden="" if changes else ", the decision tables and notes"))


def format_operation_lines(host: str, operations: list[tuple[str, bool, list[str]]], verbose: bool,
                           hidden: str = "") -> str:
    """A host's operations: all of them with -v, else those that change and a count of the rest."""
    unchanged = sum(1 for op in operations if not op[1])
    tail = "" if verbose or not unchanged else (
        f"   ({unchanged} operation(s) with nothing to change{hidden}: pyinfra -v shows the whole plan)\n")
    return format_operations(host, operations, every=verbose) + tail
