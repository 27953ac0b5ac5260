"""What the roles share (roles/_common.py): the one "started or restarted" operation, and what a
rollback undoes as explicit types (a switched link, the kept serving files), not a ';'-joined
string under ROLLBACK_DIR's name."""

from __future__ import annotations

from roles._common import ROLLBACK_DIR, KeptFiles, SwitchedLink
from roles.verify import _rollback_commands


def test_a_rollback_copies_the_kept_files_back_and_points_each_link_back():
    unit, env = "/etc/systemd/system/qwen27b.service", "/etc/qwen27b/qwen27b.env"
    commands = _rollback_commands([SwitchedLink("/opt/qwen27b/current", "/opt/qwen27b/releases/abc"),
                                   KeptFiles((unit, env))])
    assert commands[0] == ("ln -sfn /opt/qwen27b/releases/abc /opt/qwen27b/current.new && "
                           "mv -Tf /opt/qwen27b/current.new /opt/qwen27b/current")
    assert commands[1:3] == [f"cp -a {ROLLBACK_DIR}/qwen27b.service {unit}", f"cp -a {ROLLBACK_DIR}/qwen27b.env {env}"]
    assert commands[3].startswith(f"if [ -d {ROLLBACK_DIR}.prev ]") and commands[4] == "systemctl daemon-reload"
    assert len(commands) == 6  # and the restart


def test_a_link_whose_target_holds_a_semicolon_is_a_link():
    """The old sentinel told kept files from links by the link's name and split the target at ';'."""
    commands = _rollback_commands([SwitchedLink("/var/lib/qwen27b/models/current", "/var/lib/qwen27b/models/a;b")])
    assert commands[0].startswith("ln -sfn '/var/lib/qwen27b/models/a;b' ")
