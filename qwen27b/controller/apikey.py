"""The lab's API key when the inventory names none (issue 25: secure by default).

A host whose data has no `qwen27b_api_key_file` is deployed with the route guard and this key: one
key per inventory, made on the controller the first time (random, 0600 in a 0700 directory) and
reused on every later run, so clients keep working across deploys. It lives beside the inventory,
in `.qwen27b/api.key` (`QWEN27B_STATE_DIR` moves it: tests, a shared controller). Every backend of a
gateway then shares it, as the gateway requires. `qwen27b_api_key_file: none` is the explicit way
to serve an open API. The key is never printed: the plan names its file.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from qwen27b.plan.urlsecret import with_lab_key

STATE_ENV = "QWEN27B_STATE_DIR"
KEY_NAME = "api.key"


def state_dir(inventory_file: str | None) -> Path:
    """The controller's state beside the inventory: $QWEN27B_STATE_DIR, else `.qwen27b/` beside the
    inventory file (the working directory when the inventory is no file: `pyinfra host1,host2 ...`)."""
    base = os.environ.get(STATE_ENV)
    if not base:
        inventory = Path(inventory_file) if inventory_file else None
        base = (inventory.resolve().parent if inventory and inventory.is_file() else Path.cwd()) / ".qwen27b"
    return Path(base)


def key_file(inventory_file: str | None) -> Path:
    """Where the lab key is (state_dir)."""
    return state_dir(inventory_file) / KEY_NAME


def ensure(path: Path, text: str | None = None) -> bool:
    """Make the key file once (True), or leave the one there (False). O_EXCL: two runs at once make
    one key; O_NOFOLLOW: a symlink put there is not written through. `text`: the file's line (default
    a new lab key)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_levels(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(text or f"VLLM_API_KEY={new_key()}\n")
    return True


def private_levels(directory: Path) -> None:
    """Every level from the state dir down to `directory` 0700 (issue 51: mkdir's parents=True made
    the levels above the last one 0755, and a `.qwen27b/` made earlier kept its mode). Only inside a
    state dir (the first `.qwen27b` above, or $QWEN27B_STATE_DIR), only directories this user owns
    and no link: nothing outside it is ever touched."""
    top = os.environ.get(STATE_ENV)
    chain = [directory, *directory.parents]
    ends = [i for i, level in enumerate(chain) if level.name == ".qwen27b" or (top and level == Path(top))]
    if not ends:
        return
    for level in chain[:ends[0] + 1]:
        info = level.lstat()
        if level.is_symlink() or info.st_uid != os.geteuid():
            return
        if info.st_mode & 0o077:
            level.chmod(0o700)


def new_key() -> str:
    return f"sk-qwen27b-{secrets.token_urlsafe(32)}"


# the chat page's secrets on the controller (issue 29), one directory per gateway host: the page's own
# gateway key, the admin account's first password (the admin reads it here), Open WebUI's session secret
CHAT_PAGE_FILES = {"page_key": "page.key", "admin_password": "admin.password", "session_secret": "session.secret"}


def chat_page_dir(inventory_file: str | None, host: str) -> Path:
    return state_dir(inventory_file) / "chat-page" / re.sub(r"[^A-Za-z0-9._-]", "_", host)


def ensure_chat_page(directory: Path) -> list[str]:
    """Make whichever of the page's secret files is missing (each once, 0600); their names."""
    made = []
    for name, file_name in CHAT_PAGE_FILES.items():
        value = new_key() if name == "page_key" else secrets.token_urlsafe(24)
        if ensure(directory / file_name, value + "\n"):
            made.append(file_name)
    return made


VERIFY_FILE = "verify.key"  # a gateway's own key for the deploy's verify (never a client's)


def gateway_dir(inventory_file: str | None, host: str) -> Path:
    return state_dir(inventory_file) / "gateway" / re.sub(r"[^A-Za-z0-9._-]", "_", host)


def ensure_gateway_verify(directory: Path) -> tuple[Path, bool]:
    """The gateway's verify key (made once, 0600): (its file, whether it was made now)."""
    path = directory / VERIFY_FILE
    return path, ensure(path, new_key() + "\n")


def lab_data(data: dict, inventory_file: str | None) -> dict:
    """A host's data as a deploy reads it: with the lab key's file when it names none and the key
    exists (the operator tools read it, never make it)."""
    path = key_file(inventory_file)
    return with_lab_key(data, str(path)) if path.is_file() else data


def shown(path: Path) -> str:
    """The path as the plan prints it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def how_to_use(path: Path, made: bool) -> str:
    where = shown(path)
    return (f"API key: no qwen27b_api_key_file in the inventory, so the route guard uses the lab key in {where} "
            f"({'made now' if made else 'kept from an earlier run'}, 0600, reused on every run). Clients send "
            f"'Authorization: Bearer <key>' (e.g. curl -H \"Authorization: Bearer $(sed 's/^VLLM_API_KEY=//' {where})\"; "
            f"qwen27b bench --api-key-file {where}); set qwen27b_api_key_file: none to serve an open API")
