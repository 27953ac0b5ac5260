"""The one key-file format: deploy, qwen27b-health, bench and doctor all read keys with load_secret.

One line, either the bare key or NAME=key (VLLM_API_KEY for the API key, HF_TOKEN for a hub token),
the key made of RFC 6750 bearer-token characters. Anything else is refused, never guessed: an empty
key leaves the API open, a second line would add a variable to the service's environment."""

from __future__ import annotations

import os
import re

SECRET_CHARS = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


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
    elif assignment and not SECRET_CHARS.match(body):  # base64 padding ("abc==") is a key, not NAME=
        raise SecretFileError(f"sets {assignment.group(1)}, not {name}", fix)
    if not SECRET_CHARS.match(body):
        raise SecretFileError("the key holds characters other than A-Z a-z 0-9 . _ ~ + / - (and trailing =): "
                              "spaces, quotes or non-ASCII", fix)
    return body


def load_secret(path: str, name: str = "VLLM_API_KEY") -> str:
    """parse_secret of the file at path; an unreadable file (missing, a directory, not UTF-8) is a
    SecretFileError too."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            raw = fh.read(65536)
    except OSError as error:
        raise SecretFileError(f"cannot read {path}: {error.strerror}", "create it (chmod 600) or fix the path") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise SecretFileError("holds non-ASCII bytes", f"write one line: the bare key or {name}=KEY") from None
    return parse_secret(text, name)
