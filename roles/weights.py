"""Model weights at a pinned revision, verified file by file, activated by an atomic symlink switch.

Sources (qwen27b_model_source): `controller` pushes a local checkpoint dir (hash-checked fan-out:
one copy on the controller, only missing/different files sent); `mirror` makes each host fetch
from a lab mirror with qwen27b-fetch (resumable, sha256-verified); `hub` downloads on the host
with huggingface_hub at the pinned revision (token from a 0600 file, never on a command line).

Fan-out (qwen27b_weights_fanout "tree", mirror source): the hosts of the run that share the mirror
form a group; one of them fetches from the mirror, then hosts holding a verified copy seed the rest
in waves, one operation per wave (qwen27b/plan/fanout.py plans it; its docstring says how). The run-wide
part (the mirror's manifest, the run's token, the group's plan, seeds outside --limit) is
qwen27b/controller/weightsfanout.py; the hub's download command qwen27b/plan/hubdownload.py.

Pins (stack key models[].files, qwen27b/plan/filepins.py): a mirror's manifest or a local dir that lists
a pinned file otherwise stops the host before anything is fetched; after the files arrive by any route,
qwen27b_onhost.pincheck checks every pinned file on the host before the link switches.
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import File
from pyinfra.operations import files, python, server

from qwen27b.plan import fanout, filepins, sources
from qwen27b.controller import factcache, progress
from qwen27b.controller.artifacts import cache_root, dir_manifest
from qwen27b.plan.gate import Decision, RefusedHost
from qwen27b.plan.urlsecret import redact_url
from qwen27b.controller.host_facts import HASH_CACHE, FileHashes, Subdirectories, SymlinkTarget
from qwen27b.onhost.contract import lib_dir, module_argv, module_command
from qwen27b.onhost.secretfile import load_secret
from qwen27b.controller.operations import push_files, secret_file, staging_candidates, symlink_switch
from qwen27b.controller import weightsfanout as W
from qwen27b.plan.checkpoint import load_shape
from qwen27b.plan.hubdownload import (HUB_MANIFEST, failed_download, hub_download_command, manifest_command,
                                      modelscope_download_command)
from qwen27b.plan.stack import checkpoint_metadata_dir, revision_dir_name

from ._common import model_dir, release_venv
from ._common import fetch_prefix, needs_restart, note, prune_dirs, remember_previous, url_word


def safe_name(entry: dict) -> str:
    return revision_dir_name(entry)


def _download(decision: Decision, entry: dict, target: str, source: str):
    """Download on the host with the hub's own client (`hf` from vLLM's huggingface_hub, or the
    `modelscope` CLI the vllm role adds for that source), which resumes partial files; then record a
    manifest of what arrived, so later runs verify against it."""
    # a stat, not FileHashes: hashing 20 GiB of weights would cost every no-op run a minute
    if host.get_fact(File, path=f"{target}/{HUB_MANIFEST}"):
        note(f"weights: {safe_name(entry)} present (recorded in {HUB_MANIFEST})")
        return None
    venv, prefix = release_venv(decision), fetch_prefix(decision)
    if source == "modelscope":
        # MODELSCOPE_ENDPOINT: ModelScope or a mirror of it (hostdata refused one with a login: the client logs URLs)
        base = sources.modelscope_base(decision.settings, decision.stack.fetch_sources)
        note(f"weights: {entry['id']}@{entry['revision']} from ModelScope {base}"
             + (" (qwen27b_modelscope_endpoint)" if decision.settings.modelscope_endpoint else ""))
        command = modelscope_download_command(f"{prefix}MODELSCOPE_ENDPOINT={shlex.quote(base)} ", venv, entry, target)
        where, key = f"ModelScope at {base}", "qwen27b_modelscope_endpoint"
    else:
        token_path = None
        if decision.settings.hf_token_file:
            # hostdata already refused a token file readable by others, before any host was touched
            token_path = decision.stack.layout.hub_token_file
            secret_file(name="Hugging Face token (0600, removed as the download starts)", dest=token_path,
                        content=load_secret(decision.settings.hf_token_file, "HF_TOKEN") + "\n")
        # HF_ENDPOINT: a Hugging Face mirror the lab reaches (hostdata refused one with a login: huggingface_hub
        # builds every file's URL from it and logs them)
        endpoint = decision.settings.hf_endpoint
        prefix += f"HF_ENDPOINT={shlex.quote(endpoint.rstrip('/'))} " if endpoint else ""
        if endpoint:
            note(f"weights: {entry['id']}@{entry['revision']} from the hub mirror {endpoint} (qwen27b_hf_endpoint)")
        command = hub_download_command(prefix, venv, entry, target, token_path)
        where, key = f"the hub at {sources.hub_base(decision.settings, decision.stack.fetch_sources).rstrip('/')}", "qwen27b_hf_endpoint"
    command += " || " + failed_download(where, key, entry)
    manifest = manifest_command(target)
    # two call sites: pyinfra orders operations by where they are called, so one shared call site
    # would make the two sources one operation across the hosts of a run
    if source == "modelscope":
        return server.shell(name="download from ModelScope", commands=[command, manifest])
    return server.shell(name="download from the hub", commands=[command, manifest])


def _refused(other) -> bool:
    """Whether the gate refused `other`, a host of the run (the fan-out leaves it out of the group)."""
    from .preflight import gate  # noqa: PLC0415 (roles import each other lazily)
    return isinstance(gate(other), RefusedHost)


def _fetch_setup(decision: Decision, entry: dict, manifest: dict) -> tuple[str, str]:
    """Push the manifest; returns (the qwen27b-fetch command, the manifest's path on the host). The
    fetch is qwen27b_onhost.fetch, shipped with the rest of the package by the vllm role."""
    listing = decision.stack.layout.mirror_manifest(safe_name(entry))
    files.put(name="manifest of the checkpoint", src=StringIO(json.dumps({"files": manifest}, sort_keys=True)),
              dest=listing, mode="0644")
    return module_command(release_venv(decision), "fetch"), listing


def _mirror_base(decision: Decision, entry: dict) -> str:
    """qwen27b-fetch's --base: the mirror URL, or, when it carries a password, '$QWEN27B_MODEL_MIRROR/...'
    single-quoted so the shell leaves it to qwen27b-fetch to expand (never in its argv)."""
    settings = decision.settings
    word = url_word(settings, "model_mirror")
    if word == settings.model_mirror:
        return shlex.quote(f"{settings.model_mirror.rstrip('/')}/{safe_name(entry)}")
    return f"'{word.strip(chr(34))}/{safe_name(entry)}'"


def _fan_out(decision: Decision, entry: dict, target: str, base: str, manifest: dict, plan: fanout.FanoutPlan) -> None:
    """This host's part of the fan-out: one operation per wave (empty in the waves where it neither
    receives nor starts seeding, so every host's operations line up wave by wave), then the seed
    server stopped and the run's token removed. A host holding a verified copy that seeds nobody
    gets no operation; one that only talks to the mirror gets no token."""
    name = host.name
    copy, start = plan.copy_for(name), plan.seed_start_wave(name)
    outside = [m for m in plan.outside_seeds() if any(c.host == name for c in plan.seeds(m.name))]
    if copy is None:
        note(f"weights: {safe_name(entry)} verified on the host"
             + (f"; seeds {', '.join(c.host for c in plan.seeds(name))} (fan-out)" if start is not None else ""))
        if start is None:
            return
    else:
        source = "the mirror" if copy.from_mirror else f"{copy.source} (seed; the mirror if it fails)"
        note(f"weights: fan-out wave {copy.wave} from {source}"
             + (f"; then seeds {', '.join(c.host for c in plan.seeds(name))}" if start is not None else ""))
    paths, at = decision.stack.paths, decision.stack.layout
    user = at.service_user
    token_file = at.seed_token_file
    fetch = None
    from_seed = copy is not None and not copy.from_mirror
    if start is not None or from_seed:
        # root:root /etc/qwen27b, the file the service user's (the seed runs as it; the fetch as root)
        secret_file(name="fan-out token (0600, this run only)", dest=token_file, content=W.run_token() + "\n",
                    user=user, group=user)
    if copy is not None:
        tool, listing = _fetch_setup(decision, entry, manifest)
        fetch = fanout.fetch_command(f"{tool} --dest {target} --manifest {listing}", copy,
                                     _mirror_base(decision, entry), safe_name(entry), plan.port,
                                     fetch_prefix(decision),
                                     token_file if from_seed else None)
    venv = release_venv(decision)
    total = sum(int(meta["size"]) for meta in manifest.values())
    if outside:
        python.call(name=f"weights fan-out of {safe_name(entry)}: start the seed server on "
                         f"{', '.join(m.name for m in outside)} (outside --limit)",
                    function=W.outside_seed_servers, plan=plan, seeds=outside, target=target, paths=paths, total=total)
    for wave in host.loop(range(plan.waves)):
        commands = []
        if copy is not None and copy.wave == wave:
            commands.append(fetch)
        if start == wave:
            address = next(m.address for m in plan.members if m.name == name)
            commands += fanout.seed_start_commands(
                module_argv(venv, "mirror"), target, address, fanout.seed_peers(plan, name), token_file, user,
                fanout.seed_max_s(plan, name, total), W.hidden_from_seed(paths, target), plan.port, lib_dir(venv))
        op = server.shell(name=f"weights fan-out wave {wave} of {safe_name(entry)}", commands=commands)
        if copy is not None and copy.wave == wave:
            needs_restart(op)
            progress.watch(op, host, "weights", [target], W.manifest_bytes(manifest))
    if outside:
        python.call(name=f"weights fan-out of {safe_name(entry)}: stop the seed server on "
                         f"{', '.join(m.name for m in outside)} (outside --limit)",
                    function=W.outside_seed_servers, plan=plan, seeds=outside, target=target, paths=paths, total=total,
                    stop=True)
    if start is not None:
        server.shell(name=f"weights fan-out of {safe_name(entry)}: stop the seed server",
                     commands=[fanout.seed_stop_command(token_file)])
    elif from_seed:
        server.shell(name=f"weights fan-out of {safe_name(entry)}: remove the run's token",
                     commands=[f"rm -f {token_file}"])


def place(decision: Decision, entry: dict, link: str, local_dir: str | None) -> None:
    """Queue what puts `entry` at its versioned dir and points `link` at it."""
    settings = decision.settings
    source = sources.model_source(entry, settings)
    target = model_dir(decision, entry)
    on_host = ((File, {"path": f"{target}/{HUB_MANIFEST}"}) if source in ("hub", "modelscope")
               else (FileHashes, {"directory": target}))
    factcache.prefetch([on_host, (SymlinkTarget, {"path": link}), (Subdirectories, {"path": decision.stack.layout.models})])
    arriving = True  # whether this run may put new bytes in target (then they are checked before the switch)
    if source == "mirror":
        base = f"{settings.model_mirror.rstrip('/')}/{safe_name(entry)}"
        manifest = W.mirror_manifest(base)
        if problem := filepins.source_problems(f"the mirror's {redact_url(base)}/manifest.json", entry, manifest):
            raise OperationError(problem)  # before any byte is fetched into the model dir (maybe the serving one)
        have = host.get_fact(FileHashes, directory=target) or {}
        arriving = not W.verified(have, manifest)
        plan = W.fanout_plan(decision, entry, target, base, manifest, _refused)
        if plan is not None:
            _fan_out(decision, entry, target, base, manifest, plan)
        elif W.verified(have, manifest):
            note(f"weights: {safe_name(entry)} verified on the host")
        else:
            tool, listing = _fetch_setup(decision, entry, manifest)
            fetch = server.shell(name="fetch the checkpoint from the mirror",
                                 commands=[f"{fetch_prefix(decision)}{tool} "
                                           f"--base {_mirror_base(decision, entry)} --dest {shlex.quote(target)} --manifest {listing}"])
            needs_restart(fetch)
            progress.watch(fetch, host, "weights", [target], W.manifest_bytes(manifest))
    elif source in ("hub", "modelscope"):
        download = _download(decision, entry, target, source)
        arriving = download is not None
        needs_restart(download)
        progress.watch(download, host, "weights", [target], load_shape(checkpoint_metadata_dir(entry)).weight_bytes)
    else:
        local = Path(local_dir or entry.get("local_dir") or "").expanduser()
        if not local.is_absolute():
            local = cache_root() / local
        if not (local / "config.json").is_file():
            raise OperationError(f"no checkpoint at {local} (config.json missing): set qwen27b_model_local_dir"
                                 + (" or run `python3 -m qwen27b.tools.cpu_smoke model`" if entry.get("local_dir") else ""))
        local_manifest = dir_manifest(local)
        if problem := filepins.source_problems(f"the controller dir {local}", entry,
                                               {n: {"sha256": h} for n, h in local_manifest.items()}):
            raise OperationError(problem)
        present = host.get_fact(FileHashes, directory=target) or {}
        arriving = any(present.get(name) != digest for name, digest in local_manifest.items())
        push = push_files(name="push the checkpoint (verified by sha256)", src_dir=str(local), dest_dir=target,
                          manifest=local_manifest)
        needs_restart(push)
        # the files arrive in a staging dir first under sudo (push_files): counted there too
        progress.watch(push, host, "weights", [target, *staging_candidates(target)],
                       sum(p.stat().st_size for p in local.iterdir() if p.is_file()))
    previous = host.get_fact(SymlinkTarget, path=link)
    if filepins.pins(entry) and (arriving or previous != target):
        # what arrived (by any route, a peer's fan-out included) against the stack's pins, before the switch
        listing = decision.stack.layout.pins_file(safe_name(entry))
        files.put(name="pinned sha256 of the checkpoint files", src=StringIO(filepins.pins_json(entry)), dest=listing,
                  mode="0644")
        route = filepins.route_words(source, redact_url(settings.model_mirror or ""), f"{target}/{HUB_MANIFEST}")
        server.shell(name="check the checkpoint files against their pinned sha256", commands=[filepins.check_command(
            module_command(release_venv(decision), "pincheck"), target, listing, route, HASH_CACHE, HUB_MANIFEST)])
    if previous != target:
        remember_previous(link, previous)
    needs_restart(symlink_switch(name=f"switch {link.rsplit('/', 1)[-1]} symlink", link=link, target=target),
                  "the model link")
    _prune(decision, entry, target, previous)


def _prune(decision: Decision, entry: dict, target: str, previous: str | None) -> None:
    """Keep qwen27b_keep_model_revisions old revisions of this checkpoint besides the current one
    (the one being replaced counts first: it is the rollback target); remove the rest, oldest first."""
    prune_dirs("prune old model revisions", decision.stack.paths, decision.stack.layout.models, target, previous,
               decision.settings.keep_model_revisions, prefix=entry["id"].replace("/", "--") + "@")


def weights(decision: Decision) -> None:
    place(decision, decision.stack.model, decision.model_path, decision.settings.model_local_dir)
