"""The one key-file format: deploy, qwen27b-health, bench and doctor all read keys with load_secret.

One line, either the bare key or NAME=key (VLLM_API_KEY for the API key, HF_TOKEN for a hub token),
the key made of RFC 6750 bearer-token characters. Anything else is refused, never guessed: an empty
key leaves the API open, a second line would add a variable to the service's environment."""

from __future__ import annotations

import errno
import os
import re
import stat

SECRET_CHARS = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]*$")  # how an environment variable is named


class SecretFileError(ValueError):
    """A key file that cannot be used; problem and fix never contain the file's contents."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}. Fix: {fix}")


def parse_secret(text: str, name: str = "VLLM_API_KEY") -> str:
    """The key in a key file's text: one line, ``KEY`` or ``NAME=KEY`` -> KEY; else SecretFileError."""
    fix = f"write one line: the bare key or {name}=KEY (e.g. `openssl rand -hex 32 > FILE`)"
    body = text.strip()
    if not body:
        raise SecretFileError("is empty (an empty key would leave the API open)", fix)
    if "\n" in body or "\r" in body:
        raise SecretFileError(f"has {len(body.splitlines())} lines; only one is read", fix)
    assignment = _ASSIGNMENT.match(body)
    if assignment and assignment.group(1) == name:
        body = assignment.group(2).strip()
        if not body:
            raise SecretFileError(f"has an empty {name}= (an empty key would leave the API open)", fix)
    elif assignment and (not SECRET_CHARS.match(body) or ENV_NAME.match(assignment.group(1))):
        # base64 padding ("abc==") is a key, not NAME=; OPENAI_API_KEY= (an env line, empty) is no key
        raise SecretFileError(f"sets {assignment.group(1)}, not {name}", fix)
    if not SECRET_CHARS.match(body):
        raise SecretFileError("the key holds characters other than A-Z a-z 0-9 . _ ~ + / - (and trailing =): "
                              "spaces, quotes or non-ASCII", fix)
    return body


MAX_BYTES = 65536  # a key is tens of bytes; a larger file is the wrong file


def load_secret(path: str, name: str = "VLLM_API_KEY") -> str:
    """parse_secret of the file at path. The file itself only: a symlink (it could lead to any 0600
    file), a FIFO or device (a reader would hang), a file over 64 KiB (it would be cut) and an
    unreadable one (missing, a directory, not ASCII) are SecretFileErrors."""
    path = os.path.expanduser(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise SecretFileError(f"{path} is a symlink", "point the key setting at the file itself") from None
        raise SecretFileError(f"cannot read {path}: {error.strerror}", "create it (chmod 600) or fix the path") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SecretFileError(f"{path} is not a regular file (a FIFO, device or directory)",
                              "point the key setting at the file holding the key")
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise SecretFileError(f"is larger than {MAX_BYTES // 1024} KiB: not a key file",
                              f"write one line: the bare key or {name}=KEY")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise SecretFileError("holds non-ASCII bytes", f"write one line: the bare key or {name}=KEY") from None
    return parse_secret(text, name)
