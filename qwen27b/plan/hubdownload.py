"""The download of a checkpoint from a hub on the host (qwen27b_model_source hub or modelscope): the
client's command at the pinned revision, the line a failed download ends with, and the manifest
written after it, which later runs verify against. Command text only (the weights role queues it);
cut from roles/weights.py (issue 50).
"""

from __future__ import annotations

import shlex

HUB_MANIFEST = "qwen27b-manifest.sha256"  # written after a hub download: what later runs verify


def hub_download_command(prefix: str, venv: str, entry: dict, target: str, token_path: str | None = None) -> str:
    """`hf download` of the pinned revision. With a token, the 0600 file is read into the download's
    environment and removed before it starts, whether the download then succeeds or not: the hub
    token is on the host's disk only between its upload and this command (docs/security.md); a run
    that downloads again puts it back."""
    download = (f"{prefix}HF_HUB_DISABLE_TELEMETRY=1 {venv}/bin/hf download {shlex.quote(entry['id'])} "
                f"--revision {shlex.quote(entry['revision'])} --local-dir {shlex.quote(target)}")
    if token_path is None:
        return download
    return f'HF_TOKEN="$(cat {token_path})" && rm -f {token_path} && export HF_TOKEN && {download}'


def modelscope_download_command(prefix: str, venv: str, entry: dict, target: str) -> str:
    """`modelscope download` of the pinned ModelScope revision (entry: its ModelScope id, stack.on_source);
    the client checks each file's sha256 against the hub's listing as it arrives."""
    return (f"{prefix}{venv}/bin/modelscope download {shlex.quote(entry['id'])} "
            f"--revision {shlex.quote(entry['revision'])} --local-dir {shlex.quote(target)}")


def failed_download(where: str, key: str, entry: dict) -> str:
    """What a failed download ends with: one line naming the source and the key that points it
    elsewhere (the run summary shows a failed operation's last line; the client's own error, a
    proxy's HTML page say, is above it). Shell-quoted: the URL is allow-listed, the text is ours."""
    line = (f"qwen27b: the download of {entry['id']}@{entry['revision']} from {where} failed (the error above says "
            f"why): check that the source is up and serves that revision, or point {key} (or qwen27b_model_source) "
            f"at one that does")
    return f"{{ echo {shlex.quote(line)} >&2; exit 1; }}"


def manifest_command(target: str) -> str:
    """Record what arrived: each file's sha256 into HUB_MANIFEST (written whole, then renamed)."""
    return (f"cd {shlex.quote(target)} && find . -maxdepth 1 -type f ! -name '.*' ! -name {HUB_MANIFEST} -printf '%f\\n' | "
            f"sort | xargs -r -d '\\n' sha256sum > {HUB_MANIFEST}.part && mv -f {HUB_MANIFEST}.part {HUB_MANIFEST}")
