"""Day two, decided (pure: facts in, decisions out; no pyinfra, no host I/O).

* `rollout_batches`: the order a rolling upgrade takes the fleet in (canary first).
* the **release record** (`record_text`, `parse_record`): what a host runs, written by every deploy to
  /etc/qwen27b/release.json; a deploy that switches anything keeps the running one's record, unit
  and env in /etc/qwen27b/rollback/ first. So the previous release is known on the host itself,
  not only in the memory of the deploy that replaced it.
* `plan_rollback` / `swap_commands`: the on-demand rollback: the record, units and env in the
  rollback dir and the running ones change places, every symlink goes back to the kept record's
  target. Run twice, it rolls forward again.
* `stale_dirs`: what pruning removes (never the current release or the rollback target).
* `uninstall_plan`: every removal, in order, each with its reason, and what stays and why.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import urllib.parse
from dataclasses import dataclass, field

from qwen27b.onhost.contract import (FIREWALL_UNIT, GATEWAY_UNIT, HEALTH_HTTP_SOCKET, HEALTH_HTTP_TEMPLATE, HEALTH_TIMER,
                                     HEALTH_UNIT, INSTANCE_TEMPLATE, POOL_UNIT, RAY_UNIT, SEED_UNIT, SERVICE_UNIT)

from qwen27b.plan import chatpage
from qwen27b.plan.modelsdir import apart_from_state, uninstall_apart
from qwen27b.plan.hostlayout import RECORD_NAME, ROLLBACK_SUBDIR, HostLayout  # noqa: F401 (RECORD_NAME, ROLLBACK_SUBDIR: their importers)


def release_record_file(paths: dict) -> str:
    """HostLayout.release_record of a stack's `paths`."""
    return HostLayout.of(paths).release_record


def rollback_dir(paths: dict) -> str:
    """HostLayout.rollback_dir of a stack's `paths`."""
    return HostLayout.of(paths).rollback_dir


# ---------------------------------------------------------------------------------- rollout order

def rollout_batches(hosts: list[str], canary: list[str] | None = None, batch_size: int = 1) -> list[list[str]]:
    """The batches of a rolling upgrade, in inventory order: the canary hosts alone first (default:
    the first host), then the others `batch_size` at a time. Each batch is deployed and verified
    before the next starts. Raises ValueError for a canary not in `hosts` or a size below 1."""
    if batch_size < 1:
        raise ValueError(f"batch size must be 1 or more, got {batch_size}")
    if len(set(hosts)) != len(hosts):
        raise ValueError("a host is listed twice")
    canary = list(dict.fromkeys(canary)) if canary else hosts[:1]
    unknown = [name for name in canary if name not in hosts]
    if unknown:
        raise ValueError(f"canary {', '.join(unknown)} is not among the selected hosts ({', '.join(hosts)})")
    rest = [name for name in hosts if name not in canary]
    return ([canary] if canary else []) + [rest[i:i + batch_size] for i in range(0, len(rest), batch_size)]


# ---------------------------------------------------------------------------------- release record

@dataclass(frozen=True)
class Record:
    """What a host runs: each symlink's target (release, model, draft) and how verify reaches it."""

    links: dict[str, str]
    model_ref: str = ""
    url: str = ""
    served_name: str = ""
    speculative: bool = False
    start_timeout_s: int = 600
    flags: tuple[str, ...] = ()  # the vllm serve flags, one "--name value" each: a flag-only change shows
    attempts: tuple = ()  # each start of the deploy that wrote it, when it retried (plan/retry.py Attempt.as_json)
    # (file, sha256, where from) of the engine wheel the install took, when its hash was known before
    # it ran (a pushed wheelhouse, a stack URL pinned with its sha256); () when it came by name
    engine_wheel: tuple = ()
    # verify's figures of this release on this host (plan/regression.py figures): the next release's
    # deploy compares its own with these; {} until verify measured them
    verify: dict = field(default_factory=dict)
    baseline: dict = field(default_factory=dict)  # the release it replaced: its figures then (the comparison's "before")

    def as_json(self) -> dict:
        return {"links": dict(sorted(self.links.items())), "model_ref": self.model_ref, "url": self.url,
                "served_name": self.served_name, "speculative": self.speculative,
                "start_timeout_s": self.start_timeout_s, **({"flags": list(self.flags)} if self.flags else {}),
                **({"attempts": list(self.attempts)} if self.attempts else {}),
                **({"engine_wheel": dict(zip(ENGINE_WHEEL_FIELDS, self.engine_wheel))} if self.engine_wheel else {}),
                **({"verify": verify_figures(self.verify)} if verify_figures(self.verify) else {}),
                **({"baseline": verify_figures(self.baseline)} if verify_figures(self.baseline) else {})}

    def short(self, paths: dict) -> str:
        """'release <hash>, model <id@rev>' for plan lines."""
        at = HostLayout.of(paths)
        release = self.links.get(at.current_release, "?").rsplit("/", 1)[-1]
        model = self.links.get(at.current_model, "?").rsplit("/", 1)[-1]
        return f"release {release}, model {model}"


ENGINE_WHEEL_FIELDS = ("file", "sha256", "from")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _engine_wheel(data) -> tuple:
    """The record's engine_wheel entry, kept only when it is what we write (a file name and a hash)."""
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ENGINE_WHEEL_FIELDS):
        return ()
    return tuple(data[k] for k in ENGINE_WHEEL_FIELDS) if _SHA256.match(data["sha256"]) else ()


def record_text(record: Record) -> str:
    """The record file's text: stable (sorted keys, no time stamp), so a second run changes nothing."""
    return json.dumps(record.as_json(), indent=2, sort_keys=True) + "\n"


_LINK_TARGET = re.compile(r"^/[A-Za-z0-9._@+=/-]+$")


def parse_record(data) -> Record | None:
    """A record read from a host (JSON-decoded) -> Record; None when absent; ValueError when it is
    not one we wrote (a link target outside plain absolute paths would reach a shell command)."""
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("links"), dict) or not data["links"]:
        raise ValueError("not a release record (no 'links')")
    for link, target in data["links"].items():
        if not (isinstance(link, str) and isinstance(target, str) and _LINK_TARGET.match(link)
                and _LINK_TARGET.match(target) and ".." not in target.split("/")):
            raise ValueError(f"release record link {link!r} -> {target!r} is not a plain absolute path")
    timeout = data.get("start_timeout_s", 600)
    flags = data.get("flags") if isinstance(data.get("flags"), list) else []  # older records have none
    attempts = data.get("attempts") if isinstance(data.get("attempts"), list) else []
    return Record(links=dict(data["links"]), model_ref=str(data.get("model_ref") or ""),
                  url=str(data.get("url") or ""), served_name=str(data.get("served_name") or ""),
                  speculative=bool(data.get("speculative")),
                  start_timeout_s=timeout if isinstance(timeout, int) and timeout > 0 else 600,
                  flags=tuple(str(flag) for flag in flags),
                  attempts=tuple(a for a in attempts if isinstance(a, dict)),
                  engine_wheel=_engine_wheel(data.get("engine_wheel")), verify=verify_figures(data.get("verify")),
                  baseline=verify_figures(data.get("baseline")))


def verify_figures(data) -> dict:
    """The record's verify figures, numbers only, and the prompt set they were measured on (a
    hand-edited or older record: what is usable)."""
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in sorted(data.items())
            if (k in VERIFY_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool))
            or (k == "prompt_set" and isinstance(v, str) and PROMPT_SET.fullmatch(v))}


VERIFY_KEYS = ("ttft_ms", "decode_tok_s", "acceptance", "runs", "pair_alike")  # pair_alike: controller/pairmeasure.py
PROMPT_SET = re.compile(r"[0-9a-f]{12}")  # plan/regression.prompt_set


# ---------------------------------------------------------------------------------- rollback

class NoRollback(Exception):
    """Nothing (safe) to roll back to; str() says why and what to do."""

    def __init__(self, cause: str, fix: str):
        self.cause, self.fix = cause, fix
        super().__init__(f"{cause}. Fix: {fix}")


@dataclass(frozen=True)
class RollbackPlan:
    switch: tuple[tuple[str, str, str], ...]  # (link, its target now, the kept record's target)
    restore: tuple[str, ...]  # serving files swapped with their kept copies (units, env, record)
    target: Record  # what runs after the rollback: verify checks it
    back: Record  # what runs now: restored if the target does not verify
    unkept: tuple[str, ...] = ()  # optional serving files the rollback dir lacks (kept before issue 56): left as they are

    def lines(self, paths: dict) -> list[str]:
        out = [f"rollback: from {self.back.short(paths)}", f"          to   {self.target.short(paths)}"]
        out += [f"   {link} -> {to} (now {now})" for link, now, to in self.switch]
        if self.target.flags and self.back.flags and self.target.flags != self.back.flags:
            out += [f"   serve flag {line}" for line in flag_changes(self.back.flags, self.target.flags)]
        out += [f"   {path} <- the kept copy (the running one is kept in its place)" for path in self.restore]
        out += [f"   {path}: not kept (the rollback dir predates it): left as it is until the next deploy"
                for path in self.unkept]
        return out


def flag_changes(now: tuple[str, ...], to: tuple[str, ...]) -> list[str]:
    """What a rollback changes in the serve flags: "--name: now -> then" (absent shown as "-")."""
    def by_name(flags):
        return {flag.split(" ", 1)[0]: (flag.split(" ", 1) + [""])[1] for flag in flags}
    a, b = by_name(now), by_name(to)
    return [f"{name}: {a.get(name, '-') or 'set'} -> {b.get(name, '-') or 'set'}"
            for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]


def plan_rollback(current: Record | None, previous: Record | None, kept: list[str], missing: list[str],
                  serving_files: list[str], optional: list[str] | tuple = ()) -> RollbackPlan:
    """The on-demand rollback for one host. `current` / `previous`: the running and kept records;
    `kept`: the file names in the rollback dir; `missing`: the kept record's link targets that are
    not on the host (pruned, deleted); `optional`: those of `serving_files` a rollback dir kept by an
    older qwen27b lacks (the health check units, issue 56): restored where kept, else left and named.
    Raises NoRollback naming the cause and the fix."""
    if previous is None:
        raise NoRollback("no previous release is recorded on this host (no deploy has replaced a running one "
                         "since qwen27b started recording them)", "deploy the release you want with "
                         "`pyinfra INVENTORY deploy.py -y --limit HOST` and the host data of that release")
    if current is None:
        raise NoRollback("the running release is not recorded (/etc/qwen27b/release.json is missing)",
                         "re-run the deploy once (`pyinfra INVENTORY deploy.py -y --limit HOST`), then roll back")
    if missing:
        raise NoRollback(f"the previous release's {', '.join(missing)} is gone from the host (pruned or deleted)",
                         "deploy the release you want instead (its files are fetched again)")
    names = {path.rsplit("/", 1)[-1]: path for path in serving_files}
    unkept = tuple(path for path in serving_files if path in optional and path.rsplit("/", 1)[-1] not in kept)
    absent = [name for name, path in names.items() if name not in kept and path not in unkept]
    if absent:
        raise NoRollback(f"the rollback dir lacks the kept {', '.join(sorted(absent))}",
                         "deploy the release you want instead")
    switch = tuple((link, current.links.get(link, ""), target) for link, target in sorted(previous.links.items())
                   if current.links.get(link) != target)
    return RollbackPlan(switch, tuple(path for path in serving_files if path not in unkept), restored(previous, current),
                        current, unkept)


def restored(previous: Record, current: Record) -> Record:
    """The release a rollback puts back, as verify reaches it: the kept record's links, URL, served
    name, speculation and start time-out, since the release that is replaced may have changed any
    of them (asked for the new served name, a restored release that serves fails its check); the
    running record's model, URL and name where the kept one (made of symlinks before records held
    them) has none. Used by the rollback on demand and by verify's rollback after a failed deploy."""
    return Record(previous.links, previous.model_ref or current.model_ref, previous.url or current.url,
                  previous.served_name or current.served_name, previous.speculative,
                  previous.start_timeout_s, previous.flags)


def copy_url(url: str, port: int | str) -> str:
    """A copy's URL from the release record's (the first copy's): the same address, the copy's port."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition(":")[0] or parts.netloc
    return urllib.parse.urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))


def swap_commands(links: dict[str, str], serving_files: list[str], kept_dir: str, then: list[str]) -> list[str]:
    """Exchange the serving files with their kept copies in `kept_dir`, point every link at its
    target in `links`, then run `then` (systemd's reload and the service's restart). One shell
    command per step; the running files are copied aside first, so an interruption leaves the
    rollback dir whole."""
    q = shlex.quote
    staged = f"{kept_dir}.swap"
    commands = [f"rm -rf {q(staged)} && mkdir {q(staged)} && cp -a {' '.join(q(p) for p in serving_files)} {q(staged)}/"]
    for path in serving_files:
        commands.append(f"cp -a {q(kept_dir + '/' + path.rsplit('/', 1)[-1])} {q(path)}")
    for link, target in sorted(links.items()):
        commands.append(f"ln -sfn {q(target)} {q(link + '.new')} && mv -Tf {q(link + '.new')} {q(link)}")
    commands.append(f"rm -rf {q(kept_dir)} && mv -T {q(staged)} {q(kept_dir)}")
    return commands + list(then)


# ---------------------------------------------------------------------------------- prune

def stale_dirs(paths: list[str], current: str, protected: set[str] | frozenset[str] | tuple = (), keep: int = 1) -> list[str]:
    """Of `paths` (oldest first), those to remove so that `keep` old ones stay besides `current`.
    `protected` (the rollback target: the one being replaced, or the kept record's) always stays
    and counts first against `keep`; the newest others fill the rest."""
    protected = {path for path in protected if path and path != current}
    spare = [path for path in paths if path != current and path not in protected]
    quota = max(0, keep - len([path for path in paths if path in protected]))
    return spare[: max(0, len(spare) - quota)]


# ---------------------------------------------------------------------------------- uninstall

@dataclass(frozen=True)
class UninstallOptions:
    weights: bool = False  # qwen27b_uninstall_weights: the model revisions too (20+ GiB)
    driver: bool = False  # qwen27b_uninstall_driver: unhold and purge the NVIDIA driver, the nouveau blacklist
    chat_data: bool = False  # qwen27b_uninstall_chat_data: the chat page's users and chats too


@dataclass(frozen=True)
class Removal:
    what: str
    why: str
    commands: tuple[str, ...]


@dataclass
class Installed:
    """What the host holds of a deploy (the Installed fact): path -> "user:group", unit -> state,
    the service user and group, the nftables tables; the driver packages held and installed."""

    paths: dict[str, str] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    users: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    nft: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    packages: dict[str, str] = field(default_factory=dict)  # installed driver/CUDA package -> version


SERVICE_UNITS = (HEALTH_TIMER, HEALTH_HTTP_SOCKET, SERVICE_UNIT, HEALTH_UNIT, RAY_UNIT, SEED_UNIT, chatpage.UNIT, GATEWAY_UNIT,
                 POOL_UNIT, FIREWALL_UNIT)  # stopped in this order
UNIT_FILES = (SERVICE_UNIT, HEALTH_UNIT, HEALTH_TIMER, HEALTH_HTTP_SOCKET, HEALTH_HTTP_TEMPLATE, RAY_UNIT, GATEWAY_UNIT,
              POOL_UNIT, chatpage.UNIT, FIREWALL_UNIT, f"{SERVICE_UNIT}.d", INSTANCE_TEMPLATE)
# a gateway host's own (roles/gateway.py; controller/gateway_render.py names them): its nginx package stays
GATEWAY_DIRS = ("/opt/qwen27b-gateway", "/etc/qwen27b-gateway", "/var/lib/qwen27b-gateway")
GATEWAY_USER = "qwen27b-gateway"
# a gateway's chat page (roles/chat_page.py): its venvs and environment go; its users and chats (and
# the user that owns them) only with qwen27b_uninstall_chat_data
CHAT_PAGE_DIRS = (chatpage.ROOT, chatpage.CONFIG_DIR)
NFT_TABLE = "inet qwen27b"
DRIVER_PACKAGE = re.compile(r"^(?:nvidia-|libnvidia-|xserver-xorg-video-nvidia)")
NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
MOK_CONFIG = "/etc/dkms/framework.conf.d/qwen27b-mok.conf"
CUDA_PROFILE = "/etc/profile.d/qwen27b-cuda.sh"
LOCK_DIR = "/run/qwen27b"
# the toolchain role's apt side of qwen27b_http_proxy: apt.conf lines, and the login (0600) for a proxy URL with one
APT_PROXY_CONF = "/etc/apt/apt.conf.d/90qwen27b-proxy"
APT_PROXY_AUTH = "/etc/apt/auth.conf.d/90qwen27b-proxy.conf"
# ... and of qwen27b_apt_mirror: apt.conf lines pointing apt at qwen27b's source list (and an empty parts
# dir), both beside apt's own files (not under /etc/qwen27b: the conf must never name a missing list), and the login
APT_MIRROR_CONF = "/etc/apt/apt.conf.d/90qwen27b-mirror"
APT_MIRROR_LIST = "/etc/apt/qwen27b-mirror.list"
APT_MIRROR_PARTS = "/etc/apt/qwen27b-mirror.list.d"
APT_MIRROR_AUTH = "/etc/apt/auth.conf.d/90qwen27b-mirror.conf"


def _beside_weights(paths: dict) -> list[str]:
    """What the deploy leaves beside the weights in the state dir (with the weights kept, the
    uninstall removes these; the toolchain role always makes the cache dir)."""
    at = HostLayout.of(paths)
    return [at.cache, at.health_status, at.restart_request, at.current_model, at.draft_link]


def keep_weights_as_root(state: str, models: str) -> tuple[str, str]:
    """The uninstall that keeps the weights hands the state dir and its models dir to root (issue
    51: root never follows the service user's links). The state dir first: it sits in root's
    hierarchy (a link there is the admin's), and once it is root's 0755 nothing inside it can be
    swapped; then the models dir, refused where it is a link (planted: left as it is, named)."""
    q = shlex.quote
    return (f"chown root:root {q(state)} && chmod 0755 {q(state)}",
            f"if [ -L {q(models)} ] || [ ! -d {q(models)} ]; then echo {q(models + ' is not a directory (a symbolic link?): left as it is; check who made it and remove it by hand')} >&2; "
            f"exit 1; fi; chown -h root:root {q(models)} && chmod 0755 {q(models)}")


def probe_paths(paths: dict, unit_dir: str, textfile: str) -> list[str]:
    """Every path the uninstall looks for (the DeployedState fact's argument)."""
    at = HostLayout.of(paths)
    return ([at.root, at.config, at.state, at.models, *_beside_weights(paths), CUDA_PROFILE,
             textfile, textfile.rsplit("/", 1)[0], NOUVEAU_BLACKLIST, MOK_CONFIG, *GATEWAY_DIRS, *CHAT_PAGE_DIRS,
             chatpage.STATE_DIR, APT_PROXY_CONF,
             APT_PROXY_AUTH, APT_MIRROR_CONF, APT_MIRROR_LIST, APT_MIRROR_PARTS, APT_MIRROR_AUTH]
            + [f"{unit_dir}/{name}" for name in UNIT_FILES])


def uninstall_plan(have: Installed, paths: dict, options: UninstallOptions, unit_dir: str,
                   textfile: str) -> tuple[list[Removal], list[str]]:
    """(removals in order, what stays and why). Only what is there is removed: a second run plans
    nothing. The lock dir is the caller's (it holds the lock while this runs)."""
    q = shlex.quote
    at = HostLayout.of(paths)
    user = at.service_user
    removals: list[Removal] = []
    kept: list[str] = []
    running = [u for u in SERVICE_UNITS if have.units.get(u, "inactive") not in ("inactive", "")]
    if running:
        removals.append(Removal(f"stop {', '.join(running)}", "the service, its health check and endpoint, a seed "
                                "server and the firewall unit, before their files go",
                                (f"systemctl disable --now {' '.join(running)}",)))
    if NFT_TABLE in have.nft:
        removals.append(Removal(f"nftables table {NFT_TABLE}", "the firewall role's rule (its unit's stop removes it; "
                                "this covers a table loaded by hand)",
                                # the stop before removed it when the unit ran: delete only what is still there
                                (f"! nft list table {NFT_TABLE} >/dev/null 2>&1 || nft delete table {NFT_TABLE}",)))
    units = [f"{unit_dir}/{name}" for name in UNIT_FILES if f"{unit_dir}/{name}" in have.paths]
    if units:
        # the copies (qwen27b@NAME.service) and their health checks (qwen27b-health@NAME.service/.timer,
        # their own unit files, and qwen27b@NAME.prom) are not probed by name: stopped, disabled and
        # removed by pattern, the timers first (a timer left running would start its check again)
        text_dir = textfile.rsplit("/", 1)[0]
        copies = ("systemctl stop 'qwen27b-health@*.timer' 2>/dev/null || true",
                  "systemctl stop 'qwen27b-health@*.service' 'qwen27b@*.service' 2>/dev/null || true",
                  f"rm -f {unit_dir}/multi-user.target.wants/qwen27b@*.service "
                  f"{unit_dir}/timers.target.wants/qwen27b-health@*.timer",
                  f"rm -f {unit_dir}/qwen27b-health@*.service {unit_dir}/qwen27b-health@*.timer "
                  f"{q(text_dir)}/qwen27b@*.prom") \
            if f"{unit_dir}/{INSTANCE_TEMPLATE}" in units else ()
        removals.append(Removal(f"unit files {', '.join(u.rsplit('/', 1)[-1] for u in units)}"
                                + (" and each copy's health check, timer and metrics file" if copies else ""),
                                "rendered by the service and firewall roles",
                                (*copies, f"systemctl disable {' '.join(u.rsplit('/', 1)[-1] for u in units if u.endswith(('.service', '.timer', '.socket')) and '@' not in u)} 2>/dev/null || true",
                                 "rm -rf " + " ".join(q(u) for u in units), "systemctl daemon-reload",
                                 "systemctl reset-failed 2>/dev/null || true")))
    for path, why in ((at.root, "release venvs (~3.5 GB each on the CPU profile), uv, Python, the pushed wheelhouse"),
                      (at.config, "env files, the API key, tokens, the release record and the rollback copies"),
                      (CUDA_PROFILE, "the CUDA PATH file for login shells"),
                      (APT_PROXY_CONF, "apt's proxy setting (qwen27b_http_proxy)"),
                      (APT_PROXY_AUTH, "apt's login to the proxy (its password)"),
                      (APT_MIRROR_CONF, "apt's pointer to qwen27b_apt_mirror's list (first: apt then reads the host's own)"),
                      (APT_MIRROR_LIST, "qwen27b_apt_mirror's source list"),
                      (APT_MIRROR_PARTS, "qwen27b_apt_mirror's (empty) source parts dir"),
                      (APT_MIRROR_AUTH, "apt's login to qwen27b_apt_mirror (its password)"),
                      *((path, "the gateway's code, config and keys, state") for path in GATEWAY_DIRS),
                      *((path, "the chat page's venv, uv, wheelhouse and environment") for path in CHAT_PAGE_DIRS)):
        if path in have.paths:
            removals.append(Removal(path, why, (f"rm -rf {q(path)}",)))
    state, models = at.state, at.models
    if apart_from_state(paths):  # qwen27b_models_dir: the state dir holds no weights; the models dir its own way
        if state in have.paths:
            removals.append(Removal(state, "the health status and caches (the weights are elsewhere)", (f"rm -rf {q(state)}",)))
        apart, kept_apart = uninstall_apart(have.paths, models, [at.current_model, at.draft_link], options.weights)
        removals += [Removal(*each) for each in apart]
        kept += kept_apart
    elif state in have.paths:
        if options.weights or models not in have.paths:
            what = f"{state} with the model weights" if models in have.paths else state
            removals.append(Removal(what, "the health status, caches" + (" and every model revision" if models in have.paths else ""),
                                    (f"rm -rf {q(state)}",)))
        elif ([p for p in _beside_weights(paths) if p in have.paths]
              or {have.paths[state], have.paths[models]} != {"root:root"}):
            removals.append(Removal(f"{state} except {models}", "the health status and caches; the weights stay "
                                    "(qwen27b_uninstall_weights=true removes them), owned by root from now on",
                                    (f"find {q(state)} -mindepth 1 -maxdepth 1 ! -path {q(models)} -exec rm -rf {{}} +",
                                     f"rm -f {q(models + '/current')} {q(models + '/draft')}",
                                     *keep_weights_as_root(state, models))))
        if not options.weights and models in have.paths:
            kept.append(f"{models}: the model weights (set qwen27b_uninstall_weights=true to remove them; "
                        "a later deploy uses them again instead of fetching)")
    text_dir = textfile.rsplit("/", 1)[0]
    if textfile in have.paths:
        removals.append(Removal(textfile, "the health check's metrics for node_exporter", (f"rm -f {q(textfile)}",)))
    if have.paths.get(text_dir, "").endswith(f":{user}"):
        removals.append(Removal(f"{text_dir}: group {user}", "given to the health check for its metrics file",
                                (f"chgrp root {q(text_dir)} && chmod 0755 {q(text_dir)}",)))
    if user in have.users:
        removals.append(Removal(f"service user {user}", "the system user the service ran as", (f"userdel {q(user)}",)))
    if user in have.groups:
        removals.append(Removal(f"group {user}", "the service user's group",
                                (f"getent group {q(user)} >/dev/null && groupdel {q(user)} || true",)))
    if GATEWAY_USER in have.users:
        removals.append(Removal(f"gateway user {GATEWAY_USER}", "nginx's workers on a gateway host (its group goes with it)",
                                (f"userdel {q(GATEWAY_USER)}", f"getent group {q(GATEWAY_USER)} >/dev/null && "
                                 f"groupdel {q(GATEWAY_USER)} || true")))
    removals += _chat_data(have, options)
    removals += _driver(have, options)
    if not options.driver:
        driver = sorted(name for name in have.packages if DRIVER_PACKAGE.match(name))
        if driver or NOUVEAU_BLACKLIST in have.paths:
            held = [p for p in have.held if DRIVER_PACKAGE.match(p)]
            kept.append("the NVIDIA driver" + (f" ({', '.join(held)} held)" if held else "")
                        + (", the nouveau blacklist" if NOUVEAU_BLACKLIST in have.paths else "")
                        + ": set qwen27b_uninstall_driver=true to unhold and purge them")
    return removals, kept + chat_data_kept(have, options)


def _chat_data(have: Installed, options: UninstallOptions) -> list[Removal]:
    """The chat page's users and chats (and the user owning them): with qwen27b_uninstall_chat_data."""
    q, out = shlex.quote, []
    if options.chat_data and chatpage.STATE_DIR in have.paths:
        out.append(Removal(chatpage.STATE_DIR, "the chat page's users and chats (qwen27b_uninstall_chat_data)",
                           (f"rm -rf {q(chatpage.STATE_DIR)}",)))
    if chatpage.USER in have.users and (options.chat_data or chatpage.STATE_DIR not in have.paths):
        out.append(Removal(f"chat page user {chatpage.USER}", "Open WebUI's (its group goes with it)",
                           (f"userdel {q(chatpage.USER)}",
                            f"getent group {q(chatpage.USER)} >/dev/null && groupdel {q(chatpage.USER)} || true")))
    return out


def chat_data_kept(have: Installed, options: UninstallOptions) -> list[str]:
    if options.chat_data or chatpage.STATE_DIR not in have.paths:
        return []
    return [f"{chatpage.STATE_DIR} and its owner {chatpage.USER}: the chat page's users and chats (set "
            "qwen27b_uninstall_chat_data=true, `qwen27b uninstall --chat-data`, to remove them; a later deploy "
            "serves them again)"]


def _driver(have: Installed, options: UninstallOptions) -> list[Removal]:
    if not options.driver:
        return []
    q = shlex.quote
    out = []
    held = sorted(p for p in have.held if DRIVER_PACKAGE.match(p) or p.startswith("linux-image-"))
    if held:
        out.append(Removal(f"apt hold on {', '.join(held)}", "the nvidia role held them against unattended upgrades",
                           ("apt-mark unhold " + " ".join(q(p) for p in held),)))
    installed = sorted(name for name in have.packages if DRIVER_PACKAGE.match(name))
    if installed:
        out.append(Removal(f"NVIDIA driver packages {', '.join(installed)}",
                           "qwen27b_uninstall_driver; the module stays loaded until the next reboot",
                           ("DEBIAN_FRONTEND=noninteractive apt-get -y purge " + " ".join(q(p) for p in installed),)))
    for path, why in ((NOUVEAU_BLACKLIST, "written for the NVIDIA driver; nouveau may load again after a reboot"),
                      (MOK_CONFIG, "DKMS's MOK signing config for secure boot")):
        if path in have.paths:
            commands = (f"rm -f {q(path)}",) + (("update-initramfs -u",) if path == NOUVEAU_BLACKLIST else ())
            out.append(Removal(path, why, commands))
    return out


def loopback_url(url: str) -> bool:
    """A release record's URL on loopback (127.0.0.0/8 or [::1]; issue 24's IPv6-only labs): the
    controller cannot reach it, so the rollback's verify is skipped."""
    try:
        return ipaddress.ip_address(urllib.parse.urlsplit(url).hostname or "").is_loopback
    except ValueError:
        return False
