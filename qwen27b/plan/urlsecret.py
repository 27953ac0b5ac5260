"""URL and secret checks (issue 50 item 3, cut from hostdata.py): which keys are URLs and what they
may hold (plain URL characters, no login where it would reach argv, an apt mirror that fits a
sources line), a URL or command line as it may be shown (redact_url, shown_argv), the flags that
would put a secret on a command line, and the key files' checks (0600, one key, never echoed)."""

from __future__ import annotations

import os
import re
import stat
import urllib.parse

from qwen27b.onhost.secretfile import SecretFileError, load_secret
from qwen27b.plan.settings import PREFIX, BadHostData


# Secrets never go on a command line (ps, systemctl status, the 0644 unit): any flag named like one.
# (a name ending in the word: --return-tokens-as-token-ids is a real, harmless vLLM flag)
SECRET_FLAG = re.compile(r"^--(?:.*-)?(?:api-key|token|password|passwd|secret)$")


SECRET_FLAG_FIX = ("put the API key in a 0600 file and set qwen27b_api_key_file, the hub token in a 0600 file and "
                   "qwen27b_hf_token_file (a flag shows in ps, systemctl status and the 0644 unit)")


# URLs are pasted into shell commands and env files on the host: plain URL characters only.
URL_KEYS = {"python_mirror": ("http", "https", "file"), "wheel_mirror": ("http", "https", "file"),
            "model_mirror": ("http", "https", "file"), "http_proxy": ("http", "https", "socks5", "socks5h"),
            "release_mirror": ("http", "https"), "hf_endpoint": ("http", "https"),
            "modelscope_endpoint": ("http", "https"), "pypi_index": ("http", "https"),
            "torch_index": ("http", "https"), "apt_mirror": ("http", "https")}


# Keys whose URL reaches argv as part of a longer URL (the engine wheel's, the hub's file URLs built by
# huggingface_hub): a login there would show in `ps`, so these take none (a lab's own mirror needs none;
# a proxy's login goes in qwen27b_http_proxy, kept in a root-only file)
NO_LOGIN_URL_KEYS = ("release_mirror", "hf_endpoint", "modelscope_endpoint")


URL_CHARS = re.compile(r"^[A-Za-z0-9._~:/?#\[\]@%+,=-]+$")


def _check_url(host: str, key: str, url: str, schemes: tuple[str, ...]) -> None:
    try:
        parts = urllib.parse.urlsplit(url) if URL_CHARS.match(url) else None
    except ValueError:  # urlsplit's own refusal ('Invalid IPv6 URL' for a lone '[' in the host part)
        parts = None
    example = "http://proxy.lab:3128" if key.endswith("proxy") else "http://mirror.lab:8080/path"
    if parts is None or parts.scheme not in schemes or not (parts.netloc or (parts.scheme == "file" and parts.path)):
        raise BadHostData(host, key, f"{url!r} is not a {'/'.join(schemes)} URL of plain URL characters",
                          f"write it as {example} (percent-encode spaces and shell characters)")


SECRET_NAMES = {"api_key_file": "VLLM_API_KEY", "hf_token_file": "HF_TOKEN",
                "gateway_key_files": "OPENAI_API_KEY"}  # a client's key file may be its env line  # NAME=KEY accepted in each file


def check_secret_file(host: str, key: str, path: str, secret_name: str | None = None) -> None:
    """A key or token file the controller reads must be private to its owner and hold one key in
    the one format (qwen27b.onhost.secretfile); the message never holds the file's contents."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError as error:
        raise BadHostData(host, key, f"cannot read {path}: {error.strerror}", "create it (chmod 600) or fix the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadHostData(host, key, f"{path} is a directory or special file, not a key file",
                          "point it at the file holding the key (chmod 600)")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise BadHostData(host, key, f"{path} is mode {mode:o}, readable by others", f"chmod 600 {path}")
    try:
        load_secret(path, secret_name or SECRET_NAMES[key[len(PREFIX):]])
    except SecretFileError as error:
        raise BadHostData(host, key, f"{path} {error.problem}", error.fix) from None


def with_lab_key(data: dict, key_file: str) -> dict:
    """The host's data with the lab key's file (controller/apikey.py) where it names no key file."""
    return data if PREFIX + "api_key_file" in data else {**data, PREFIX + "api_key_file": key_file}


def _check_apt_mirror(host: str, url: str) -> None:
    """qwen27b_apt_mirror is written into an apt sources line (`deb URL SUITE COMPONENTS`), where `#`
    starts a comment and `[` options: a base URL of a path only. Its login, if any, goes into an
    apt_auth.conf file (0600), never the sources line."""
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or "?" in url or "#" in url or "[" in url or "]" in url:
        raise BadHostData(host, PREFIX + "apt_mirror", f"{redact_url(url)} has a query, fragment or brackets, which an "
                          "apt sources line cannot hold", "give the mirror's base URL only, e.g. http://mirror.lab/")
    if not parts.hostname:
        raise BadHostData(host, PREFIX + "apt_mirror", f"{redact_url(url)} names no host",
                          "give the mirror's base URL, e.g. http://mirror.lab/ (serving ubuntu/ and compute/cuda/repos/)")


def redact_url(url: str) -> str:
    """The URL as it may be shown (plans, reports, errors): http://user:***@host. Userinfo without
    a ':' is a token used as the user name: all of it becomes ***."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    shown = f"{userinfo.split(':', 1)[0]}:***" if ":" in userinfo else "***"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{shown}@{hostport}"))


# pyinfra's own flags that take a password, and `--data` keys that hold one (ssh_password,
# _sudo_password, ssh_key_password): a key naming a file (`*_file`) holds a path, shown as it is
PASSWORD_FLAGS = ("--password", "--ssh-password", "--key-password", "--ssh-key-password")


SECRET_DATA_KEY = re.compile(r"(?i)(password|passwd|secret|token)(?!.*_files?$)")


URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s'\"]*)@")


def shown_argv(argv: list[str]) -> list[str]:
    """A command line as it may be printed (the run summary's re-run line, `qwen27b rollout`): a
    password given to pyinfra's flags or as `--data KEY=VALUE` becomes ***, as do the passwords of
    URLs anywhere in it (redact_url's rule, as the plans show them)."""
    out, after = [], None
    for arg in argv:
        if after in PASSWORD_FLAGS:
            arg = "***"
        elif any(arg.startswith(flag + "=") for flag in PASSWORD_FLAGS):
            arg = arg.split("=", 1)[0] + "=***"
        else:
            data = arg.removeprefix("--data=") if arg.startswith("--data=") else arg if after == "--data" else None
            key = data.split("=", 1)[0] if data is not None and "=" in data else ""
            if key and SECRET_DATA_KEY.search(key):
                arg = arg[:len(arg) - len(data)] + key + "=***"
            arg = URL_USERINFO.sub(lambda m: m[1] + (m[2].split(":", 1)[0] + ":***" if ":" in m[2] else "***") + "@",
                                   arg)
        out.append(arg)
        after = arg if arg.startswith("--") and "=" not in arg else None
    return out


def url_has_password(url: str) -> bool:
    return "@" in urllib.parse.urlsplit(url).netloc
