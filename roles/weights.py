"""Model weights at a pinned revision, verified file by file, activated by an atomic symlink switch.

Sources (qwen27b_model_source): `controller` pushes a local checkpoint dir (hash-checked fan-out:
one copy on the controller, only missing/different files sent); `mirror` makes each host fetch
from a lab mirror with qwen27b-fetch (resumable, sha256-verified); `hub` downloads on the host
with huggingface_hub at the pinned revision (token from a 0600 file, never on a command line).

Fan-out (qwen27b_weights_fanout "tree", mirror source): the hosts of the run that share the mirror
form a group; one of them fetches from the mirror, then hosts holding a verified copy seed the rest
in waves, one operation per wave (qwen27b/plan/fanout.py plans it; its docstring says how).

Pins (stack key models[].files, qwen27b/plan/filepins.py): a mirror's manifest or a local dir that lists
a pinned file otherwise stops the host before anything is fetched; after the files arrive by any route,
qwen27b_onhost.pincheck checks every pinned file on the host before the link switches.
"""

from __future__ import annotations

import json
import secrets
import threading
import shlex
import urllib.request
from io import StringIO
from pathlib import Path

import click
from pyinfra import host, state
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import File
from pyinfra.operations import files, python, server

from qwen27b.plan import fanout, filepins, sources
from qwen27b.controller import factcache, progress, remote, runstate
from qwen27b.controller.address import host_address
from qwen27b.controller.artifacts import cache_root, dir_manifest
from qwen27b.controller.facts import FactParseError
from qwen27b.plan.gate import Decision, RefusedHost
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.urlsecret import redact_url
from qwen27b.controller.host_facts import HASH_CACHE, FileHashes, Subdirectories, SymlinkTarget
from qwen27b.onhost.contract import lib_dir, module_argv, module_command
from qwen27b.onhost.secretfile import load_secret
from qwen27b.controller.operations import push_files, secret_file, staging_candidates, symlink_switch
from qwen27b.plan.checkpoint import load_shape
from qwen27b.plan.stack import HostLayout, checkpoint_metadata_dir, revision_dir_name

from ._common import model_dir, release_venv
from ._common import fetch_prefix, needs_restart, note, prune_dirs, remember_previous, url_word

HUB_MANIFEST = "qwen27b-manifest.sha256"  # written after a hub download: what later runs verify


def safe_name(entry: dict) -> str:
    return revision_dir_name(entry)


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
    manifest = (f"cd {shlex.quote(target)} && find . -maxdepth 1 -type f ! -name '.*' ! -name {HUB_MANIFEST} -printf '%f\\n' | "
                f"sort | xargs -r -d '\\n' sha256sum > {HUB_MANIFEST}.part && mv -f {HUB_MANIFEST}.part {HUB_MANIFEST}")
    # two call sites: pyinfra orders operations by where they are called, so one shared call site
    # would make the two sources one operation across the hosts of a run
    if source == "modelscope":
        return server.shell(name="download from ModelScope", commands=[command, manifest])
    return server.shell(name="download from the hub", commands=[command, manifest])


# pyinfra evaluates the deploy file for all hosts at once (gevent; threading is patched): the first
# host to get here reads the manifest / the group's facts and plans, the others wait and reuse it
_once = threading.Lock()


def _mirror_manifest(base: str) -> dict:
    """The mirror's manifest, read once per run (not once per host)."""
    manifests = runstate.current().manifests
    with _once:
        if base not in manifests:
            # urllib, not httpx: this runs inside pyinfra's gevent-patched process
            try:
                with urllib.request.urlopen(f"{base}/manifest.json", timeout=30) as response:
                    manifests[base] = json.loads(response.read())["files"]
            except (OSError, ValueError, KeyError) as error:
                raise OperationError(f"cannot read {redact_url(base)}/manifest.json: {error}") from None
    return manifests[base]


def _run_token() -> str:
    """The fan-out seeds' bearer token: random, made on the controller once per run (every seed
    and receiver of the run shares it), held in memory only; it reaches hosts through secret_file."""
    run = runstate.current()
    with _once:
        if run.seed_token is None:
            run.seed_token = secrets.token_urlsafe(32)
        return run.seed_token


def _manifest_bytes(manifest: dict) -> int:
    return sum(int(meta["size"]) for meta in manifest.values())


def _verified(have: dict, manifest: dict) -> bool:
    return all(have.get(name) == meta["sha256"] for name, meta in manifest.items())


def _seed_address(other, settings: Settings) -> str | None:
    """Where a host serves its copy to its peers: its lab address (ssh_hostname, or where the
    controller's SSH connection reached it), else its service bind address unless that is
    loopback; None: it cannot seed (it still receives)."""
    address = host_address(other)[0] or settings.bind_address
    return None if address in (None, "127.0.0.1", "::1", "0.0.0.0", "::") else address


def _fanout_plan(decision: Decision, entry: dict, target: str, base: str, manifest: dict) -> fanout.FanoutPlan | None:
    """The run's fan-out plan for this checkpoint (the same for every host of the group; printed
    once), or None when this host does not fan out."""
    settings = decision.settings
    if settings.weights_fanout != "tree":
        return None
    plans = runstate.current().fanout_plans
    with _once:
        if (base, target) not in plans:
            plans[base, target] = _make_plan(settings, entry, target, manifest)
        return plans[base, target]


def _make_plan(settings: Settings, entry: dict, target: str, manifest: dict) -> fanout.FanoutPlan:
    """The group: the run's hosts with tree fan-out from the same mirror; each one's copy judged by
    its own FileHashes fact (read once per run: the plan is made once, then kept in the run state)."""
    from .preflight import gate  # noqa: PLC0415 (roles import each other lazily)
    from qwen27b.controller.runlife import inventory_settings  # noqa: PLC0415
    every = inventory_settings()
    default = entry.get("default_source", "hub")

    def same_group(other) -> bool:
        theirs = every.get(other.name)
        return (theirs is not None and theirs.weights_fanout == "tree" and theirs.model_mirror == settings.model_mirror
                and (theirs.model_source or default) == "mirror")

    members = []
    for other in sorted(state.inventory.iter_activated_hosts(), key=lambda h: h.name):
        if not same_group(other) or isinstance(gate(other), RefusedHost):
            continue
        have = other.get_fact(FileHashes, directory=target) or {}
        members.append(fanout.Member(other.name, _seed_address(other, every[other.name]),
                                     _verified(have, manifest)))
    lines = []
    members += _outside_seeds([h for h in state.inventory if h not in state.activated_hosts and same_group(h)],
                              sum(not m.has_copy for m in members), target, manifest, every, lines)
    plan = fanout.plan_waves(members)
    click.echo("\n".join([f"== weights fan-out of {safe_name(entry)} (qwen27b_weights_fanout: tree)"]
                         + [f"   {line}" for line in lines + plan.lines()]) + "\n", err=True)
    return plan


def _outside_seeds(others: list, needed: int, target: str, manifest: dict, every: dict, lines: list) -> list:
    """Hosts of the inventory outside this run's --limit that hold a verified copy: seeds, so that
    adding a host (or a rollout's later batch) does not pull the checkpoint over the WAN again.
    Read only when a host of the run needs a copy, all at once (FileHashes over each one's own
    connector); one that cannot be read seeds nobody, and the plan says why."""
    candidates = [h for h in others if _seed_address(h, every[h.name])]
    if not needed or not candidates:
        return []
    fact = FileHashes()
    seeds = []
    for other, answer in zip(candidates, remote.run_everywhere(state, candidates, lambda h: fact.command(target), 900)):
        try:
            have = fact.process(answer.stdout.splitlines()) if answer.ok and not answer.error else None
        except FactParseError:
            have = None
        if have is None:
            why = answer.error or remote.no_sections_why(answer)
            lines.append(f"{other.name} (outside --limit): copy not read ({why}): not a seed")
        elif _verified(have, manifest):
            seeds.append(fanout.Member(other.name, _seed_address(other, every[other.name]), True,
                                       in_run=False))
    return seeds


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
        secret_file(name="fan-out token (0600, this run only)", dest=token_file, content=_run_token() + "\n",
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
                    function=_outside_seed_servers, plan=plan, seeds=outside, target=target, paths=paths, total=total)
    for wave in host.loop(range(plan.waves)):
        commands = []
        if copy is not None and copy.wave == wave:
            commands.append(fetch)
        if start == wave:
            address = next(m.address for m in plan.members if m.name == name)
            commands += fanout.seed_start_commands(
                module_argv(venv, "mirror"), target, address, fanout.seed_peers(plan, name), token_file, user,
                fanout.seed_max_s(plan, name, total), _hidden_from_seed(paths, target), plan.port, lib_dir(venv))
        op = server.shell(name=f"weights fan-out wave {wave} of {safe_name(entry)}", commands=commands)
        if copy is not None and copy.wave == wave:
            needs_restart(op)
            progress.watch(op, host, "weights", [target], _manifest_bytes(manifest))
    if outside:
        python.call(name=f"weights fan-out of {safe_name(entry)}: stop the seed server on "
                         f"{', '.join(m.name for m in outside)} (outside --limit)",
                    function=_outside_seed_servers, plan=plan, seeds=outside, target=target, paths=paths, total=total,
                    stop=True)
    if start is not None:
        server.shell(name=f"weights fan-out of {safe_name(entry)}: stop the seed server",
                     commands=[fanout.seed_stop_command(token_file)])
    elif from_seed:
        server.shell(name=f"weights fan-out of {safe_name(entry)}: remove the run's token",
                     commands=[f"rm -f {token_file}"])


def outside_seed_commands(plan: fanout.FanoutPlan, seed: fanout.Member, target: str, paths: dict,
                          total: int) -> list[str]:
    """What starts `seed`'s server (a host outside --limit): as a seed in the run would, but from its
    running release (`current`), with the run's token written first by `_outside_seed_servers`."""
    at = HostLayout.of(paths); venv = at.current_venv
    return fanout.seed_start_commands(module_argv(venv, "mirror"), target, seed.address, fanout.seed_peers(plan, seed.name),
                                      at.seed_token_file, at.service_user,
                                      fanout.seed_max_s(plan, seed.name, total), _hidden_from_seed(paths, target),
                                      plan.port, lib_dir(venv))


def _outside_seed_servers(plan: fanout.FanoutPlan, seeds: list, target: str, paths: dict, total: int,
                          stop: bool = False) -> None:
    """Start (or stop) the seed servers on hosts outside --limit, from the controller over their own
    connectors, once per run whichever receiver gets here first. A seed that does not start is
    only a warning: its receivers fall back to the mirror (fetch_command)."""
    run, token = runstate.current(), _run_token()  # before taking _once: _run_token takes it too
    at = HostLayout.of(paths); token_file, user = at.seed_token_file, at.service_user
    with _once:
        for seed in seeds:
            if (seed.name, stop) in run.outside_seeds:
                continue
            run.outside_seeds.add((seed.name, stop))
            other = state.inventory.get_host(seed.name)
            if stop:
                commands = [(fanout.seed_stop_command(token_file), None)]
            else:
                part = at.seed_token_part
                commands = [(f"umask 077 && cat > {part} && chown {user}:{user} {part} && chmod 0600 {part} "
                             f"&& mv -fT {part} {token_file}", token + "\n")]  # the token on stdin only
                commands += [(command, None) for command in outside_seed_commands(plan, seed, target, paths, total)]
            for command, stdin in commands:
                answer = remote.run_command(state, other, command, timeout=60, stdin=stdin)
                if answer.error or not answer.ok:
                    click.echo(f"    [{host.name}] seed {seed.name}: {'stop' if stop else 'start'} failed "
                               f"({answer.error or remote.no_sections_why(answer)}); its receivers fall back to the mirror",
                               err=True)
                    break


def _hidden_from_seed(paths: dict, target: str) -> str:
    """What the seed's unit covers with an empty tmpfs (only the revision is mounted back): the
    service's state dir, where the models live, or the models dir if they live elsewhere."""
    at = HostLayout.of(paths); state_dir = at.state.rstrip("/")
    return state_dir if target.startswith(state_dir + "/") else at.models


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
        manifest = _mirror_manifest(base)
        if problem := filepins.source_problems(f"the mirror's {redact_url(base)}/manifest.json", entry, manifest):
            raise OperationError(problem)  # before any byte is fetched into the model dir (maybe the serving one)
        have = host.get_fact(FileHashes, directory=target) or {}
        arriving = not _verified(have, manifest)
        plan = _fanout_plan(decision, entry, target, base, manifest)
        if plan is not None:
            _fan_out(decision, entry, target, base, manifest, plan)
        elif _verified(have, manifest):
            note(f"weights: {safe_name(entry)} verified on the host")
        else:
            tool, listing = _fetch_setup(decision, entry, manifest)
            fetch = server.shell(name="fetch the checkpoint from the mirror",
                                 commands=[f"{fetch_prefix(decision)}{tool} "
                                           f"--base {_mirror_base(decision, entry)} --dest {shlex.quote(target)} --manifest {listing}"])
            needs_restart(fetch)
            progress.watch(fetch, host, "weights", [target], _manifest_bytes(manifest))
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
