"""The words every rendered file is built from: a value quoted for an ExecStart= line, an
EnvironmentFile= line, a unit's free text or an nginx regex; networks as nftables writes them; the
health unit's restart command; and the host's places as the templates name them (`layout`). Cut
from controller/render.py (issue 50).
"""

from __future__ import annotations

import ipaddress
import re

from qwen27b.plan.gate import Decision

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def nginx_regex_literal(value: str) -> str:
    """A key or an allow-listed e-mail as an exact nginx regex: `.` and `+` are the only regex
    characters their allow-lists admit (secretfile.SECRET_CHARS, plan/chatpage.EMAIL)."""
    return re.sub(r"([.+])", r"\\\1", value)


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: single-quoted when needed; % and $ escaped for systemd."""
    arg = str(arg).replace("%", "%%").replace("$", "$$")
    if _SAFE.match(arg):
        return arg
    return "'" + arg.replace("\\", "\\\\").replace("'", "\\'") + "'"


_ENV_SAFE = re.compile(r"^[A-Za-z0-9_.,:/@+=-]*$")


def env_value(value: str) -> str:
    """One value of an EnvironmentFile= line: as is when plain (every allow-listed value is), else
    double-quoted with systemd's backslash escapes, so it stays one value on one line."""
    value = str(value)
    if _ENV_SAFE.match(value):
        return value
    escaped = "".join("\\" + c if c in '"\\$`' else c for c in value)
    return f'"{escaped}"'


def unit_text(value: str) -> str:
    """Free text in a unit line (Description=): % escaped so systemd expands no specifier."""
    return str(value).replace("%", "%%")


def layout(decision: Decision, prefix: str = "") -> dict:
    """Host paths (prefix lets tests render into a scratch root)."""
    at = decision.stack.layout
    return {
        "root": prefix + at.root,
        "venv": prefix + at.current_venv,
        "state_dir": prefix + at.state,
        "cache_dir": prefix + at.cache,
        "config_dir": prefix + at.config,
        "env_file": prefix + at.env_file,
        "secrets_file": prefix + at.api_key_env_file,
        "health_status": prefix + at.health_status,
        "restart_request": prefix + at.restart_request,
    }


def restart_exec(request: str, unit: str) -> str:
    """The health unit's root ExecStopPost: restart the service only when the check left a request
    (rm(1) removes a symlink itself, never its target; no request, nothing happens)."""
    for value in (request, unit):
        if not _SAFE.match(value) or "%" in value:
            raise ValueError(f"not a plain path or unit name: {value!r}")
    return f"/bin/sh -c 'if rm {request} 2>/dev/null; then systemctl restart --no-block {unit}; fi'"


def nft_networks(networks: list | None) -> list[tuple[str, str]]:
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks or []]
    return [("ip" if n.version == 4 else "ip6", str(n)) for n in parsed]
