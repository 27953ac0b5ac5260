"""Tiny pyinfra deploy for the e2e test hosts: one file + one enabled, running systemd unit.

    pyinfra -y INVENTORY tests/support/deploy_smoke.py

A second run must report no changes (checked by tests/e2e/test_testhosts.py).
"""

from io import StringIO

from pyinfra.operations import files, systemd

UNIT = """\
[Unit]
Description=qwen27b e2e smoke unit (deployed by pyinfra)

[Service]
Type=simple
ExecStart=/bin/sh -c 'cat /opt/q27t-smoke/marker; exec sleep infinity'

[Install]
WantedBy=multi-user.target
"""

files.directory(name="smoke directory", path="/opt/q27t-smoke", mode="755")

files.put(
    name="smoke marker file",
    src=StringIO("deployed by pyinfra over ssh\n"),
    dest="/opt/q27t-smoke/marker",
    mode="644",
)

unit = files.put(
    name="smoke unit file",
    src=StringIO(UNIT),
    dest="/etc/systemd/system/q27t-smoke.service",
    mode="644",
)

# did_change is a method: use it as the _if condition, never as a value (see TESTHOSTS.md)
systemd.daemon_reload(name="daemon-reload after unit change", _if=unit.did_change)

systemd.service(
    name="smoke service enabled and running",
    service="q27t-smoke.service",
    running=True,
    enabled=True,
)
