"""`systemctl show` asked one way and read one way (qwen27b/onhost/unit.py): the health check on the
host, verify, doctor and status each built their own command and three parsers read the answer."""

from __future__ import annotations

import subprocess

from qwen27b.onhost import unit
from qwen27b.onhost.contract import UNIT_PROPERTIES
from qwen27b.onhost.unit import parse_show, show_command
from qwen27b.tools import status
from qwen27b.tools.doctor import collection
from qwen27b.plan.stack import load_stack

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
