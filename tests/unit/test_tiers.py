"""The test tiers are folders (issue 50 item 4; tests/conftest.py TIERS): a module's folder gives its
markers, so a new module placed in tests/unit is in `./run tests fast` with no list to update, and one
outside every tier folder, or one using the vLLM server outside tests/servers, stops the collection.
Shared helpers live in tests/support/: no test module imports another."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT, TESTS

TIERS = ("unit", "unit/slow", "plans", "servers", "e2e")
MODULES = sorted(TESTS.rglob("test_*.py"))
THROWAWAY = "def test_throwaway():\n    assert True\n"


def collect(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest --collect-only on a copy of the tests' root conftest (the real one, with what it imports)."""
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tree), "-c", str(tree / "pyproject.toml"), *args, str(tree / "tests")],
                          cwd=tree, capture_output=True, text=True, timeout=120)


def lab_tree(tmp_path: Path, modules: dict[str, str]) -> Path:
    """A repository's tests/ with the real root conftest and pyproject.toml, and `modules` (path: text)."""
    (tmp_path / "tests").mkdir()
    for name in ("conftest.py", "setupcheck.py"):
        shutil.copy(TESTS / name, tmp_path / "tests" / name)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, text in modules.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def test_a_new_module_is_in_its_tier_by_its_folder(tmp_path):
    tree = lab_tree(tmp_path, {f"tests/{tier}/test_new_{tier.replace('/', '_')}.py": THROWAWAY for tier in TIERS})
    fast = collect(tree, "-m", "fast")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert "tests/unit/test_new_unit.py::test_throwaway" in fast.stdout
    assert "tests/plans/test_new_plans.py::test_throwaway" in fast.stdout
    assert "slow" not in fast.stdout and "servers" not in fast.stdout and "e2e" not in fast.stdout
    servers = collect(tree, "-m", "servers")
    assert [line for line in servers.stdout.splitlines() if "::" in line] == \
        ["tests/servers/test_new_servers.py::test_throwaway"], servers.stdout
    rest = collect(tree, "-m", "not servers and not e2e and not fast")
    assert [line for line in rest.stdout.splitlines() if "::" in line] == \
        ["tests/unit/slow/test_new_unit_slow.py::test_throwaway"], rest.stdout
    e2e = collect(tree, "-m", "e2e")
    assert [line for line in e2e.stdout.splitlines() if "::" in line] == ["tests/e2e/test_new_e2e.py::test_throwaway"]


def test_a_module_outside_every_tier_folder_stops_the_collection(tmp_path):
    tree = lab_tree(tmp_path, {"tests/test_astray.py": THROWAWAY, "tests/unit/test_fine.py": THROWAWAY})
    result = collect(tree)
    assert result.returncode != 0
    assert "test modules outside a tier folder: tests/test_astray.py" in result.stdout + result.stderr


def test_the_vllm_server_outside_tests_servers_stops_the_collection(tmp_path):
    tree = lab_tree(tmp_path, {"tests/unit/test_serves.py": "def test_it(vllm_server):\n    pass\n"})
    result = collect(tree)
    assert result.returncode != 0
    assert "vllm_server fixture outside tests/servers: tests/unit/test_serves.py::test_it" in result.stdout + result.stderr


def test_every_test_module_lies_in_a_tier_folder():
    astray = [m.relative_to(ROOT).as_posix() for m in MODULES
              if m.parent.relative_to(TESTS).as_posix() not in TIERS and not m.is_relative_to(TESTS / "support")]
    assert astray == []


def test_no_two_test_modules_share_a_name():
    # pytest imports each as its bare name (rootdir-relative sys.path entries): two would clash
    names = [m.name for m in MODULES if not m.is_relative_to(TESTS / "support")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_no_test_module_imports_another():
    """Helpers two modules share live in tests/support/ (or tests/*.py beside the root conftest), never
    in a test module: importing one pulls its tests and fixtures into the importer."""
    importers = [*MODULES, *TESTS.rglob("conftest.py"), *(TESTS / "support").rglob("*.py")]
    found = {(p.relative_to(ROOT).as_posix(), name) for p in importers for name in imported_modules(p)
             if name.split(".")[-1].startswith("test_")}
    assert sorted(found) == []
