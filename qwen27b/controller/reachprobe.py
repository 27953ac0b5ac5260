"""The reach probe's shared part (issue 30): from a host, a HEAD request to each source its plan
fetches from, through its proxy, one row per source. Two callers: `qwen27b reach` (tools/reach.py,
the URLs on the probe's stdin) and the gate on `--dry` (dry_reach, as a read-only fact). Here, in
the controller, so that a role never imports an operator tool (issue 50).

Any HTTP answer counts as reached (a mirror's base may answer 404), except a proxy's refusal (407)
or its failure to connect (502, 503, 504).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from qwen27b.controller import reachrecord
from qwen27b.controller.artifacts import python_builds
from qwen27b.controller.host_facts import ReachProbe
from qwen27b.plan.gate import Decision
from qwen27b.plan.installs import host_fetches
from qwen27b.plan.urlsecret import redact_url, url_has_password

PROXY_FAILED = (407, 502, 503, 504)


@dataclass
class Row:
    host: str
    source: str
    url: str  # redacted
    ok: bool | None  # None: not checked (the gate's --dry check sends no login: dry_reach)
    result: str
    fix: str


def probe_input(fetches, proxy: str | None, timeout: float) -> str:
    """The probe's standard input (credentials included: it never reaches a command line)."""
    return json.dumps({"proxy": proxy, "timeout": timeout, "urls": [[f.what, f.url] for f in fetches]})


def verdict(answer: dict | None) -> tuple[bool, str]:
    if answer is None:
        return False, "no answer (the probe stopped: timeout?)"
    if "error" in answer:
        return False, answer["error"]
    status = answer["status"]
    if status in PROXY_FAILED:
        return False, f"HTTP {status} (" + ("the proxy asks for a login" if status == 407 else "the proxy could not connect") + ")"
    return True, f"reached (HTTP {status})"


def rows_for(host: str, fetches, stdout: str, error: str | None = None) -> list[Row]:
    """One row per source from the probe's output (a host not reached: each row says why)."""
    answers = {}
    for line in stdout.splitlines():
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict) and "name" in answer:
            answers[answer["name"]] = answer
    rows = []
    for f in fetches:
        ok, result = (False, error) if error else verdict(answers.get(f.what))
        rows.append(Row(host, f.what, redact_url(f.url), ok, result, "" if ok else f.fix))
    return rows


def dry_reach_wanted(name: str) -> bool:
    """The reach check runs on every `--dry` (issue 30), but not for a @fake host (its answers are
    recordings, nothing is behind it); QWEN27B_DRY_REACH=1 forces it there (tests), =0 turns it off."""
    wanted = os.environ.get("QWEN27B_DRY_REACH")
    return wanted == "1" or (wanted != "0" and not name.startswith("@fake/"))


def dry_reach(on, decision: Decision) -> list:
    """`qwen27b reach` inside the gate on `--dry`: from the host, a HEAD request to each source its plan
    fetches from (installs.host_fetches), through its proxy, as a read-only fact (host_facts.ReachProbe),
    before anything is installed. A fact's command is argv: a URL or proxy with a login is not sent
    (its row says so: `qwen27b reach` sends them on stdin). Rows as rows_for makes them (ok
    None: not checked); the failures are recorded as `qwen27b reach` records them."""
    fetches, proxy = host_fetches(decision, python_builds()), decision.settings.http_proxy
    if proxy and url_has_password(proxy):
        why = "not checked: the proxy's login would reach the probe's command line; run `qwen27b reach`"
        return [Row(on.name, f.what, redact_url(f.url), None, why, "") for f in fetches]
    plain = [f for f in fetches if not url_has_password(f.url)]
    output = on.get_fact(ReachProbe, payload=probe_input(plain, proxy, DRY_REACH_TIMEOUT_S)) if plain else []
    answered = any(line.startswith("{") for line in output)
    error = None if answered or not plain else (output[-1][:200] if output else "the probe printed nothing")
    rows = {f.what: row for f, row in zip(plain, rows_for(on.name, plain, "\n".join(output), error))}
    out = [rows.get(f.what) or Row(on.name, f.what, redact_url(f.url), None, "not checked: its login would reach "
                                  "the probe's command line; run `qwen27b reach`", "") for f in fetches]
    reachrecord.save({on.name: [f.url for f in plain if rows[f.what].ok is False]})
    return out


DRY_REACH_TIMEOUT_S = 5.0  # per HEAD request, as `qwen27b reach`'s default
