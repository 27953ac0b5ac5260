"""The systemd unit names qwen27b installs are named once, in qwen27b/onhost/contract.py (issue 31):
no other module of the package, the roles or the deploy files spells one as a string of its own."""

from __future__ import annotations

import ast

from qwen27b.onhost import contract
from tests.support.paths import ROOT

UNITS = {value for name, value in vars(contract).items()
         if name.endswith(("_UNIT", "_TIMER", "_SOCKET", "_TEMPLATE")) and isinstance(value, str)}
SOURCES = sorted([*(ROOT / "qwen27b").rglob("*.py"), *(ROOT / "roles").glob("*.py"),
                  *(ROOT / name for name in ("deploy.py", "rollback.py", "uninstall.py"))])


def test_the_contract_names_the_units():
    assert {"qwen27b.service", "qwen27b@.service", "qwen27b-health.timer", "qwen27b-gateway.service"} <= UNITS


def test_no_other_module_spells_a_unit_name():
    spelled = [f"{path.relative_to(ROOT)}:{node.lineno} {node.value}" for path in SOURCES if path.name != "contract.py"
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant) and node.value in UNITS]
    assert spelled == []
