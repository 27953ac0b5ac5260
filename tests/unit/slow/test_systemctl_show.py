"""`systemctl show` asked one way and read one way (qwen27b/onhost/unit.py): the health check on the
host, verify, doctor, status and the uninstall's fact each built their own command and three parsers
read the answer. The shell lines are run for real in bash, with a stand-in `systemctl` on PATH that
prints what it was given (no systemd here to ask)."""

from __future__ import annotations

import os
import subprocess

from qwen27b.onhost import unit
from qwen27b.onhost.contract import UNIT_PROPERTIES
from qwen27b.controller.host_facts import DeployedState
from qwen27b.onhost.unit import invocation_word, parse_show, show_command, state_command
from qwen27b.tools import status
from qwen27b.tools.doctor import collection
from qwen27b.plan.stack import load_stack
from tests.support.paths import ROOT

# what systemd 249 printed on the test host for `systemctl show -p ActiveState,SubState,Result,NRestarts ...`
RECORDED = "ActiveState=activating\nSubState=auto-restart\nResult=exit-code\nNRestarts=3\nExecStart={ path=/x ; argv[]=/x a=b }\n"


def test_the_command_names_the_properties_then_the_unit():
    assert show_command("qwen27b@a.service", ("ActiveState", "SubState")) == \
        "systemctl show -p ActiveState,SubState qwen27b@a.service"


def test_the_parser_reads_values_with_equals_signs_and_skips_other_lines():
    props = parse_show(RECORDED + "garbage\n=novalue\nActiveState=failed\n")
    assert props["ActiveState"] == "activating" and props["NRestarts"] == "3"
    assert props["ExecStart"] == "{ path=/x ; argv[]=/x a=b }" and "" not in props


def test_the_health_check_asks_with_the_same_command(monkeypatch):
    asked = []

    def run(argv, **_):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, RECORDED, "")

    monkeypatch.setattr(unit.subprocess, "run", run)
    assert unit.unit_properties("qwen27b.service")["SubState"] == "auto-restart"
    assert " ".join(asked[0]) == show_command("qwen27b.service", UNIT_PROPERTIES)


def test_doctor_and_status_ask_with_the_same_command():
    paths = load_stack()["paths"]
    assert collection.commands(load_stack())["systemctl-show.txt"] == show_command("qwen27b.service", collection.SHOW_PROPS)
    assert show_command("qwen27b.service", status.UNIT_PROPS) in status.commands(paths)["unit"]


def _bash(tmp_path, line: str, answer: str = "") -> list[str]:
    """Run `line` in bash with a `systemctl` that prints each argument it got on a line of its own,
    then `answer` (what systemd would print)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\nprintf 'arg %s\\n' \"$@\"\nprintf '{answer}'\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, check=True).stdout.splitlines()


def test_a_loops_unit_is_expanded_by_the_shell_and_stays_one_word(tmp_path):
    """status's loop over the copies and the uninstall's loop over units name the unit by a shell
    variable: the builder passes it as it is (expand), and it reaches systemctl as one argument."""
    line = show_command('"qwen27b@$n.service"', status.UNIT_PROPS, expand=True)
    assert line in status.copies_command(load_stack()["paths"])
    assert _bash(tmp_path, f'n="a b"; {line}') == ["arg show", "arg -p", "arg LoadState,ActiveState,SubState,NRestarts",
                                                    "arg qwen27b@a b.service"]
    each = show_command('"$u"', ("ActiveState",), value=True, expand=True)
    assert each in DeployedState().command(["/opt/qwen27b"], ["qwen27b.service"], ["qwen27b"], "inet qwen27b")


def test_verifys_state_line_and_this_starts_invocation_come_from_the_same_builder(tmp_path):
    assert state_command("qwen27b.service").startswith(show_command("qwen27b.service", ("ActiveState", "SubState"), value=True))
    # systemd prints the bare values one per line; verify's line joins them
    assert _bash(tmp_path, state_command("qwen27b.service"), "activating\\nstart\\n")[-1] == \
        "arg show/arg -p/arg ActiveState,SubState/arg --value/arg qwen27b.service/activating/start"
    assert _bash(tmp_path, f"echo {invocation_word('qwen27b@a.service')}", "3f2a\\n") == \
        ["arg show arg -p arg InvocationID arg --value arg qwen27b@a.service 3f2a"]


def test_no_other_code_builds_a_systemctl_show():
    """Every `systemctl show` in the shipped and controller code comes from onhost/unit.py: a string
    holding it anywhere else (docstrings and comments aside) is a second builder."""
    import ast

    root = ROOT
    found = []
    for path in [*root.joinpath("qwen27b").rglob("*.py"), *root.joinpath("roles").glob("*.py"), root / "deploy.py"]:
        if path.name == "unit.py" and path.parent.name == "onhost":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        found += [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and "systemctl show" in node.value]
    assert found == []
