"""Service: the systemd unit, its env file and the health timer, rendered from the plan.

daemon-reload and restart happen only when a rendered file changed; the service is started only
once a release venv exists (installing it is the vllm role's job), so a fresh host is never
left with a unit that can only crash-loop.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.operations import files, server, systemd

from qwen27b.gate import Decision
from qwen27b.render import HEALTH_TIMER, HEALTH_UNIT, SERVICE_UNIT, layout, render_all

from ._pending import note

UNIT_DIR = "/etc/systemd/system"


def service(decision: Decision) -> None:
    where = layout(decision)
    rendered = render_all(decision)
    files.directory(name="qwen27b config dir", path=where["config_dir"], user="root", group="root", mode="0755")
    targets = [
        ("qwen27b.env.j2", where["env_file"]),
        ("qwen27b.service.j2", f"{UNIT_DIR}/{SERVICE_UNIT}"),
        ("qwen27b-health.service.j2", f"{UNIT_DIR}/{HEALTH_UNIT}"),
        ("qwen27b-health.timer.j2", f"{UNIT_DIR}/{HEALTH_TIMER}"),
    ]
    written = [
        files.put(name=f"render {dest}", src=StringIO(rendered[template]), dest=dest, user="root", group="root", mode="0644")
        for template, dest in targets
    ]
    changed = any(op.will_change for op in written)
    if changed:
        systemd.daemon_reload(name="systemd daemon-reload (a unit file changed)")

    release_python = f"{where['venv']}/bin/python"
    if host.get_fact(File, path=release_python) is None:
        note(f"service: {SERVICE_UNIT} written but not started: no release at {release_python} yet "
             "(the vllm role installs it)")
        return
    systemd.service(name=f"enable {SERVICE_UNIT}", service=SERVICE_UNIT, enabled=True)
    systemd.service(name=f"enable + start {HEALTH_TIMER}", service=HEALTH_TIMER, running=True, enabled=True)
    # --no-block: model load can take many minutes on V100; the verify role waits with progress.
    server.shell(name=f"restart {SERVICE_UNIT} (rendered files changed)",
                 commands=[f"systemctl restart --no-block {SERVICE_UNIT}"]) if changed else \
        systemd.service(name=f"start {SERVICE_UNIT}", service=SERVICE_UNIT, running=True)
