"""The weights fan-out's run-wide part (qwen27b_weights_fanout "tree", mirror source; plan/fanout.py
plans the waves): the mirror's manifest read once per run, the run's seed token, the group and its
plan (every host's copy judged by its FileHashes fact, hosts outside --limit as seeds), and the seed
servers started and stopped on hosts outside --limit from the controller. The weights role queues
each host's own operations (roles/weights.py); cut from it at this seam (issue 50).
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.request
from collections.abc import Callable

import click
from pyinfra import host, state
from pyinfra.api.exceptions import OperationError

from qwen27b.controller import remote, runstate
from qwen27b.controller.address import host_address
from qwen27b.controller.facts import FactParseError
from qwen27b.controller.host_facts import FileHashes
from qwen27b.controller.runlife import inventory_settings
from qwen27b.onhost.contract import lib_dir, module_argv
from qwen27b.plan import fanout
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.stack import HostLayout, revision_dir_name
from qwen27b.plan.urlsecret import redact_url

# pyinfra evaluates the deploy file for all hosts at once (gevent; threading is patched): the first
# host to get here reads the manifest / the group's facts and plans, the others wait and reuse it
_once = threading.Lock()


def mirror_manifest(base: str) -> dict:
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


def run_token() -> str:
    """The fan-out seeds' bearer token: random, made on the controller once per run (every seed
    and receiver of the run shares it), held in memory only; it reaches hosts through secret_file."""
    run = runstate.current()
    with _once:
        if run.seed_token is None:
            run.seed_token = secrets.token_urlsafe(32)
        return run.seed_token


def manifest_bytes(manifest: dict) -> int:
    return sum(int(meta["size"]) for meta in manifest.values())


def verified(have: dict, manifest: dict) -> bool:
    return all(have.get(name) == meta["sha256"] for name, meta in manifest.items())


def _seed_address(other, settings: Settings) -> str | None:
    """Where a host serves its copy to its peers: its lab address (ssh_hostname, or where the
    controller's SSH connection reached it), else its service bind address unless that is
    loopback; None: it cannot seed (it still receives)."""
    address = host_address(other)[0] or settings.bind_address
    return None if address in (None, "127.0.0.1", "::1", "0.0.0.0", "::") else address


def fanout_plan(decision: Decision, entry: dict, target: str, base: str, manifest: dict,
                refused: Callable[[object], bool]) -> fanout.FanoutPlan | None:
    """The run's fan-out plan for this checkpoint (the same for every host of the group; printed
    once), or None when this host does not fan out. `refused(host)`: whether the gate refused that
    host of the run (the weights role asks preflight's gate; a refused host is no member)."""
    settings = decision.settings
    if settings.weights_fanout != "tree":
        return None
    plans = runstate.current().fanout_plans
    with _once:
        if (base, target) not in plans:
            plans[base, target] = _make_plan(settings, entry, target, manifest, refused)
        return plans[base, target]


def _make_plan(settings: Settings, entry: dict, target: str, manifest: dict,
               refused: Callable[[object], bool]) -> fanout.FanoutPlan:
    """The group: the run's hosts with tree fan-out from the same mirror; each one's copy judged by
    its own FileHashes fact (read once per run: the plan is made once, then kept in the run state)."""
    every = inventory_settings()
    default = entry.get("default_source", "hub")

    def same_group(other) -> bool:
        theirs = every.get(other.name)
        return (theirs is not None and theirs.weights_fanout == "tree" and theirs.model_mirror == settings.model_mirror
                and (theirs.model_source or default) == "mirror")

    members = []
    for other in sorted(state.inventory.iter_activated_hosts(), key=lambda h: h.name):
        if not same_group(other) or refused(other):
            continue
        have = other.get_fact(FileHashes, directory=target) or {}
        members.append(fanout.Member(other.name, _seed_address(other, every[other.name]),
                                     verified(have, manifest)))
    lines = []
    members += _outside_seeds([h for h in state.inventory if h not in state.activated_hosts and same_group(h)],
                              sum(not m.has_copy for m in members), target, manifest, every, lines)
    plan = fanout.plan_waves(members)
    click.echo("\n".join([f"== weights fan-out of {revision_dir_name(entry)} (qwen27b_weights_fanout: tree)"]
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
        elif verified(have, manifest):
            seeds.append(fanout.Member(other.name, _seed_address(other, every[other.name]), True,
                                       in_run=False))
    return seeds


def outside_seed_commands(plan: fanout.FanoutPlan, seed: fanout.Member, target: str, paths: dict,
                          total: int) -> list[str]:
    """What starts `seed`'s server (a host outside --limit): as a seed in the run would, but from its
    running release (`current`), with the run's token written first by `outside_seed_servers`."""
    at = HostLayout.of(paths); venv = at.current_venv
    return fanout.seed_start_commands(module_argv(venv, "mirror"), target, seed.address, fanout.seed_peers(plan, seed.name),
                                      at.seed_token_file, at.service_user,
                                      fanout.seed_max_s(plan, seed.name, total), hidden_from_seed(paths, target),
                                      plan.port, lib_dir(venv))


def outside_seed_servers(plan: fanout.FanoutPlan, seeds: list, target: str, paths: dict, total: int,
                          stop: bool = False) -> None:
    """Start (or stop) the seed servers on hosts outside --limit, from the controller over their own
    connectors, once per run whichever receiver gets here first. A seed that does not start is
    only a warning: its receivers fall back to the mirror (fetch_command)."""
    run, token = runstate.current(), run_token()  # before taking _once: run_token takes it too
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


def hidden_from_seed(paths: dict, target: str) -> str:
    """What the seed's unit covers with an empty tmpfs (only the revision is mounted back): the
    service's state dir, where the models live, or the models dir if they live elsewhere."""
    at = HostLayout.of(paths); state_dir = at.state.rstrip("/")
    return state_dir if target.startswith(state_dir + "/") else at.models
