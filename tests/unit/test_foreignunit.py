"""A lab's own unit on qwen27b's unit names (issue 52 item 1): the UnitFiles parser on the fact's real
command (run here in bash on unit files in a temporary directory), the gate's refusal on the recorded host
v100x2-lab-unit, the take-over with qwen27b_take_over_unit, and the take-over's and restore's commands run
for real in bash (systemctl, which a unit test cannot drive, replaced by a logger on PATH: the commands'
file handling is real, the systemctl calls are checked as the words they pass)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from qwen27b.controller import facts as F
from qwen27b.plan.foreignunit import (MARKER, foreign, foreign_units, parse_unit_files, restore_commands, shown,
                                      take_over_commands, units_command)
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.lifecycle import SERVICE_UNITS
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

LAB_UNIT = """[Unit]
Description=vLLM (lab)

[Service]
EnvironmentFile=-{env}
ExecStart=/opt/vllm/bin/python3 -m vllm.entrypoints.openai.api_server \\
    --model /data/models/Qwen2.5-32B-Instruct-AWQ --host 0.0.0.0 --port 8000 \\
    --api-key sk-lab-secret
Environment=HF_TOKEN=hf_not_read
Restart=always
"""
OURS = f"""{MARKER} from the plan; edit the inventory or stack file, not this file.
[Unit]
Description=qwen27b

[Service]
EnvironmentFile=/etc/qwen27b/qwen27b.env
ExecStart=/opt/qwen27b/current/venv/bin/vllm serve /var/lib/qwen27b/models/current \\
    --port 8000
"""


@pytest.fixture
def box(tmp_path: Path) -> dict:
    """A unit dir holding the lab's qwen27b.service and our health timer, the lab's env file, a state
    dir, and `systemctl` on PATH: is-enabled / is-active answer as for an enabled, running unit; every
    call is logged."""
    units, state, bin_dir = tmp_path / "system", tmp_path / "state", tmp_path / "bin"
    for d in (units, state, bin_dir):
        d.mkdir()
    env = tmp_path / "default" / "qwen27b"
    env.parent.mkdir()
    env.write_text("VLLM_API_KEY=sk-lab-secret\n")
    (units / "qwen27b.service").write_text(LAB_UNIT.format(env=env))
    (units / "qwen27b-health.timer").write_text(f"{MARKER}: runs the health check every 60 s.\n[Timer]\n")
    (units / "other.service").write_text("[Unit]\n")
    log = tmp_path / "systemctl.log"
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in is-enabled) echo enabled;; is-active) echo active;; esac\n')
    (bin_dir / "systemctl").chmod(0o755)
    return {"units": units, "state": state, "env": env, "log": log,
            "environ": os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}}


def bash(box: dict, commands: list[str] | str) -> subprocess.CompletedProcess:
    script = commands if isinstance(commands, str) else "set -e\n" + "\n".join(commands)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=box["environ"], timeout=60)


def read_fact(box: dict) -> dict:
    result = bash(box, units_command(str(box["units"]), str(box["state"] / "takeover")))
    assert result.returncode == 0, result.stderr
    return parse_unit_files(result.stdout.splitlines())


def test_the_fact_command_reads_first_line_execstart_and_env_file_only(box):
    fact = read_fact(box)
    by_name = {u["name"]: u for u in fact["units"]}
    assert set(by_name) == {"qwen27b.service", "qwen27b-health.timer"}  # other.service is not on our names
    lab = by_name["qwen27b.service"]
    assert lab["first"] == "[Unit]" and lab["env_files"] == [f"-{box['env']}"]
    assert lab["exec_start"].startswith("/opt/vllm/bin/python3 -m vllm.entrypoints.openai.api_server --model ")
    assert lab["exec_start"].endswith("--port 8000 --api-key sk-lab-secret")
    assert (lab["enabled"], lab["active"]) == ("enabled", "active")
    assert "hf_not_read" not in str(fact)  # no other line of the unit is read
    assert fact["kept"] == []
    assert [u.name for u in foreign(fact)] == ["qwen27b.service"]


def test_the_fact_class_runs_the_shared_command():
    assert F.UnitFiles().command("/var/lib/qwen27b") == units_command("/etc/systemd/system", "/var/lib/qwen27b/takeover")


def test_ours_is_what_carries_the_marker():
    fact = parse_unit_files(["== unit qwen27b.service enabled active", *OURS.splitlines()[:1],
                             "EnvironmentFile=/etc/qwen27b/qwen27b.env", "ExecStart=/opt/qwen27b/current/venv/bin/vllm serve x",
                             "== kept"])
    assert foreign(fact) == [] and foreign_units(fact, False) == ([], [])
    assert foreign_units(None, False) == ([], [])  # not read (an older recording): nothing said


def test_recorded_lab_unit_is_refused_naming_unit_execstart_and_fix_and_never_the_key():
    with pytest.raises(RefusedHost) as refused:
        decide("v100x2-lab-unit", recorded_facts("v100x2-lab-unit"), load_stack(), Settings())
    text = str(refused.value)
    assert "qwen27b.service (enabled, active; ExecStart=/opt/vllm/bin/python3 -m vllm.entrypoints.openai.api_server" in text
    assert "is not a unit qwen27b rendered" in text and "no copy kept" in text
    assert "sudo systemctl disable --now qwen27b.service" in text and "qwen27b_take_over_unit: true" in text
    assert "--api-key <redacted>" in text and "VLLM_API_KEY}" not in text
    # the port and the GPUs are its own (a unit named qwen27b.service): no second refusal for them
    assert len(refused.value.problems) == 1


def test_with_take_over_the_recorded_lab_unit_is_planned_and_said():
    decision = decide("v100x2-lab-unit", recorded_facts("v100x2-lab-unit"), load_stack(), Settings(take_over_unit=True))
    said = [w for w in decision.warnings if w.startswith("take over qwen27b.service")]
    assert len(said) == 1 and "qwen27b rollback" in said[0] and "<redacted>" in said[0]


def test_an_env_file_the_take_over_cannot_copy_is_refused():
    fact = parse_unit_files(["== unit qwen27b-old.service disabled inactive", "[Unit]",
                             "EnvironmentFile=%h/vllm.env", "ExecStart=/usr/bin/vllm serve m", "== kept"])
    refusals, lines = foreign_units(fact, True)
    assert lines == [] and "EnvironmentFile %h/vllm.env is not a plain path" in refusals[0][0]


def test_shown_redacts_a_key_on_the_command_line():
    assert shown("vllm serve m --api-key sk-1 --port 8000") == "vllm serve m --api-key <redacted> --port 8000"
    assert shown("env API_KEY=sk-1 vllm") == "env API_KEY=<redacted> vllm"
    assert shown("") == "(no ExecStart)"


def test_take_over_keeps_a_root_only_copy_stops_it_and_restore_puts_it_back(box):
    """The deploy's commands, then ours over the lab's unit and env file, then the rollback's restore."""
    fact = read_fact(box)
    kept = box["state"] / "takeover"
    result = bash(box, take_over_commands(fact, str(box["units"]), str(kept)))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700 and stat.S_IMODE((kept / "restore.sh").stat().st_mode) == 0o700
    assert (kept / "units" / "qwen27b.service").read_text() == LAB_UNIT.format(env=box["env"])
    assert (kept / "env" / "0").read_text() == "VLLM_API_KEY=sk-lab-secret\n"
    assert box["log"].read_text().splitlines()[-1] == "disable --now qwen27b.service"
    assert read_fact(box)["kept"] == ["unit qwen27b.service enabled active", f"env 0 {box['env']}"]
    # the deploy writes ours on the same name and its env file elsewhere; the lab's env file changed too
    (box["units"] / "qwen27b.service").write_text(OURS)
    box["env"].write_text("changed\n")
    box["log"].write_text("")
    result = bash(box, restore_commands(str(kept), list(SERVICE_UNITS)))
    assert result.returncode == 0, result.stderr
    assert (box["units"] / "qwen27b.service").read_text() == LAB_UNIT.format(env=box["env"])
    assert box["env"].read_text() == "VLLM_API_KEY=sk-lab-secret\n"
    calls = box["log"].read_text().splitlines()
    assert calls[-3:] == ["daemon-reload", "enable qwen27b.service", "start qwen27b.service"]
    assert "disable --now qwen27b-health.timer" in calls[:-3]  # ours stopped first
    assert not kept.exists()  # put back: nothing left to keep


def test_a_unit_that_was_disabled_and_stopped_comes_back_so(box):
    fact = parse_unit_files(["== unit qwen27b.service disabled inactive", "[Unit]", "ExecStart=/usr/bin/vllm serve m", "== kept"])
    script = take_over_commands(fact, str(box["units"]), str(box["state"] / "takeover"))
    assert not any("systemctl enable" in c or "systemctl start" in c for c in script[:-1])
    assert take_over_commands(parse_unit_files(["== kept"]), str(box["units"]), "/x") == []


def test_the_uninstall_restores_from_a_copy_outside_what_it_removes(box):
    """The uninstall removes the state dir: its restore runs from the copy staged in /run (roles/_takeover.py),
    and restore.sh works from wherever it lies."""
    from roles._takeover import STAGED
    assert not STAGED.startswith(("/var/lib/qwen27b", "/etc/qwen27b", "/opt/qwen27b", "/run/qwen27b/"))
    fact = read_fact(box)
    kept = box["state"] / "takeover"
    assert bash(box, take_over_commands(fact, str(box["units"]), str(kept))).returncode == 0
    staged = box["state"].parent / "staged"
    assert bash(box, [f"cp -a {kept} {staged}", f"rm -rf {box['state']}", f"rm -f {box['units']}/qwen27b.service"]).returncode == 0
    result = bash(box, restore_commands(str(staged), list(SERVICE_UNITS)))
    assert result.returncode == 0, result.stderr
    assert (box["units"] / "qwen27b.service").read_text() == LAB_UNIT.format(env=box["env"]) and not staged.exists()


def test_a_second_take_over_keeps_the_first_copy_and_the_state_it_recorded(box):
    """A deploy that failed after the take-over, before ours was written: the next one finds the lab's unit
    stopped and disabled; restore.sh must still bring it back enabled and running, as it was first found."""
    kept = box["state"] / "takeover"
    assert bash(box, take_over_commands(read_fact(box), str(box["units"]), str(kept))).returncode == 0
    again = read_fact(box)  # the stub answers enabled/active; what matters is the kept manifest
    again["units"][0]["enabled"], again["units"][0]["active"] = "disabled", "inactive"
    assert take_over_commands(again, str(box["units"]), str(kept)) == ["systemctl disable --now qwen27b.service"]
    assert "systemctl enable qwen27b.service" in (kept / "restore.sh").read_text()
