"""What the roles share (roles/_common.py, roles/_run.py): the one "started or restarted" operation, and what a
rollback undoes as explicit types (a switched link, the kept serving files), not a ';'-joined
string under ROLLBACK_DIR's name."""

from __future__ import annotations

from roles._common import ROLLBACK_DIR, KeptFiles, SwitchedLink
from roles.verify import _rollback_commands
from tests.support.paths import ROOT


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


# A role takes what it shares from the shared steps (_common, _run: underscore-named); these imports
# of a sibling remain, each a role's own work another role calls (the gate the weights fan-out asks
# about other hosts; the draft placed by the weights role's operation). Any other is a helper that
# belongs in a shared step, or the run's machinery in qwen27b/controller/ (issue 50).
SIBLING_IMPORTS = {("dflash", "weights"), ("weights", "preflight")}


def sibling_imports() -> set[tuple[str, str]]:
    """(role, sibling role) for each import of one role module by another, function-level included."""
    import ast

    found = set()
    for path in sorted((ROOT / "roles").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                name = module if node.level else module.removeprefix("roles.") if module.startswith("roles.") else None
                if name and not name.startswith("_") and name != path.stem:
                    found.add((path.stem, name.split(".")[0]))
    return found


def test_no_role_imports_a_siblings_helpers():
    assert sibling_imports() == SIBLING_IMPORTS
