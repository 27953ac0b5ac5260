"""What the roles share per host while a deploy is planned: notes printed as one block at the
end of the host's plan (no interleaving between hosts), the operations whose change means a
restart, and the symlink targets a rollback returns to (kept in the run's runstate); and the
helpers more than one role queues operations with (apt, the service user, a unit started or
restarted), so no role imports another's."""

from __future__ import annotations

import functools
from dataclasses import dataclass
import shlex
import sys
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_config, ctx_host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, server, systemd

from qwen27b import onhost
from qwen27b.controller import runstate
from qwen27b.controller.artifacts import cache_root, dir_manifest, python_builds
from qwen27b.onhost.contract import RAY_UNIT
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan import sources
from qwen27b.plan.distname import normalize
from qwen27b.plan.gate import Decision
from qwen27b.controller.host_facts import ReleaseRecords, ServiceUser, Subdirectories
from qwen27b.onhost.secretfile import load_secret
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.urlsecret import url_has_password
from qwen27b.plan.lifecycle import parse_record, release_record_file, rollback_dir, stale_dirs
from qwen27b.plan.stack import load_stack

ONHOST_SOURCE = Path(onhost.__file__).parent  # the on-host package the vllm and gateway roles send
RAY_UNIT_FILE = HostLayout.unit_file(RAY_UNIT)  # the multinode role's unit; preflight looks for a stale one
ROLLBACK_DIR = HostLayout.of(load_stack()["paths"]).rollback_dir  # the running release's unit, env and record


def dry_run() -> bool:
    """`pyinfra ... --dry`: plan only. pyinfra does not tell the deploy file, so read its argv:
    a dry run must fetch nothing, not even onto the controller."""
    return "--dry" in sys.argv[1:]


def note(text: str, always: bool = False) -> None:
    """A line of this host's plan block. Printed when the host changes (with the decision it explains)
    and with -v; `always`: also for a host with nothing to change (a step left to do by hand, a
    lock taken over, a check that cannot run)."""
    runstate.current().notes.setdefault(host.name, []).append((text, always))


def take_notes() -> list[tuple[str, bool]]:
    return runstate.current().notes.pop(host.name, [])


def api_key(decision: Decision) -> str | None:
    """The API key from the controller-side file named by qwen27b_api_key_file (never logged);
    hostdata refused a malformed file before any host was touched."""
    path = decision.settings.api_key_file
    return load_secret(path, "VLLM_API_KEY") if path else None


# A URL with a password (user:pass@) never goes into a command line (sh -c's argv shows in `ps`, and
# pyinfra -v prints it): it is written to this root-only env file and the commands source it and
# hand the URL to the tool in its environment (UV_PYTHON_INSTALL_MIRROR, PIP_FIND_LINKS, http_proxy,
# qwen27b-fetch --base expanding $QWEN27B_MODEL_MIRROR itself).
URL_VARS = {"python_mirror": "QWEN27B_PYTHON_MIRROR", "wheel_mirror": "QWEN27B_WHEEL_MIRROR",
            "model_mirror": "QWEN27B_MODEL_MIRROR", "http_proxy": "QWEN27B_HTTP_PROXY",
            "pypi_index": "QWEN27B_PYPI_INDEX", "torch_index": "QWEN27B_TORCH_INDEX"}


def url_env_file(decision: Decision) -> str:
    return decision.stack.layout.url_env_file


def secret_urls(settings: Settings) -> dict[str, str]:
    """Variable -> URL for this host's URLs that carry a password."""
    return {var: getattr(settings, name) for name, var in URL_VARS.items()
            if getattr(settings, name) and url_has_password(getattr(settings, name))}


def url_env_text(settings: Settings) -> str:
    # hostdata allows only plain URL characters (no quote, no space): single quotes hold them verbatim
    return "".join(f"export {var}='{url}'\n" for var, url in sorted(secret_urls(settings).items()))


def url_source(decision: Decision) -> str:
    """The command prefix that loads the URL env file ('' when no URL carries a password)."""
    return f". {url_env_file(decision)} && " if secret_urls(decision.settings) else ""


def url_word(settings: Settings, name: str) -> str:
    """How a command names the URL: itself, or "$VAR" from the env file when it carries a password
    (only ever as an environment assignment's value: expanded in argv it would show in `ps`)."""
    url = getattr(settings, name)
    return f'"${URL_VARS[name]}"' if url_has_password(url) else url


def proxy_env(settings: Settings) -> str:
    """The environment prefix that sends a command's fetches through qwen27b_http_proxy ('' without
    one): uv, pip, curl, huggingface_hub and qwen27b-fetch read these variables (both spellings: some
    tools read only one). no_proxy is emptied so a mirror on the lab network (or on loopback, as the
    test hosts' is) goes through the proxy as well: one setting for every fetch a host makes. With
    a password the value is "$QWEN27B_HTTP_PROXY" from the URL env file: prefix `url_source`."""
    if not settings.http_proxy:
        return ""
    proxy = shell_word(settings, "http_proxy")
    return f"http_proxy={proxy} https_proxy={proxy} HTTP_PROXY={proxy} HTTPS_PROXY={proxy} no_proxy= NO_PROXY= "


def fetch_prefix(decision: Decision) -> str:
    """What a command that fetches from the network starts with: the URL env file (when a URL
    carries a password) and the proxy environment."""
    return url_source(decision) + proxy_env(decision.settings)


def shell_word(settings: Settings, name: str) -> str:
    """url_word as one shell word: a plain URL shell-quoted (hostdata allows ? # ~ [ ], which an
    unquoted word would glob or tilde-expand), the "$VAR" of a URL with a password as it is."""
    url = getattr(settings, name)
    return url_word(settings, name) if url_has_password(url) else shlex.quote(url)


def needs_restart(op, what: str = "the weights") -> None:
    """Remember an operation whose change means the service must restart, and `what` it changes (the
    weights, the model link, the on-host code): verify says so when it measures the figures again."""
    if op is not None:
        runstate.current().restart_ops.setdefault(host.name, []).append((what, op))


def restart_reasons() -> list[str]:
    """What the operations whose change restarts the service change on this run, each named once (taken once)."""
    changed = [what for what, op in runstate.current().restart_ops.pop(host.name, []) if op.will_change]
    return list(dict.fromkeys(changed))


def restart_needed() -> bool:
    return bool(restart_reasons())


@dataclass(frozen=True)
class SwitchedLink:
    """A symlink this deploy switches, and where it pointed before: a rollback points it back."""

    link: str
    target: str


@dataclass(frozen=True)
class KeptFiles:
    """The serving files (units, env) copied into ROLLBACK_DIR before this deploy replaces them: a
    rollback copies them back to these paths."""

    paths: tuple[str, ...]


def remember_previous(link: str, target: str | None) -> None:
    """What a symlink pointed to before this deploy switched it: the rollback target."""
    if target:
        runstate.current().previous.setdefault(host.name, []).append(SwitchedLink(link, target))


def remember_kept(paths: list[str]) -> None:
    """The serving files kept in ROLLBACK_DIR (keep_running_release): a rollback restores them."""
    if paths:
        runstate.current().previous.setdefault(host.name, []).append(KeptFiles(tuple(paths)))


def previous_links() -> list[SwitchedLink | KeptFiles]:
    """What this host's rollback undoes, in the order the roles changed it (taken once)."""
    return runstate.current().previous.pop(host.name, [])


def running_record(paths: dict):
    """The release record on the host before this deploy (its ReleaseRecords fact); None when there is
    none or it is unreadable (pruning and the rollback name an unreadable one)."""
    answer = host.get_fact(ReleaseRecords, record=release_record_file(paths), kept_dir=rollback_dir(paths))
    try:
        return parse_record(answer.get("current"))
    except ValueError:
        return None


def kept_record_targets(paths: dict) -> set[str] | None:
    """The link targets of the release kept for rollback on this host (its ReleaseRecords fact):
    pruning never removes them. None when the record cannot be read: then nothing is pruned."""
    answer = host.get_fact(ReleaseRecords, record=release_record_file(paths), kept_dir=rollback_dir(paths))
    try:
        previous = parse_record(answer.get("previous"))
    except ValueError as error:
        note(f"prune: skipped - the kept release record is unreadable ({error}); remove "
             f"{rollback_dir(paths)} or re-deploy to record a new one")
        return None
    return set(previous.links.values()) if previous else set()


def prune_dirs(name: str, layout: dict, directory: str, current: str, previous: str | None, keep: int, prefix: str = "") -> None:
    """Remove lifecycle.stale_dirs among `directory`'s subdirectories whose names start with `prefix`:
    never `current`, `previous` (the one this deploy replaces) nor the kept record's targets."""
    paths = [f"{directory}/{entry}" for entry in host.get_fact(Subdirectories, path=directory) or []
             if entry.startswith(prefix)]  # oldest first
    replaced = {previous} & set(paths) if previous not in (None, current) else set()
    old = stale_dirs(paths, current, replaced, keep)
    if old and not replaced:  # nothing replaced now: the rollback target is the kept record's (read only when it matters)
        kept = kept_record_targets(layout)
        old = [] if kept is None else stale_dirs(paths, current, kept & set(paths), keep)
    if old:
        server.shell(name=name, commands=["rm -rf -- " + " ".join(shlex.quote(path) for path in old)])


def check(function):
    """A `python.call` check whose failure is its one red line, not a traceback: pyinfra prints a
    traceback for any exception a callback raises, and the run summary already says what failed and
    the report holds the evidence (issue 32). The wrapped function raises OperationError to fail."""

    @functools.wraps(function)
    def run(state, host, *args, **kwargs):  # `state` and `host` named: pyinfra hands them in, no greenlet
        with ctx_config.use(state.config.copy()), ctx_host.use(host):
            try:
                function(*args, **kwargs)
            except OperationError as error:
                host.log_styled(str(error), fg="red", log_func=logger.error)
                return False
        return True

    return run


def release_dir(decision: Decision) -> str:
    return decision.stack.layout.release_dir(decision.stack.stack_hash)


def release_venv(decision: Decision) -> str:
    return decision.stack.layout.release_venv(decision.stack.stack_hash)


def model_dir(decision: Decision, entry: dict) -> str:
    """A model's versioned directory on the host (the weights role fills it, the service role links it)."""
    return decision.stack.layout.model_dir(entry)


def wheelhouse_dir(decision: Decision) -> Path:
    """The controller wheelhouse for this build: qwen27b_wheelhouse_dir, or the cache's default."""
    if decision.settings.wheelhouse_dir:
        return Path(decision.settings.wheelhouse_dir).expanduser()
    vllm, py = decision.stack.profile["vllm"], decision.stack.profile["python"]["version"]
    return cache_root() / "wheelhouse" / f"{vllm['dist']}-{vllm['version']}-cp{py.replace('.', '')}"


def pushed_wheelhouse(decision: Decision) -> Path | None:
    """The controller wheelhouse this deploy pushes, or None. The cache's default one (the CPU build's)
    yields to a source the host data names (qwen27b_wheel_mirror, qwen27b_pypi_index): the deploy
    fetches from what the settings say; qwen27b_wheelhouse_dir, named too, comes first."""
    local = wheelhouse_dir(decision)
    settings = decision.settings
    if not (local.is_dir() and any(local.glob("*.whl"))):
        return None
    return local if settings.wheelhouse_dir or not (settings.wheel_mirror or settings.pypi_index) else None


def engine_wheel(decision: Decision) -> tuple:
    """(file, sha256, where from) of the engine wheel this deploy installs, for the release record:
    the pushed wheelhouse's (uv checks it with --require-hashes), else the stack's release URL's when
    pinned with its sha256; () when it installs by name from a lab mirror or an index, where no hash
    is known before it runs (issue 25). The same order of sources as _install_commands."""
    vllm = decision.stack.profile["vllm"]
    local = pushed_wheelhouse(decision)
    if local is not None:
        wheels = {name: digest for name, digest in dir_manifest(local).items()
                  if name.endswith(".whl") and normalize(name.split("-", 1)[0]) == normalize(vllm["dist"])}
        return next(((name, digest, "controller wheelhouse") for name, digest in sorted(wheels.items())), ())
    if decision.settings.wheel_mirror or not (vllm.get("url") and vllm.get("sha256")):
        return ()
    return vllm["url"].rsplit("/", 1)[-1], vllm["sha256"], "stack release URL"


def uv_on_host(decision: Decision) -> str:
    """Where the uv binary is on the host (the vllm role installs with it; uv's Python route needs it)."""
    return decision.stack.layout.uv


def apt_lock_timeout() -> int:
    """Seconds every apt-get install/purge waits for the dpkg lock (stack tools.apt.lock_timeout_s)."""
    return int(load_stack()["tools"]["apt"]["lock_timeout_s"])


def apt_lock_option() -> str:
    """unattended-upgrades holds the dpkg lock on a first boot: apt waits for it, bounded, printing that it
    waits, then fails naming the process that holds it [apt-lock-timeout]."""
    return f"-o DPkg::Lock::Timeout={apt_lock_timeout()}"


def apt_install(name: str, packages: list[str], no_recommends: bool = False) -> bool:
    """apt.packages (refreshing the index first) only when something is missing: a converged host
    is left alone, and pyinfra's op, which reads `dpkg -l` again twice, is not queued. Returns
    whether the host will change."""
    installed = host.get_fact(DebPackages) or {}
    missing = [p for p in packages if p not in installed]
    if not missing:
        note(f"apt: {name} installed ({', '.join(packages)})")
        return False
    return apt.packages(name=name, packages=packages, update=True, cache_time=3600,
                        no_recommends=no_recommends, extra_install_args=apt_lock_option()).will_change


def service_user(user: str, home: str) -> None:
    """The system user the service runs as, with no login. pyinfra's server.user reads every
    account (its `Users` fact: ~0.7 s a read, twice a run), so it runs only when one cheap
    `getent` shows the user missing or different."""
    want = {"home": home, "shell": "/usr/sbin/nologin", "group": user}
    have = host.get_fact(ServiceUser, user=user)
    if have and have["uid"] < 1000 and all(have[key] == value for key, value in want.items()):
        note(f"toolchain: service user {user} exists (system uid {have['uid']}, no login, home {home})")
        return
    server.group(name=f"group {user}", group=user, system=True)
    server.user(name=f"service user {user} (system, no login)", user=user, group=user, system=True,
                home=home, shell=want["shell"], create_home=False)


def started(unit: str, restart: bool, why: str, command: str | None = None) -> None:
    """A unit enabled and running; with `restart` (what it runs changed) enabled and restarted by
    `command` (default `systemctl restart UNIT`), the plan saying `why`."""
    if restart:
        systemd.service(name=f"enable {unit}", service=unit, running=None, enabled=True)
        server.shell(name=f"restart {unit} ({why})", commands=[command or f"systemctl restart {unit}"])
    else:
        systemd.service(name=f"{unit} enabled and running", service=unit, running=True, enabled=True)


def reach_notes(name: str) -> list[str]:
    """The plan's reach lines for a host checked on `--dry` (empty otherwise): one per source, with
    the setting that would point a failing fetch elsewhere."""
    rows = runstate.current().reach.get(name) or []
    return [f"reach: {r.source} <- {r.url}: {r.result}" + (f" (fix: {r.fix})" if r.ok is False and r.fix else "")
            for r in rows]


def python_to_fetch(decision: Decision, failed: tuple[str, ...]) -> bool:
    """Whether the controller should download uv's Python build for this host before its plan is
    printed (sources.controller_fetches_python: uv would fetch it from GitHub on a host that may not
    reach it, and the cache lacks it). A dry run fetches nothing: the toolchain says what a deploy tries."""
    py, rs = decision.stack.profile["python"], decision.stack
    if py.get("route") == "system" or decision.facts.pythons.get(py["version"]):
        return False
    source = sources.python_source(decision.settings, rs.fetch_sources, py["version"], python_builds())
    return sources.controller_fetches_python(decision.settings, source, py["version"],
                                             sources.github_failed(failed, rs.fetch_sources))
