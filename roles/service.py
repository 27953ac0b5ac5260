"""Service: the systemd unit, its env file, the health timer and the health endpoint's socket,
rendered from the plan; the `current` release switched atomically; daemon-reload and a restart only
when something changed.

The restart is `--no-block`: loading 27B weights takes minutes on V100, and the verify role waits
for readiness with progress instead of pyinfra hanging silently.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, server, systemd

from qwen27b.plan.gate import Decision
from qwen27b.plan.hostdata import http_base
from qwen27b.onhost.contract import HEALTH_HTTP_SOCKET, HEALTH_TIMER, HEALTH_UNIT, SERVICE_UNIT, TEXTFILE_DIR, textfile_name
from qwen27b.plan.hostlayout import UNIT_DIR, HostLayout
from qwen27b.controller import factcache, runstate, unitwords
from qwen27b.controller.host_facts import InstalledCopies, SecretFileState, Subdirectories, SymlinkTarget
from qwen27b.controller.operations import secret_file, symlink_switch
from qwen27b.controller.verifyplan import changed_names
from qwen27b.controller.render import HEALTH_HTTP_SERVICE, RESTART_COMMAND, render_all
from qwen27b.controller.render_copies import (INSTANCE_UNIT, copy_health_units, instance_files, instance_unit,
                                              render_instances)
from qwen27b.controller.releasefiles import copies_serving_files, serving_files
from qwen27b.plan.lifecycle import RECORD_NAME, Record, record_text, release_record_file

from ._common import (ROLLBACK_DIR, api_key, engine_wheel, model_dir, note, prune_dirs, release_dir, remember_kept,
                      remember_previous, restart_reasons, running_record, started)
from ._pairgate import measure_before_switch


def _will_change(rendered: dict, targets) -> bool:
    """Would any of these rendered files differ from the host's copy (plan-time, from facts)?"""
    for template, dest in targets:
        remote = host.get_fact(Sha1File, path=dest)
        if remote is not None and remote != hashlib.sha1(rendered[template].encode()).hexdigest():
            return True
    return False


def note_lab_key(decision: Decision) -> None:
    """Where the key the controller made is and how clients use it (never the key itself)."""
    lab_key = runstate.current().lab_key
    if lab_key and decision.settings.api_key_file == lab_key[0]:
        note(lab_key[1], always=True)


def service(decision: Decision) -> None:
    if decision.group is not None and decision.group.role == "worker":
        return  # a serving group's worker runs no API: its Ray node is the multinode role's
    if decision.copies:
        return service_copies(decision)
    where = unitwords.layout(decision)
    rendered = render_all(decision)
    targets = [
        ("qwen27b.env.j2", where["env_file"]),
        ("qwen27b.service.j2", HostLayout.unit_file(SERVICE_UNIT)),
        ("qwen27b-health.service.j2", HostLayout.unit_file(HEALTH_UNIT)),
        ("qwen27b-health.timer.j2", HostLayout.unit_file(HEALTH_TIMER)),
        ("qwen27b-health-http.socket.j2", HostLayout.unit_file(HEALTH_HTTP_SOCKET)),
        ("qwen27b-health-http@.service.j2", HostLayout.unit_file(HEALTH_HTTP_SERVICE)),
    ]
    units = len(targets) - 1  # every target but the env file is a unit file
    kept = serving_files(decision.stack.paths)  # env, unit (targets[:2]), health unit and the record: what a rollback restores
    factcache.prefetch([read for _, dest in targets for read in factcache.put_reads(dest, create_remote_dir=False)]
                       + factcache.put_reads(release_record_file(decision.stack.paths), create_remote_dir=False)
                       + [(SymlinkTarget, {"path": decision.stack.layout.current_release}),
                          (Subdirectories, {"path": decision.stack.layout.releases})]
                       + ([(SecretFileState, {"path": where["secrets_file"]})] if decision.settings.api_key_file else [])
                       + factcache.service_reads(SERVICE_UNIT) + factcache.service_reads(HEALTH_TIMER)
                       + factcache.service_reads(HEALTH_HTTP_SOCKET)
                       + [(InstalledCopies, {"unit_dir": UNIT_DIR, "config_dir": decision.stack.layout.config}),
                          (Sha1File, {"path": HostLayout.unit_file(INSTANCE_UNIT)})])
    remove_dropped_copies(decision)  # a host that served copies before: they hold its GPUs and port
    # the starts its flags were carried from (roles/preflight.py carried): the next deploy carries them again
    record = with_figures(release_record(decision, runstate.current().carried.get(host.name, ())), decision)
    record_file = release_record_file(decision.stack.paths)
    running = {link: host.get_fact(SymlinkTarget, path=link) for link in record.links}
    switching = any(now not in (None, record.links[link]) for link, now in running.items())
    if (switching or _will_change(rendered, targets[:2])) and all(host.get_fact(Sha1File, path=dest) for dest in kept[:-1]):
        keep_running_release(kept, record_file, Record({link: now for link, now in running.items() if now}))
        measure_before_switch(decision)  # the regression gate's before, seconds before the switch and restart
    # create_remote_dir=False: the unit dir is systemd's, the config dir the toolchain role's (pyinfra's check: 2 commands a file)
    written = [
        files.put(name=f"render {dest}", src=StringIO(rendered[template]), dest=dest, user="root", group="root",
                  mode="0644", create_remote_dir=False)
        for template, dest in targets
    ]
    files.put(name=f"render {record_file} (what runs here; the rollback deploy reads it)",
              src=StringIO(record_text(record)), dest=record_file, user="root", group="root", mode="0644",
              create_remote_dir=False)
    note_lab_key(decision)
    if decision.settings.api_key_file:
        # VLLM_API_KEY: every route but /health needs it (the route guard); in a root-only 0600 file,
        # never in the unit or on a command line. secret_file, not files.put: --diff would print the
        # new key and, on rotation, the old one
        written.append(secret_file(name="API key env file (0600)", dest=where["secrets_file"],
                                   content=f"VLLM_API_KEY={api_key(decision)}\n"))
    current = decision.stack.layout.current_release
    previous = host.get_fact(SymlinkTarget, path=current)
    if previous != release_dir(decision):
        remember_previous(current, previous)
    release = symlink_switch(name="activate the release (current symlink)", link=current, target=release_dir(decision))
    prune_dirs("prune old releases", decision.stack.paths, decision.stack.layout.releases, release_dir(decision), previous,
               decision.settings.keep_releases)
    if any(op.will_change for op in written[1:1 + units]):
        systemd.daemon_reload(name="systemd daemon-reload (a unit file changed)")
    # env, main unit, API key, release, weights...: what serves (the health units never restart vLLM); verify's check
    changes = changed_names([("the env file", written[0]), ("the unit (its flags)", written[1]), ("the release", release)]
                            + [("the API key", op) for op in written[1 + units:]]) + restart_reasons()
    runstate.current().serving_changes[host.name] = {SERVICE_UNIT: tuple(changes)}
    started(SERVICE_UNIT, bool(changes), "config, release or weights changed", RESTART_COMMAND)
    systemd.service(name=f"{HEALTH_TIMER} enabled and running", service=HEALTH_TIMER, running=True, enabled=True)
    health_endpoint(dict(zip((template for template, _ in targets), written))["qwen27b-health-http.socket.j2"])


def release_record(decision: Decision, attempts: tuple = ()) -> Record:
    """What this deploy makes the host run (qwen27b.plan.lifecycle): every symlink's target and how
    verify reaches the service. Written to the host, so a later rollback knows it without this run."""
    serve, model = decision.serve, decision.stack.model
    links = {decision.stack.layout.current_release: release_dir(decision), decision.model_path: model_dir(decision, model)}
    if decision.draft_path:
        links[decision.draft_path] = model_dir(decision, decision.stack.draft)
    return Record(links, model_ref=f"{model['id']}@{model['revision']}",
                  url=http_base(serve.value('--host'), serve.value('--port')),
                  served_name=serve.value("--served-model-name"), speculative=serve.has("--speculative-config"),
                  start_timeout_s=decision.stack.profile["serve"]["start_timeout_s"],
                  flags=tuple(f"{flag.name} {flag.value}" if flag.value is not None else flag.name for flag in serve.flags),
                  attempts=attempts, engine_wheel=engine_wheel(decision))


def with_figures(record: Record, decision: Decision) -> Record:
    """The running release's verify figures (written by verify after it measured: plan/regression.py)
    stay in its record while it runs: a deploy that changes nothing else rewrites nothing."""
    running = running_record(decision.stack.paths)
    if running is not None and (running.verify or running.baseline) \
            and dataclasses.replace(running, verify={}, baseline={}) == record:
        return dataclasses.replace(record, verify=running.verify, baseline=running.baseline)
    return record


def keep_running_release(serving_files: list[str], record_file: str, links_now: Record) -> None:
    """Before anything running is replaced: its units, env and release record into the rollback dir
    (a host deployed before records existed gets one made of its symlinks as they are now). The
    verify role restores them if the new release fails; the rollback deploy, on demand."""
    keep = ROLLBACK_DIR
    q = shlex.quote
    # the kept release before this one waits in .prev until the new one verifies: a deploy that is
    # rolled back puts it back (roles/verify.py), so a failed upgrade never loses the rollback target
    server.shell(name="keep the running release (units, env, record) for rollback", commands=[
        f"rm -rf {keep}.prev && {{ [ ! -d {keep} ] || mv -T {keep} {keep}.prev; }} && mkdir -p {keep} && "
        f"cp -a {' '.join(serving_files[:-1])} {keep}/ && "
        f"{{ cp -a {record_file} {keep}/ 2>/dev/null || printf '%s' {q(record_text(links_now))} > {keep}/{RECORD_NAME}; }}"])
    remember_kept(serving_files)


def health_endpoint(socket_file) -> None:
    """The health endpoint's socket listening and enabled. A changed socket unit (address, port,
    allow-list) takes effect only when systemd binds again: restart the socket then; a changed
    request service needs nothing (the next connection starts the new definition)."""
    if socket_file.will_change:
        server.shell(name=f"(re)start {HEALTH_HTTP_SOCKET} (its unit changed)",
                     commands=[f"systemctl enable {HEALTH_HTTP_SOCKET}", f"systemctl restart {HEALTH_HTTP_SOCKET}"])
    else:
        systemd.service(name=f"{HEALTH_HTTP_SOCKET} enabled and listening", service=HEALTH_HTTP_SOCKET,
                        running=True, enabled=True)


def installed_copies(decision: Decision) -> list[str]:
    """The copies the host holds now (their enabled units, health timers or env files)."""
    return host.get_fact(InstalledCopies, unit_dir=UNIT_DIR, config_dir=decision.stack.layout.config) or []


def copy_files(paths: dict, name: str) -> list[str]:
    """Every file the deploy writes for one copy: its env and key files, its health check's unit
    files, status file, restart request and textfile (uninstall removes them by pattern)."""
    at = HostLayout.of(paths)
    return ([*instance_files(paths, name).values()] + [HostLayout.unit_file(u) for u in copy_health_units(name)]
            + [at.copy_health_status(name), at.copy_restart_request(name), f"{TEXTFILE_DIR}/{textfile_name(name)}"])


def remove_dropped_copies(decision: Decision) -> None:
    """A copy the inventory no longer lists (qwen27b_instances) is stopped, disabled and its files
    removed, each by its own operation that names it, before the listed copies (or the one service)
    start: they may take its GPUs or port. Its health timer goes first: left running, it would start
    its check again. A host back to one service loses the copies' template unit too."""
    listed = {i.name for i, _ in decision.copies}
    installed = installed_copies(decision)
    for name in installed:
        if name in listed:
            continue
        check, timer = copy_health_units(name)
        unit = instance_unit(name)
        server.shell(name=f"stop and remove copy '{name}' ({unit}, {timer}: no longer in qwen27b_instances)",
                     commands=[f"systemctl disable --now {timer} {unit} 2>/dev/null || true",
                               f"systemctl stop {check} 2>/dev/null || true",
                               "rm -f " + " ".join(shlex.quote(f) for f in copy_files(decision.stack.paths, name)),
                               "systemctl daemon-reload",
                               f"systemctl reset-failed {unit} {check} {timer} 2>/dev/null || true"])
    template = HostLayout.unit_file(INSTANCE_UNIT)
    if not decision.copies and (installed or host.get_fact(Sha1File, path=template)):
        server.shell(name=f"remove {INSTANCE_UNIT} (the host serves one service, no copies)",
                     commands=[f"rm -f {template}", "systemctl daemon-reload"])


def service_copies(decision: Decision) -> None:
    """Several copies (qwen27b_instances): the templated unit qwen27b@.service once, each copy's env
    file (its GPUs, flags and URL) and API key file, the `current` release switched, and each
    qwen27b@NAME.service restarted only when its own files, the unit, the release or the weights
    changed. A host that served one copy before gets qwen27b.service and its health units stopped
    and removed first (the copies need its GPUs and port). Each copy gets its own health check and
    timer, qwen27b-health@NAME.service/.timer (render_copies.instance_health_contexts), and the host's one
    health endpoint answers each copy on /health/NAME; a changed health unit never restarts a copy."""
    paths, at = decision.stack.paths, decision.stack.layout
    note_lab_key(decision)
    rendered = render_instances(decision)
    unit_file = HostLayout.unit_file(INSTANCE_UNIT)
    health = [unit for i, _ in decision.copies for unit in copy_health_units(i.name)] + [HEALTH_HTTP_SOCKET,
                                                                                        HEALTH_HTTP_SERVICE]
    targets = [(INSTANCE_UNIT, unit_file)] + [(f"{i.name}.env", instance_files(paths, i.name)["env_file"])
                                             for i, _ in decision.copies] + [(unit, HostLayout.unit_file(unit)) for unit in health]
    keys = {i.name: instance_files(paths, i.name)["secrets_file"] for i, copy in decision.copies if copy.settings.api_key_file}
    # the health endpoint stays (rewritten below: it answers each copy on /health/NAME)
    single = [HostLayout.unit_file(unit) for unit in (SERVICE_UNIT, HEALTH_TIMER, HEALTH_UNIT)]
    factcache.prefetch([read for _, dest in targets for read in factcache.put_reads(dest, create_remote_dir=False)]
                       + factcache.put_reads(release_record_file(paths), create_remote_dir=False)
                       + [(SymlinkTarget, {"path": at.current_release}), (Subdirectories, {"path": at.releases})]
                       + [(SecretFileState, {"path": dest}) for dest in keys.values()]
                       + [(Sha1File, {"path": path}) for path in single]
                       + [read for i, _ in decision.copies for read in factcache.service_reads(instance_unit(i.name))]
                       + [read for i, _ in decision.copies for read in factcache.service_reads(copy_health_units(i.name)[1])]
                       + factcache.service_reads(HEALTH_HTTP_SOCKET)
                       + [(InstalledCopies, {"unit_dir": UNIT_DIR, "config_dir": at.config})])
    remove_dropped_copies(decision)
    if host.get_fact(Sha1File, path=HostLayout.unit_file(SERVICE_UNIT)):
        server.shell(name=f"stop and remove {SERVICE_UNIT} and its health check (the host now serves copies)",
                     commands=[f"systemctl disable --now {SERVICE_UNIT} {HEALTH_TIMER}",
                               "rm -f " + " ".join(path for path in single)])
    # the running release's unit, env files and record kept for `qwen27b rollback` before any is replaced
    kept = copies_serving_files(paths, [i.name for i, _ in decision.copies])
    record = release_record(decision)
    running = {link: host.get_fact(SymlinkTarget, path=link) for link in record.links}
    switching = any(now not in (None, record.links[link]) for link, now in running.items())
    if (switching or _will_change(rendered, targets[:1 + len(decision.copies)])) \
            and all(host.get_fact(Sha1File, path=dest) for dest in kept[:-1]):
        keep_running_release(kept, release_record_file(paths), Record({link: now for link, now in running.items() if now}))
    def put(template: str, dest: str):
        return files.put(name=f"render {dest}", src=StringIO(rendered[template]), dest=dest, user="root",
                         group="root", mode="0644", create_remote_dir=False)

    # one call site per kind of file: pyinfra names an operation by its call site and count, so the
    # k-th call of one site must be the same file on every host (a host with one copy beside one with
    # two would otherwise merge "render qwen27b@b.env" with "render qwen27b-health@a.service")
    dests = dict(targets)
    written = {INSTANCE_UNIT: put(INSTANCE_UNIT, unit_file)}
    for i, _ in decision.copies:
        written[f"{i.name}.env"] = put(f"{i.name}.env", dests[f"{i.name}.env"])
    for i, _ in decision.copies:
        check = copy_health_units(i.name)[0]
        written[check] = put(check, dests[check])
    for i, _ in decision.copies:
        timer = copy_health_units(i.name)[1]
        written[timer] = put(timer, dests[timer])
    written[HEALTH_HTTP_SOCKET] = put(HEALTH_HTTP_SOCKET, dests[HEALTH_HTTP_SOCKET])
    written[HEALTH_HTTP_SERVICE] = put(HEALTH_HTTP_SERVICE, dests[HEALTH_HTTP_SERVICE])
    files.put(name=f"render {release_record_file(paths)} (the release; the first copy's URL)",
              src=StringIO(record_text(record)), dest=release_record_file(paths), user="root",
              group="root", mode="0644", create_remote_dir=False)
    for (instance, copy) in decision.copies:
        if instance.name in keys:
            written[instance.name] = secret_file(name=f"API key env file of copy {instance.name} (0600)",
                                                 dest=keys[instance.name],
                                                 content=f"VLLM_API_KEY={api_key(copy)}\n")
    current = at.current_release
    previous = host.get_fact(SymlinkTarget, path=current)
    if previous != release_dir(decision):
        remember_previous(current, previous)
    release = symlink_switch(name="activate the release (current symlink)", link=current, target=release_dir(decision))
    prune_dirs("prune old releases", paths, at.releases, release_dir(decision), previous,
               decision.settings.keep_releases)
    if any(written[unit].will_change for unit in [INSTANCE_UNIT] + health):
        systemd.daemon_reload(name="systemd daemon-reload (a unit file changed)")
    shared = changed_names([("the unit (its flags)", written[INSTANCE_UNIT]), ("the release", release)]) + restart_reasons()
    for instance, _ in decision.copies:
        unit = instance_unit(instance.name)
        own = [("the copy's env file", written[f"{instance.name}.env"])] + ([("the API key", written[instance.name])]
                                                                            if instance.name in keys else [])
        changes = runstate.current().serving_changes.setdefault(host.name, {})[unit] = tuple(shared + changed_names(own))
        started(unit, bool(changes), "config, release or weights changed",
                f"systemctl stop {unit}; systemctl reset-failed {unit}; systemctl start --no-block {unit}")
        timer = copy_health_units(instance.name)[1]
        systemd.service(name=f"{timer} enabled and running", service=timer, running=True, enabled=True)
    health_endpoint(written[HEALTH_HTTP_SOCKET])
