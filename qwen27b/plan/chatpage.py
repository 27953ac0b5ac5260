"""The chat page (issue 29): a web page for the lab's people who never touch curl, on a gateway host.

Open WebUI (stack tools.chat_page) runs on the gateway host's loopback; the gateway's nginx serves it
on `qwen27b_chat_page_port` of the gateway's address, with the gateway's TLS. The page sends every
request to the gateway (loopback) with a key of its own and the signed-in account's e-mail in
Open WebUI's X-OpenWebUI-User-Email header; nginx honours that header only with the page's key from
loopback, and counts the request under the gateway key `qwen27b_chat_page_accounts` maps the account
to: `qwen27b usage`, the request log and the key's limits treat a page user as any API client. An
account that is not mapped is refused by the gateway, naming the fix.

Pure: host data and the gateway's clients in, a ChatPage out (checked before any host is touched).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from qwen27b.plan.hostdata import PREFIX, BadHostData

DEFAULT_PORT = 8080
DEFAULT_ADMIN_EMAIL = "admin@qwen27b.lab"
HOUSEKEEPING = "chat-page"  # the name the page's requests without an account count under (its model list)
# an e-mail nginx's map and the page's env file take as they are: no quote, space, backslash or `$`
EMAIL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")
# where it lives on the gateway host (controller/chat_page_render.py lays out the rest; uninstall reads these)
USER = "qwen27b-chat"
# its unit: here rather than in onhost/contract.py, which is pushed to (and hashed on) every serving host
# while no on-host code reads this name
UNIT = "qwen27b-chat-page.service"
ROOT = "/opt/qwen27b-chat"  # its venv per version, uv, the pushed wheelhouse
CONFIG_DIR = "/etc/qwen27b-chat"  # its environment (a secret)
STATE_DIR = "/var/lib/qwen27b-chat"  # its users and chats (SQLite): kept by uninstall unless asked
KEYS = ("chat_page", "chat_page_port", "chat_page_admin_email", "chat_page_accounts")


@dataclass(frozen=True)
class ChatPage:
    port: int  # on the gateway's address (nginx; https when the gateway has TLS)
    admin_email: str  # the account the deploy makes (its password: a 0600 file on the controller)
    accounts: tuple[tuple[str, str], ...] = ()  # (e-mail, gateway key name), lower-case e-mails
    secrets_dir: str = ""  # the controller's files for it (controller/apikey.py; set by the gateway's preflight)

    def describe(self, version: str, scheme: str, address: str, internal_port: int, password_file: str) -> list[str]:
        shown = f"[{address}]" if ":" in address else address
        mapped = ", ".join(f"{email} -> {name}" for email, name in self.accounts) or "none yet"
        return [
            f"  chat page: Open WebUI {version} at {scheme}://{shown}:{self.port}/ (nginx in front"
            + (", the gateway's TLS" if scheme == "https" else "; plain HTTP like the gateway") + "; Open WebUI on "
            f"127.0.0.1:{internal_port}, its own venv and hardened unit, no address but loopback reachable from it)",
            f"  chat page sign-in: required, no sign-up; the deploy makes the admin {self.admin_email} (password in "
            f"{password_file} on the controller, 0600, never printed), who adds the lab's accounts in the page",
            f"  chat page accounts -> gateway keys (qwen27b_chat_page_accounts): {mapped}; their requests count under "
            "that key (usage, limits, the request log); an account not listed is refused by the gateway",
            "  chat page offline: telemetry, update checks, model downloads, web search and community sharing off; "
            "users and chats in a SQLite file under /var/lib/qwen27b-chat (kept across deploys; "
            "`qwen27b uninstall --chat-data` removes it)",
        ]


def plan_chat_page(host: str, data: dict, client_names: list[str], taken_ports: dict[int, str]) -> ChatPage | None:
    """The page a gateway host's data asks for (qwen27b_chat_page: true), or None. `taken_ports`:
    the gateway's own ports on that address (port -> what uses it)."""
    on = data.get(PREFIX + "chat_page")
    if on is not True:
        stray = [PREFIX + k for k in KEYS[1:] if data.get(PREFIX + k) is not None]
        if stray:
            raise BadHostData(host, stray[0], "is set but qwen27b_chat_page is not true",
                              "set qwen27b_chat_page: true, or remove the key")
        return None
    port = data.get(PREFIX + "chat_page_port", DEFAULT_PORT)
    if not 1 <= port <= 65535 or port in taken_ports:
        why = f"taken by {taken_ports[port]}" if port in taken_ports else "out of range"
        raise BadHostData(host, PREFIX + "chat_page_port", f"{port} is {why}",
                          f"use another TCP port (default {DEFAULT_PORT})")
    admin = data.get(PREFIX + "chat_page_admin_email", DEFAULT_ADMIN_EMAIL)
    _email(host, PREFIX + "chat_page_admin_email", admin)
    return ChatPage(port, admin.lower(), _accounts(host, data.get(PREFIX + "chat_page_accounts") or {}, client_names))


def _email(host: str, key: str, value) -> str:
    if not isinstance(value, str) or not EMAIL.fullmatch(value):
        raise BadHostData(host, key, f"{value!r} is not an e-mail address the page and nginx take as is",
                          "use name@domain.tld (letters, digits and . _ % + - only)")
    return value.lower()


def _accounts(host: str, accounts, client_names: list[str]) -> tuple[tuple[str, str], ...]:
    key = PREFIX + "chat_page_accounts"
    if not isinstance(accounts, dict):
        raise BadHostData(host, key, f"{accounts!r} is not a mapping", "give {'alice@lab.example': 'alice', ...}: "
                          "each page account's e-mail and the name of its gateway key")
    out: dict[str, str] = {}
    for email, name in accounts.items():
        email = _email(host, key, email)
        if email in out:
            raise BadHostData(host, key, f"{email} is listed twice (e-mails are not case-sensitive)", "list it once")
        if name not in client_names:
            near = difflib.get_close_matches(str(name), client_names, n=1)
            raise BadHostData(host, key, f"{email}: {name!r} is not the name of a key in qwen27b_gateway_key_files"
                              + (f" (did you mean {near[0]!r}?)" if near else ""),
                              "map each account to a named key: make its key file (`qwen27b key new "
                              "secrets/NAME.key`) and list it in qwen27b_gateway_key_files")
        out[email] = name
    return tuple(sorted(out.items()))
