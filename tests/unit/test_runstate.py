"""One owner for a run's state (issue 16): it hangs on pyinfra's State, so two States in one process
never share an answer, and no role keeps a module-level store of its own."""

from __future__ import annotations

import ast

from pyinfra.api import Config, Inventory, State

from qwen27b.controller import runstate
from tests.support.paths import ROOT

ROLES = ROOT / "roles"
# the run's machinery the roles call, moved out of them (issue 50): held to the same rule
RUN_MACHINERY = [ROOT / "qwen27b" / "controller" / f"{name}.py" for name in ("runlife", "runreport", "startwatch",
                                                                            "reachprobe")]
# the one per-process store: the SIGINT handler and atexit run outside pyinfra's context
PROCESS_WIDE = {("runlife.py", "_run")}


def _state(*hosts: str) -> State:
    return State(Inventory((list(hosts), {})), Config())


def test_each_state_has_its_own_run_state():
    first, second = _state("@fake/a"), _state("@fake/a")
    runstate.of(first).decisions["@fake/a"] = "decided in the first run"
    runstate.of(first).seed_token = "token-1"
    assert runstate.of(first) is runstate.of(first)
    assert runstate.of(second).decisions == {} and runstate.of(second).seed_token is None


def test_current_is_the_state_pyinfra_runs():
    from pyinfra.context import ctx_state

    first, second = _state("@fake/a"), _state("@fake/b")
    with ctx_state.use(first):
        runstate.current().refused["@fake/a"] = "refused"
    with ctx_state.use(second):
        assert runstate.current().refused == {}
    assert runstate.of(first).refused == {"@fake/a": "refused"}


def test_roles_keep_no_module_level_store():
    """A dict/list/set at module level in a role (or the run's machinery it calls) outlives its State:
    the bug runstate removes. UPPER_CASE names are constants (tables read, never written)."""
    found = []
    assert all(path.is_file() for path in RUN_MACHINERY)
    for path in sorted(ROLES.glob("*.py")) + RUN_MACHINERY:
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("dict", "list", "set", "defaultdict"))
            for target in targets:
                if (mutable and isinstance(target, ast.Name) and not target.id.isupper()
                        and (path.name, target.id) not in PROCESS_WIDE):
                    found.append(f"{path.name}: {target.id}")
    assert found == []
