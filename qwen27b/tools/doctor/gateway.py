"""doctor on a gateway host (the qwen27b_gateway group): it has no qwen27b.service, model or release
venv (the gateway role installs none), so the serving chain is not run there. Instead: its nginx (the
unit, and its API's port answering /health), its pool (the watcher's unit and its record: which
backends are in, drained, or failing open), its usage counters (:9121 on loopback, where nginx's Lua
module counts tokens) and its chat page (diagnose_symptom.chat_page_check).
"""

from __future__ import annotations

import ipaddress
import json
import shlex

from qwen27b.controller.gateway_render import LUA_MODULES, layout
from qwen27b.controller.remote import NOCMD, SUDO_PASSWORD_NEEDED
from qwen27b.onhost.contract import GATEWAY_UNIT, POOL_UNIT
from qwen27b.onhost.unit import parse_show, show_command
from qwen27b.plan.chatpage import UNIT as CHAT_PAGE_UNIT
from qwen27b.plan.gateway import DEFAULT_PORT, USAGE_PORT, listen_on
from qwen27b.plan.hostdata import PREFIX
from qwen27b.plan.addresses import lab_address

from .model import CHAT_PAGE_KEY, FAIL, INFO, OK, SHOW_PROPS, SKIP, WARN, Check, Report

NGINX_SHOW, POOL_SHOW, POOL_RECORD, LISTEN, USAGE = (
    "gateway-show.txt", "gateway-pool-show.txt", "gateway-pool.json", "gateway-listen.txt", "gateway-usage.txt")
PROPS = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "ActiveEnterTimestamp")
STALE_S = 30  # the watcher rewrites its record every round (1 s): older, it is not watching


def where(data: dict, reached: str | None = None) -> tuple[str, str, int]:
    """(scheme, address, port) of the gateway's API, as its plan has them (plan/gateway.py): each
    value re-printed by ipaddress / int before it reaches the shell; loopback when unknown."""
    port = data.get(PREFIX + "gateway_port", DEFAULT_PORT)
    port = port if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 else DEFAULT_PORT
    address = "127.0.0.1"
    for candidate in (data.get(PREFIX + "gateway_bind_address"), lab_address(data), reached):
        try:
            address = str(ipaddress.ip_address(candidate))
            break
        except (TypeError, ValueError):
            continue
    tls = any(data.get(PREFIX + k) for k in ("gateway_tls_cert", "gateway_tls_lab_ca"))
    return ("https" if tls else "http"), address, port


def chat_page_command(stack: dict) -> str:
    """The chat page on a gateway host (qwen27b_chat_page): its unit's state, Open WebUI's own /health
    on loopback, and its journal's last lines; nothing when the unit is not there."""
    port = int(stack["tools"]["chat_page"]["listen_port"])
    return (f"{show_command(CHAT_PAGE_UNIT, SHOW_PROPS)} 2>/dev/null; "
            f"printf 'Health=%s\\n' \"$(curl --noproxy '*' -s -o /dev/null -m 5 -w '%{{http_code}}' http://127.0.0.1:{port}/health)\"; "
            f"journalctl -u {CHAT_PAGE_UNIT} -n 5 --no-pager -a -q -o cat 2>/dev/null | sed 's/^/Journal=/'; true")


def commands(stack: dict, data: dict, reached: str | None = None) -> dict[str, str]:
    """The gateway's reads (read-only, each bounded in time). /health is probed on the host itself
    with -k (whether nginx answers, not whom it proves to be; no key is sent)."""
    scheme, address, port = where(data, reached)
    pool_file = shlex.quote(layout()["pool_file"])
    url = shlex.quote(f"{scheme}://{listen_on(address, port)}/health")
    return {
        NGINX_SHOW: show_command(GATEWAY_UNIT, PROPS),
        POOL_SHOW: show_command(POOL_UNIT, PROPS),
        POOL_RECORD: (f"printf 'age=%s\\n' \"$(( $(date +%s) - $(stat -c %Y {pool_file} 2>/dev/null || echo 0) ))\"; "
                      f"head -c 200000 {pool_file}"),
        LISTEN: f"curl --noproxy '*' -s -k -g -o /dev/null -m 5 -w '%{{http_code}}' {url}; true",
        USAGE: (f"if [ -e {shlex.quote(LUA_MODULES[-1])} ]; then echo lua=yes; else echo lua=no; fi; "
                f"b=$(curl --noproxy '*' -s -m 5 -w '\\ncode=%{{http_code}}' http://127.0.0.1:{USAGE_PORT}/metrics); "
                "printf 'series=%s\\n' \"$(printf '%s\\n' \"$b\" | grep -c '^qwen27b_gateway_')\"; "
                "printf '%s\\n' \"$b\" | tail -n 1; true"),
        CHAT_PAGE_KEY: chat_page_command(stack),
    }


def _unit(snap, key: str) -> dict:
    text = snap.text(key) or ""
    return parse_show(text) if text.strip() != NOCMD else {}


def _pairs(text: str | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)


def _nginx(snap) -> list[Check]:
    u = _unit(snap, NGINX_SHOW)
    state = f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}"
    if u.get("LoadState") != "loaded":
        return [Check(1, "gateway: nginx", FAIL, f"{GATEWAY_UNIT} is not installed (LoadState {u.get('LoadState', 'unknown')})",
                      "run the deploy for this gateway host: pyinfra INVENTORY deploy.py --limit HOST -y")]
    if u.get("ActiveState") != "active":
        return [Check(1, "gateway: nginx", FAIL, f"{state}, {u.get('NRestarts', '0')} restart(s), result {u.get('Result', '?')}",
                      f"read `journalctl -u {GATEWAY_UNIT} -n 100` (nginx names the config line it refuses)")]
    scheme, address, port = where(snap.data, snap.reached)
    code = (snap.text(LISTEN) or "").strip()
    at = f"{scheme}://{listen_on(address, port)}/health"
    if code == "200":
        return [Check(1, "gateway: nginx", OK, f"{state}; {at} answers 200 (a backend answered through it)")]
    if code in ("", "000"):
        return [Check(1, "gateway: nginx", FAIL, f"{state}, but nothing answers at {at} (000: no connection)",
                      f"check qwen27b_gateway_bind_address / _port against `journalctl -u {GATEWAY_UNIT}`")]
    return [Check(1, "gateway: nginx", WARN, f"{state}; {at} answers {code}: no backend answered /health through it",
                  "see the pool check: every backend is out, drained or down")]


def _pool(snap) -> list[Check]:
    u = _unit(snap, POOL_SHOW)
    if u.get("ActiveState") != "active":
        return [Check(1, "gateway: pool", FAIL, f"{POOL_UNIT} is {u.get('ActiveState', 'not installed')}"
                      f"/{u.get('SubState', '?')}: nobody takes a failing backend out of nginx's pool",
                      f"read `journalctl -u {POOL_UNIT} -n 100`; `systemctl restart {POOL_UNIT}`")]
    text = snap.ok_text(POOL_RECORD) or ""
    age = _pairs(text.split("\n", 1)[0]).get("age", "")
    try:
        record = json.loads(text.split("\n", 1)[1]) if "\n" in text else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("pool"), list):
        return [Check(1, "gateway: pool", FAIL, f"the watcher's record {layout()['pool_file']} is missing or unreadable",
                      f"read `journalctl -u {POOL_UNIT} -n 100`")]
    pool, drained = [str(p) for p in record["pool"]], [str(d) for d in record.get("drained") or []]
    said = f"in the pool: {', '.join(pool) or 'none'}" + (f"; drained: {', '.join(drained)}" if drained else "")
    if age.isdigit() and int(age) > STALE_S:
        return [Check(1, "gateway: pool", FAIL, f"the watcher's record is {age} s old ({said}): it is not watching",
                      f"read `journalctl -u {POOL_UNIT} -n 100`; `systemctl restart {POOL_UNIT}`")]
    if record.get("failed_open") or not pool:
        return [Check(1, "gateway: pool", FAIL, f"no backend is healthy ({said}"
                      + ("; failing open: nginx tries every backend" if record.get("failed_open") else "") + ")",
                      "run `qwen27b doctor INVENTORY` for the backends: their own chain names the cause")]
    return [Check(1, "gateway: pool", WARN if drained else OK, said,
                  "`qwen27b gateway undrain INVENTORY NAME` when its work is done" if drained else "")]


def _usage(snap) -> list[Check]:
    got = _pairs(snap.text(USAGE))
    if not got:
        return [Check(1, "gateway: usage counters", SKIP, "not read")]
    if got.get("lua") != "yes":
        return [Check(1, "gateway: usage counters", INFO, "this OS's nginx has no Lua module: tokens are not counted "
                      "(requests, limits and the request log still work)")]
    series = got.get("series", "0")
    if got.get("code") == "200" and series.isdigit() and int(series) > 0:
        return [Check(1, "gateway: usage counters", OK, f"127.0.0.1:{USAGE_PORT}/metrics answers ({series} series)")]
    return [Check(1, "gateway: usage counters", FAIL, f"127.0.0.1:{USAGE_PORT}/metrics answers {got.get('code', '?')} "
                  f"with {series} qwen27b_gateway_ series (000: not listening)",
                  f"re-run the deploy for this gateway host; read `journalctl -u {GATEWAY_UNIT} -n 100`")]


def report(snap) -> Report:
    """A gateway host's checks (step 1: the symptom; no serving chain)."""
    from .diagnose_symptom import chat_page_check  # noqa: PLC0415 (it imports context; keep this module light)

    if snap.error:
        sudo_cause, sudo_fix = SUDO_PASSWORD_NEEDED
        return Report(snap.host, [Check(1, "host reachable", FAIL, snap.error, sudo_fix if snap.error.startswith(sudo_cause)
                                        else "check the inventory's ssh_hostname / ssh_user / ssh_key and that sshd runs")],
                      {"state": "unreachable", "summary": snap.error}, unit=GATEWAY_UNIT)

    class _Ctx:  # what chat_page_check reads
        pass

    _Ctx.snap = snap
    checks = _nginx(snap) + _pool(snap) + _usage(snap) + chat_page_check(_Ctx)
    failing = [c for c in checks if c.verdict == FAIL]
    summary = "gateway serving" if not failing else f"gateway: {failing[0].check} fails"
    return Report(snap.host, checks, {"state": "gateway", "summary": summary}, unit=GATEWAY_UNIT)
