"""Multi-node: on a member of a serving group (qwen27b/plan/multinode.py), Ray in the release venv and
the Ray node's unit, `qwen27b-ray.service`. On the head it starts and stops with qwen27b.service
(PartOf=, and qwen27b.service Requires= it), so the service role's restart restarts both; a worker
runs no API: this role writes its env file and keeps its Ray worker running, restarted on change.
A host that left its group loses the unit again. Runs before the service role: the head's
qwen27b.service needs the Ray unit to exist when it starts.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.operations import files, server, systemd

from qwen27b.controller.host_facts import VenvPackages
from qwen27b.controller.render import render, render_all
from qwen27b.controller.render_group import ray_context
from qwen27b.onhost.contract import RAY_UNIT
from qwen27b.plan.gate import Decision

from ._common import RAY_UNIT_FILE as UNIT_FILE, fetch_prefix, needs_restart, note, release_venv
from ._common import restart_needed, started, url_word


def multinode(decision: Decision) -> None:
    group = decision.group
    if group is None:
        if host.get_fact(File, path=UNIT_FILE):
            systemd.service(name=f"stop {RAY_UNIT} (no longer in a serving group)", service=RAY_UNIT,
                            running=False, enabled=False)
            files.file(name=f"remove {UNIT_FILE}", path=UNIT_FILE, present=False)
            systemd.daemon_reload(name="systemd daemon-reload (Ray unit removed)")
        return
    note(f"multinode: {group.role} of serving group '{group.name}', stage {group.stage.index + 1} of {group.pp} "
         f"({group.stage.span}), Ray on {group.address} ({group.interface}), GCS {group.head_address}")
    venv = release_venv(decision)
    installed = host.get_fact(VenvPackages, venv=venv) or {}
    changed = []
    if "ray" not in installed:
        requirement = shlex.quote(group.multinode["ray_requirement"])
        mirror = decision.settings.wheel_mirror
        links = f"PIP_FIND_LINKS={url_word(decision.settings, 'wheel_mirror')} " if mirror else ""
        index = f"PIP_INDEX_URL={url_word(decision.settings, 'pypi_index')} " if decision.settings.pypi_index else ""
        changed.append(server.shell(name="Ray into the release venv (vLLM's executor across hosts)",
                                    commands=[f"{fetch_prefix(decision)}{links}{index}{venv}/bin/python -m pip install {requirement}"]))
    unit_text = render("qwen27b-ray.service.j2", ray_context(decision))
    unit = files.put(name=f"render {UNIT_FILE}", src=StringIO(unit_text), dest=UNIT_FILE, user="root", group="root",
                     mode="0644", create_remote_dir=False)
    changed.append(unit)
    if group.role == "head":
        # the service role restarts qwen27b.service, and with it this unit (PartOf=), when either changed
        for op in changed:
            needs_restart(op, "the Ray install or unit")
        if unit.will_change:
            systemd.daemon_reload(name="systemd daemon-reload (Ray unit changed)")
        return
    env_file = decision.stack.layout.env_file
    env_text = render_all(decision)["qwen27b.env.j2"]
    env = files.put(name=f"render {env_file}", src=StringIO(env_text), dest=env_file, user="root", group="root",
                    mode="0644", create_remote_dir=False)
    if unit.will_change:
        systemd.daemon_reload(name="systemd daemon-reload (Ray unit changed)")
    started(RAY_UNIT, any(op.will_change for op in changed) or env.will_change or restart_needed(),
            "the Ray worker: config, release or weights changed", f"systemctl restart --no-block {RAY_UNIT}")
