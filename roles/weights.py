"""Model weights at a pinned revision, verified file by file, activated by an atomic symlink switch.

Sources (qwen27b_model_source): `controller` pushes a local checkpoint dir (hash-checked fan-out:
one copy on the controller, only missing/different files sent); `mirror` makes each host fetch
from a lab mirror with qwen27b-fetch (resumable, sha256-verified); `hub` downloads on the host
with huggingface_hub at the pinned revision (token from a 0600 file, never on a command line).
"""

from __future__ import annotations

import json
import urllib.request
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import files, server

from qwen27b.artifacts import cache_root, dir_manifest
from qwen27b.gate import Decision
from qwen27b.host_facts import FileHashes, Subdirectories, SymlinkTarget
from qwen27b.operations import push_files, symlink_switch

from ._common import needs_restart, note, remember_previous

FETCH_TOOL = Path(__file__).resolve().parent.parent / "qwen27b" / "fetch.py"
HUB_MANIFEST = "qwen27b-manifest.sha256"  # written after a hub download: what later runs verify


def safe_name(entry: dict) -> str:
    return f"{entry['id'].replace('/', '--')}@{entry['revision']}"


def model_dir(decision: Decision, entry: dict) -> str:
    return f"{decision.stack.paths['models']}/{safe_name(entry)}"


def _hub(decision: Decision, entry: dict, target: str):
    """Download on the host with huggingface_hub (in the release venv: vLLM depends on it), which
    resumes partial files; then record a manifest of what arrived, so later runs verify against it."""
    from .toolchain import release_venv
    have = host.get_fact(FileHashes, directory=target) or {}
    if HUB_MANIFEST in have:
        note(f"weights: {safe_name(entry)} present (recorded in {HUB_MANIFEST})")
        return None
    token_env = ""
    if decision.settings.hf_token_file:
        # hostdata already refused a token file readable by others, before any host was touched
        token_path = f"{decision.stack.paths['config']}/hf-token"
        files.put(name="Hugging Face token (0600, never on a command line)", src=decision.settings.hf_token_file,
                  dest=token_path, user="root", group="root", mode="0600")
        token_env = f'HF_TOKEN="$(cat {token_path})" '
    venv = release_venv(decision)
    return server.shell(name="download from the hub", commands=[
        f"{token_env}HF_HUB_DISABLE_TELEMETRY=1 {venv}/bin/hf download {entry['id']} --revision {entry['revision']} "
        f"--local-dir {target}",
        f"cd {target} && find . -maxdepth 1 -type f ! -name '.*' ! -name {HUB_MANIFEST} -printf '%f\\n' | sort | "
        f"xargs -r -d '\\n' sha256sum > {HUB_MANIFEST}.part && mv -f {HUB_MANIFEST}.part {HUB_MANIFEST}",
    ])


def _mirror_manifest(base: str) -> dict:
    # urllib, not httpx: this runs inside pyinfra's gevent-patched process
    try:
        with urllib.request.urlopen(f"{base}/manifest.json", timeout=30) as response:
            return json.loads(response.read())["files"]
    except (OSError, ValueError, KeyError) as error:
        raise OperationError(f"cannot read {base}/manifest.json: {error}") from None


def place(decision: Decision, entry: dict, link: str, local_dir: str | None) -> None:
    """Queue what puts `entry` at its versioned dir and points `link` at it."""
    settings, paths = decision.settings, decision.stack.paths
    source = settings.model_source or entry.get("default_source", "hub")
    target = model_dir(decision, entry)
    if source == "mirror":
        base = f"{settings.model_mirror.rstrip('/')}/{safe_name(entry)}"
        manifest = _mirror_manifest(base)
        have = host.get_fact(FileHashes, directory=target) or {}
        if all(have.get(name) == meta["sha256"] for name, meta in manifest.items()):
            note(f"weights: {safe_name(entry)} verified on the host")
        else:
            tool = f"{paths['bin']}/qwen27b-fetch"
            listing = f"{paths['host_cache']}/{safe_name(entry)}.manifest.json"
            files.put(name="qwen27b-fetch (resumable, verified downloads)", src=str(FETCH_TOOL), dest=tool, mode="0755")
            files.put(name="manifest of the checkpoint", src=StringIO(json.dumps({"files": manifest}, sort_keys=True)),
                      dest=listing, mode="0644")
            # qwen27b_http_proxy is for the mirror: no_proxy emptied so it applies even to a loopback mirror
            proxy = (f"http_proxy={settings.http_proxy} https_proxy={settings.http_proxy} no_proxy= NO_PROXY= "
                     if settings.http_proxy else "")
            needs_restart(server.shell(name="fetch the checkpoint from the mirror",
                         commands=[f"{proxy}python3 {tool} --base {base} --dest {target} --manifest {listing}"]))
    elif source == "hub":
        needs_restart(_hub(decision, entry, target))
    else:
        local = Path(local_dir or entry.get("local_dir") or "").expanduser()
        if not local.is_absolute():
            local = cache_root() / local
        if not (local / "config.json").is_file():
            raise OperationError(f"no checkpoint at {local} (config.json missing): set qwen27b_model_local_dir"
                                 + (" or run `python3 -m qwen27b.cpu_smoke model`" if entry.get("local_dir") else ""))
        needs_restart(push_files(name="push the checkpoint (verified by sha256)", src_dir=str(local), dest_dir=target,
                                 manifest=dir_manifest(local)))
    previous = host.get_fact(SymlinkTarget, path=link)
    if previous != target:
        remember_previous(link, previous)
    needs_restart(symlink_switch(name=f"switch {link.rsplit('/', 1)[-1]} symlink", link=link, target=target))
    _prune(decision, entry, target, previous)


def _prune(decision: Decision, entry: dict, target: str, previous: str | None) -> None:
    """Keep qwen27b_keep_model_revisions old revisions of this checkpoint besides the current one
    (the one being replaced counts first: it is the rollback target); remove the rest, oldest first."""
    models = decision.stack.paths["models"]
    prefix = entry["id"].replace("/", "--") + "@"
    revisions = [f"{models}/{name}" for name in host.get_fact(Subdirectories, path=models) or []
                 if name.startswith(prefix)]  # oldest first
    replaced = previous not in (None, target)
    spare = [path for path in revisions if path not in (target, previous)]
    quota = max(0, decision.settings.keep_model_revisions - (1 if replaced else 0))
    old = spare[: max(0, len(spare) - quota)]
    if old:
        server.shell(name="prune old model revisions", commands=[f"rm -rf {' '.join(old)}"])


def weights(decision: Decision) -> None:
    place(decision, decision.stack.model, decision.model_path, decision.settings.model_local_dir)
