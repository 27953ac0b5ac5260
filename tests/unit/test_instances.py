"""Several copies on one machine (qwen27b_instances, qwen27b/plan/instances.py): the host data
refused before any host is touched, each copy planned on its own GPUs, the templated unit and each
copy's env file as systemd reads them, the firewall, uninstall and rollback of such a host.

The GPU facts are the recorded 4x V100 and 2x V100 16 GB hosts (tests/fixtures/hosts: hand-written
in the real formats; no V100 and no 8-GPU box here): recorded output, not a GPU run. The pyinfra
plans (exact commands) are in tests/golden/v100x4-copies*.txt, checked by tests/plans/test_plans.py.
"""

import json
import os
import re
import shutil
import subprocess

import pytest

from qwen27b.onhost.contract import RESTART_LOOP_FINDING
from qwen27b.controller.render import render, render_all
from qwen27b.controller.render_copies import INSTANCE_UNIT, SERVE_ARGS_ENV, render_instances
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.plan.gate import RefusedHost
from qwen27b.plan.serving import decide
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.lifecycle import Installed, UninstallOptions, uninstall_plan
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts
from tests.support.dryrun import run_pyinfra
from tests.support.rendering import exposure, needs_offline_security
from tests.support.copies import TWO, copies

STACK = load_stack()


def _key(tmp_path, name="a.key", mode=0o600):
    path = tmp_path / name
    path.write_text(f"sk-{name}\n")
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize("instances, extra, key, text", [
    ([], {}, "qwen27b_instances", "an empty list serves nothing"),
    ([{"name": "a", "gpus": [0]}], {}, "qwen27b_instances[0]", "is not a copy"),
    ([{"name": "A b", "gpus": [0], "port": 8000}], {}, "qwen27b_instances[0].name", "is not a copy name"),
    ([{"name": "a" * 17, "gpus": [0], "port": 8000}], {}, "qwen27b_instances[0].name", "is not a copy name"),
    ([{"name": "a", "gpus": [0], "port": 8000}, {"name": "a", "gpus": [1], "port": 8001}], {},
     "qwen27b_instances['a'].name", "names two copies"),
    ([{"name": "a", "gpus": [0, 1], "port": 8000}, {"name": "b", "gpus": [1, 2], "port": 8001}], {},
     "qwen27b_instances['b'].gpus", "GPU 1 is also in copy 'a'"),
    ([{"name": "a", "gpus": [], "port": 8000}], {}, "qwen27b_instances['a'].gpus", "a copy needs GPUs"),
    ([{"name": "a", "gpus": ["0"], "port": 8000}], {}, "qwen27b_instances['a'].gpus", "is not a list of GPU indices"),
    ([{"name": "a", "gpus": 0, "port": 8000}], {}, "qwen27b_instances['a'].gpus", "or a GPU count"),
    ([{"name": "a", "gpus": True, "port": 8000}], {}, "qwen27b_instances['a'].gpus", "or a GPU count"),
    ([{"name": "a", "gpus": 2, "port": 8000}], {"qwen27b_profile": "cpu-smoke"}, "qwen27b_instances['a'].gpus",
     "or a GPU count"),
    ([{"name": "a", "gpus": [0], "port": 8000}, {"name": "b", "gpus": [1], "port": 8000}], {},
     "qwen27b_instances['b'].port", "8000 is also copy 'a's port"),
    ([{"name": "a", "gpus": [0], "port": 9120}], {}, "qwen27b_instances['a'].port", "qwen27b_health_port"),
    ([{"name": "a", "gpus": [0], "port": 9100}], {"qwen27b_node_exporter": True}, "qwen27b_instances['a'].port",
     "node_exporter"),
    ([{"name": "a", "gpus": [0], "port": 80}], {}, "qwen27b_instances['a'].port", "not an unprivileged TCP port"),
    (TWO, {"qwen27b_port": 8000}, "qwen27b_port", "is set per copy"),
    (TWO, {"qwen27b_gpu_indices": [0, 1]}, "qwen27b_gpu_indices", "is set per copy"),
    (TWO, {"qwen27b_serve_flags": {"--tensor-parallel-size": 2}}, "qwen27b_serve_flags.--tensor-parallel-size",
     "each copy's TP size is its GPU count"),
    (TWO, {"qwen27b_node_group": "pair-a", "qwen27b_node_role": "head", "qwen27b_node_interface": "eth1",
           "qwen27b_interconnect_gbps": 10}, "qwen27b_instances", "exclusive"),
])
def test_bad_copies_are_refused_naming_host_key_and_fix(instances, extra, key, text):
    with pytest.raises(BadHostData) as refused:
        settings_for("gpu-8", {"qwen27b_instances": instances, **extra})
    assert refused.value.host == "gpu-8" and refused.value.key == key and refused.value.fix
    assert text in refused.value.problem, str(refused.value)


def test_a_copy_key_file_must_be_private(tmp_path):
    loose = _key(tmp_path, "loose.key", 0o644)
    with pytest.raises(BadHostData, match=r"qwen27b_instances\['b'\].api_key_file: .* readable by others"):
        settings_for("gpu-8", {"qwen27b_instances": [TWO[0], {**TWO[1], "api_key_file": loose}]})


def test_each_copy_is_planned_on_its_own_gpus():
    """4x V100 32 GB as two copies: TP 2 each (its GPU count), its own port, CUDA_VISIBLE_DEVICES its
    GPUs, and the memory plan of a TP-2 group (as qwen27b_gpu_indices [0, 1] alone would plan it)."""
    d = copies()
    assert [(i.name, [g.index for g in c.gpus]) for i, c in d.copies] == [("a", [0, 1]), ("b", [2, 3])]
    assert [c.serve.value("--tensor-parallel-size") for _, c in d.copies] == ["2", "2"]
    assert [c.serve.value("--port") for _, c in d.copies] == ["8000", "8001"]
    alone = decide("h", recorded_facts("v100x4-2204-fresh"), STACK, settings_for("h", {"qwen27b_gpu_indices": [2, 3]}))
    assert d.copies[1][1].serve.memory == alone.serve.memory
    assert [g.index for g in d.gpus] == [0, 1, 2, 3]


def test_a_copy_that_does_not_fit_refuses_the_host_with_its_numbers():
    """2x V100 16 GB as two one-GPU copies: 19.1 GiB of weights do not fit one 16 GB GPU; a GPU the
    host does not have is named with its copy. Every problem at once."""
    with pytest.raises(RefusedHost) as refused:
        copies("v100x2-16gb", [{"name": "a", "gpus": [0], "port": 8000}, {"name": "b", "gpus": [5], "port": 8001}])
    causes = [cause for cause, _ in refused.value.problems]
    assert causes[0].startswith("copy 'a' (1 GPU(s) [0]): too little memory on 1x Tesla V100-SXM2-16GB at TP 1: "
                                "weights 19.1 GiB")
    assert causes[1] == "qwen27b_instances 'b' lists GPU(s) [5] but the host has [0, 1]"


def _systemd_env(text: str) -> dict[str, str]:
    """An EnvironmentFile as systemd reads these lines: NAME=value, a double-quoted value unescaped."""
    env = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("=", 1)
            if value.startswith('"'):
                value = re.sub(r'\\(.)', r"\1", value[1:-1])
            env[name] = value
    return env


def test_each_copy_env_file_holds_its_gpus_flags_and_url_but_no_key(tmp_path):
    d = copies(qwen27b_api_key_file=_key(tmp_path))
    files = render_instances(d)
    for instance, copy in d.copies:
        env = _systemd_env(files[f"{instance.name}.env"])
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, instance.gpus))
        assert env[SERVE_ARGS_ENV].split() == copy.serve.argv()  # $VAR: split at whitespace by systemd
        assert env["QWEN27B_URL"] == f"http://10.0.0.7:{instance.port}"
        assert "sk-" not in files[f"{instance.name}.env"]
    unit = files[INSTANCE_UNIT]
    assert "EnvironmentFile=/etc/qwen27b/qwen27b@%i.env" in unit
    assert "EnvironmentFile=-/etc/qwen27b/qwen27b@%i-api-key.env" in unit
    assert "$QWEN27B_SERVE_ARGS" in unit and "RemoveIPC" not in unit.split("# ")[0]
    assert "--middleware" in _systemd_env(files["a.env"])[SERVE_ARGS_ENV]  # the key guards every route


def test_a_flag_value_with_a_space_is_refused_for_copies():
    with pytest.raises(RefusedHost, match=r"copy 'a' .*--override-generation-config holds a space"):
        copies(qwen27b_serve_flags={"--override-generation-config": "a b"})


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_templated_unit_passes_systemd_analyze_verify(tmp_path):
    files = render_instances(copies(), prefix=str(tmp_path))
    python = tmp_path / "opt/qwen27b/current/venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    (units / INSTANCE_UNIT).write_text(files[INSTANCE_UNIT])
    (units / "qwen27b@a.service").symlink_to(units / INSTANCE_UNIT)  # an instance, as systemctl enable links it
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(units / "qwen27b@a.service")],
                            capture_output=True, text=True, cwd=units, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_offline_security
def test_the_templated_unit_keeps_the_main_units_exposure_goal(tmp_path):
    unit = tmp_path / "qwen27b@a.service"
    unit.write_text(render_instances(copies())[INSTANCE_UNIT])
    assert exposure(unit) <= 2.5  # tests/unit/test_templates.py GOALS for qwen27b.service


def test_each_copy_has_its_own_health_check_of_its_own_gpus(tmp_path):
    """qwen27b-health@NAME.service checks qwen27b@NAME.service at its URL with its key, reads only its
    GPUs, keeps its own status file and restart request, and labels its metrics with its name."""
    d = copies(qwen27b_api_key_file=_key(tmp_path))
    files = render_instances(d)
    for instance, _ in d.copies:
        unit, timer = files[f"qwen27b-health@{instance.name}.service"], files[f"qwen27b-health@{instance.name}.timer"]
        lines = unit.splitlines()
        execs = [line for line in lines if line.startswith("ExecStart=")]
        assert len(execs) == 1
        argv = execs[0].split()
        assert argv[argv.index("--url") + 1] == f"http://10.0.0.7:{instance.port}"
        assert argv[argv.index("--unit") + 1] == f"qwen27b@{instance.name}.service"
        assert argv[argv.index("--status-file") + 1] == f"/var/lib/qwen27b/health@{instance.name}.json"
        assert argv[argv.index("--api-key-file") + 1] == f"/run/credentials/qwen27b-health@{instance.name}.service/api-key"
        assert f"LoadCredential=api-key:/etc/qwen27b/qwen27b@{instance.name}-api-key.env" in lines
        assert f"Environment=QWEN27B_HEALTH_COPY={instance.name}" in lines
        assert f"Environment=QWEN27B_HEALTH_GPUS={','.join(map(str, instance.gpus))}" in lines
        request = f"/var/lib/qwen27b/health-restart@{instance.name}.request"
        assert f"Environment=QWEN27B_HEALTH_RESTART_REQUEST={request}" in lines
        assert (f"ExecStopPost=+/bin/sh -c 'if rm {request} 2>/dev/null; then systemctl restart --no-block "
                f"qwen27b@{instance.name}.service; fi'") in lines
        assert "OnUnitActiveSec=" in timer and "WantedBy=timers.target" in timer
    other = files["qwen27b-health@b.service"]
    assert "qwen27b@a" not in other and "health@a" not in other  # nothing of copy a in b's check


def test_the_health_endpoint_answers_each_copy():
    """One socket on qwen27b_health_port at the copies' address; its request service knows the copies
    (the one-service host's renders no Environment= line for it)."""
    files = render_instances(copies())
    assert "ListenStream=10.0.0.7:9120" in files["qwen27b-health-http.socket"].splitlines()
    service = files["qwen27b-health-http@.service"].splitlines()
    assert "Environment=QWEN27B_HEALTH_COPIES=a,b" in service
    assert any(line.startswith("ExecStart=") and "--status-file /var/lib/qwen27b/health.json" in line for line in service)
    single = render_all(decide("v100x4-2204-fresh", recorded_facts("v100x4-2204-fresh"), STACK,
                               settings_for("v100x4-2204-fresh", {})))
    assert "QWEN27B_HEALTH_COPIES" not in single["qwen27b-health-http@.service.j2"]


def test_a_cpu_copys_check_reads_no_gpu_list():
    files = render_instances(copies("debian12-cpu", instances=[{"name": "a", "gpus": [], "port": 8000}],
                                    qwen27b_profile="cpu-smoke"))
    assert "QWEN27B_HEALTH_GPUS" not in files["qwen27b-health@a.service"]
    assert "Environment=QWEN27B_HEALTH_COPY=a" in files["qwen27b-health@a.service"].splitlines()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_each_copys_health_units_pass_systemd_analyze_verify(tmp_path):
    files = render_instances(copies(), prefix=str(tmp_path))
    for name in ("qwen27b-health", "python"):
        check = tmp_path / "opt/qwen27b/current/venv/bin" / name
        check.parent.mkdir(parents=True, exist_ok=True)
        check.write_text("#!/bin/sh\n")
        check.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    (units / INSTANCE_UNIT).write_text(files[INSTANCE_UNIT])
    (units / "qwen27b@a.service").symlink_to(units / INSTANCE_UNIT)
    for name in ("qwen27b-health@a.service", "qwen27b-health@a.timer", "qwen27b-health-http.socket",
                 "qwen27b-health-http@.service"):
        (units / name).write_text(files[name])
    (units / "qwen27b-health-http@0.service").symlink_to(units / "qwen27b-health-http@.service")
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(units / "qwen27b-health@a.timer"),
                             str(units / "qwen27b-health@a.service"), str(units / "qwen27b-health-http.socket"),
                             str(units / "qwen27b-health-http@0.service")],
                            capture_output=True, text=True, cwd=units, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_firewall_opens_each_copy_port_to_the_listed_networks():
    context = firewall_contexts(copies(qwen27b_firewall_allow=["10.0.0.0/24"]))["qwen27b-firewall.nft.j2"]
    assert [(r["port"], r["what"]) for r in context["rules"][:2]] == [
        ("8000", "qwen27b@a.service (vLLM's API)"), ("8001", "qwen27b@b.service (vLLM's API)")]
    assert "Before=qwen27b@a.service qwen27b@b.service" in render("qwen27b-firewall.service.j2", context)


def test_uninstall_stops_and_disables_the_copies():
    paths = STACK["paths"]
    have = Installed(paths={"/etc/systemd/system/qwen27b@.service": "root:root"})
    removals, _ = uninstall_plan(have, paths, UninstallOptions(), "/etc/systemd/system", "/x/qwen27b.prom")
    assert removals[0].commands[:4] == (
        "systemctl stop 'qwen27b-health@*.timer' 2>/dev/null || true",
        "systemctl stop 'qwen27b-health@*.service' 'qwen27b@*.service' 2>/dev/null || true",
        "rm -f /etc/systemd/system/multi-user.target.wants/qwen27b@*.service "
        "/etc/systemd/system/timers.target.wants/qwen27b-health@*.timer",
        "rm -f /etc/systemd/system/qwen27b-health@*.service /etc/systemd/system/qwen27b-health@*.timer "
        "/x/qwen27b@*.prom")
    assert "each copy's health check, timer and metrics file" in removals[0].what


def test_uninstall_by_pattern_removes_every_copys_files_in_a_real_shell(tmp_path):
    """The removal's rm lines run by sh on a scratch unit dir: the copies' health units, their wants
    links and metrics files go; the one-service host's files and other units stay."""
    units, text = tmp_path / "units", tmp_path / "textfile"
    for d in (units / "multi-user.target.wants", units / "timers.target.wants", text):
        d.mkdir(parents=True)
    made = ["qwen27b-health@a.service", "qwen27b-health@a.timer", "qwen27b-health@b.timer",
            "multi-user.target.wants/qwen27b@a.service", "timers.target.wants/qwen27b-health@a.timer"]
    kept = ["qwen27b-health.service", "qwen27b-health.timer", "multi-user.target.wants/ssh.service", "other@a.service"]
    for name in made + kept:
        (units / name).write_text("")
    (text / "qwen27b@a.prom").write_text("")
    (text / "node.prom").write_text("")
    have = Installed(paths={f"{units}/qwen27b@.service": "root:root"})
    removals, _ = uninstall_plan(have, STACK["paths"], UninstallOptions(), str(units), f"{text}/qwen27b.prom")
    for command in removals[0].commands[2:4]:
        subprocess.run(["sh", "-c", command], check=True)
    assert not any((units / name).exists() for name in made) and not (text / "qwen27b@a.prom").exists()
    assert all((units / name).exists() for name in kept) and (text / "node.prom").exists()


def _converged_copies(tmp_path, extra: str = "") -> str:
    inventory = tmp_path / "inv.py"
    inventory.write_text("from inventory.recorded import COPIES, _fake\n"
                         "name, data = _fake('v100x4-copies-converged', ssh_hostname='10.0.0.8', **COPIES)\n"
                         f"{extra}hosts = [(name, data)]\n")
    return inventory


def test_one_changed_copy_restarts_that_copy_only(tmp_path):
    """The converged two-copy host (recorded output) whose copy b's env file differs on the host:
    b's file is rendered and qwen27b@b.service restarted; copy a is left running."""
    inventory = _converged_copies(tmp_path, "data['fake_responses']['sha1sum /etc/qwen27b/qwen27b@b.env'] = "
                                  "{'stdout': ['0' * 40 + '  /etc/qwen27b/qwen27b@b.env'], 'success': True}\n")
    result = run_pyinfra(str(inventory), "deploy.py", "--dry", "-y")
    assert result.returncode == 0, result.stderr[-3000:]
    changes = re.findall(r"^   CHANGE  (.*)$", result.stderr, re.M)
    assert changes == ["keep the running release (units, env, record) for rollback", "render /etc/qwen27b/qwen27b@b.env",
                       "restart qwen27b@b.service (config, release or weights changed)"], result.stderr[-3000:]
    # what `qwen27b rollback` restores: every copy's env file, the templated unit, each copy's health unit, the record
    assert ("cp -a /etc/qwen27b/qwen27b@a.env /etc/qwen27b/qwen27b@b.env /etc/systemd/system/qwen27b@.service "
            "/etc/systemd/system/qwen27b-health@a.service /etc/systemd/system/qwen27b-health@b.service "
            "/etc/qwen27b/rollback/") in result.stderr
    assert "qwen27b@a.service" not in result.stderr.split("would change the host", 1)[1].split("nothing to change")[0]
    assert ("$ systemctl stop qwen27b@b.service; systemctl reset-failed qwen27b@b.service; "
            "systemctl start --no-block qwen27b@b.service") in result.stderr


def _copies_with_records(tmp_path, records: dict | None) -> str:
    extra = ("from qwen27b.controller import host_facts\nfrom tests.support.recorded import fake_match\n"
             f"data['fake_responses'] = {{fake_match(host_facts.ReleaseRecords): [{json.dumps(json.dumps(records))}]}}"
             " | data['fake_responses']\n") if records is not None else ""
    return _converged_copies(tmp_path, extra)


def test_rollback_of_a_host_serving_copies_swaps_every_copys_files_and_restarts_each(tmp_path):
    """The copies share one release: the rollback swaps each copy's env file, the templated unit, each
    copy's health check unit (its model label and served name, issue 56) and the record, switches the
    links, restarts each copy and verifies each at its own URL."""
    from tests.support.releases import CURRENT, PREVIOUS
    current = {**CURRENT, "url": "http://10.0.0.8:8000"}
    previous = {**PREVIOUS, "url": "http://10.0.0.8:8000"}
    kept = ["qwen27b@a.env", "qwen27b@b.env", "qwen27b@.service", "qwen27b-health@a.service", "qwen27b-health@b.service",
            "release.json"]
    result = run_pyinfra(str(_copies_with_records(tmp_path, {"current": current, "previous": previous, "kept": kept,
                                                              "missing": []})), "rollback.py", "--dry", "-y")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stderr
    assert "CHANGE  rollback: switch to the previous release (symlinks, units, env, record) and restart each copy (a, b)" in out
    assert ("cp -a /etc/qwen27b/qwen27b@a.env /etc/qwen27b/qwen27b@b.env /etc/systemd/system/qwen27b@.service "
            "/etc/systemd/system/qwen27b-health@a.service /etc/systemd/system/qwen27b-health@b.service "
            "/etc/qwen27b/release.json /etc/qwen27b/rollback.swap/") in out
    for copy in ("a", "b"):
        unit = f"/etc/systemd/system/qwen27b-health@{copy}.service"
        assert f"$ cp -a /etc/qwen27b/rollback/qwen27b-health@{copy}.service {unit}" in out
    assert "$ cp -a /etc/qwen27b/rollback/qwen27b@b.env /etc/qwen27b/qwen27b@b.env" in out
    assert "$ cp -a /etc/qwen27b/rollback/qwen27b@.service /etc/systemd/system/qwen27b@.service" in out
    for unit in ("qwen27b@a.service", "qwen27b@b.service"):
        assert f"$ systemctl stop {unit}; systemctl reset-failed {unit}; systemctl start --no-block {unit}" in out
    assert "qwen27b.service" not in out.split("rollback plan", 1)[1]
    assert "verify: each copy on the release rolled back to" in out


def test_rollback_of_copies_is_refused_without_their_kept_files(tmp_path):
    from tests.support.releases import CURRENT, PREVIOUS
    result = run_pyinfra(str(_copies_with_records(tmp_path, {"current": CURRENT, "previous": PREVIOUS,
                                                              "kept": ["qwen27b.env", "qwen27b.service", "release.json"],
                                                              "missing": []})), "rollback.py", "--dry", "-y")
    assert result.returncode == 1
    assert "the rollback dir lacks the kept qwen27b@.service, qwen27b@a.env, qwen27b@b.env" in result.stderr
    nothing = run_pyinfra(str(_copies_with_records(tmp_path, None)), "rollback.py", "--dry", "-y")
    assert nothing.returncode == 1 and "no previous release is recorded on this host" in nothing.stderr


def test_a_copys_url_is_the_records_address_with_its_port():
    from roles.rollback import copy_url
    assert copy_url("http://10.0.0.8:8000", 8001) == "http://10.0.0.8:8001"
    assert copy_url("http://[fd00::8]:8000", 8002) == "http://[fd00::8]:8002"


# --- verify of a host serving copies: a failed copy rolls the whole host back (roles/verify.py) ------

@pytest.fixture
def copies_verify(tmp_path, monkeypatch):
    """roles/verify's copies check on the two-copy decision, each copy with its own key file; the
    host's commands and every serving() call (unit, URL, key, which release) are kept in `seen`;
    `seen["bad"]`: the copies that fail on the new release, `seen["bad_after"]`: after the rollback."""
    import types

    import roles.verify as verify
    from qwen27b.controller import postdeploy as V, runstate, startwatch

    keys = {"a": _key(tmp_path, "a.key"), "b": _key(tmp_path, "b.key")}
    decision = copies(instances=[{**copy, "api_key_file": keys[copy["name"]]} for copy in TWO])
    run = runstate.RunState()
    seen = {"commands": [], "served": [], "reach": [], "said": [], "bad": {"b"}, "bad_after": set(), "rolled": False}

    def serving(result, key, say, unit_state, start_timeout_s, speculative, unit="qwen27b.service", **_):
        name = unit.split("@")[1].split(".")[0]
        seen["served"].append((unit, result.url, key, "previous" if seen["rolled"] else "new"))
        seen["reach"].append((result.served_name, start_timeout_s, speculative))
        if name in (seen["bad_after"] if seen["rolled"] else seen["bad"]):
            raise V.VerifyFailed(f"the service {unit} is failed/failed: it crashed while loading", crashed=True)
        result.ready_s, result.ttft_s, result.decode_tok_s = 1.0, 0.1, 30.0

    def run_in_order(commands):
        seen["commands"] += commands
        seen["rolled"] = True

    loop = json.dumps({"verdict": "CRITICAL", "findings": [{"kind": RESTART_LOOP_FINDING, "text": LOOP}]})
    replaced = {"host": types.SimpleNamespace(name="gpu-a"), "say": seen["said"].append, "serving": serving,
                "run_in_order": run_in_order,
                "_until_restart_loop_is_evident": lambda say, unit: seen["said"].append(f"loop {unit}"),
                "host_lines": lambda command: seen["commands"].append(command) or
                ([loop] if "health@b.json" in command else [])}
    for module in (verify, startwatch):  # the check's own steps and the engine's (controller/startwatch.py)
        for name, value in replaced.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(runstate, "current", lambda: run)
    return verify.__dict__["_check_copies"].__wrapped__, decision, run, seen


LOOP = "qwen27b@b.service is not serving: crash loop, its process exited (Result=exit-code)"


def _replaced():
    """What a deploy that replaced the running release of the copies host remembers (roles/service.py)."""
    from qwen27b.controller.releasefiles import copies_serving_files
    from roles._common import KeptFiles, SwitchedLink
    return [KeptFiles(tuple(copies_serving_files(STACK["paths"], ["a", "b"]))),
            SwitchedLink("/opt/qwen27b/current", "/opt/qwen27b/releases/old")]


def test_a_copy_failing_verify_rolls_the_whole_host_back_and_verifies_each_copy_with_its_own_key(copies_verify):
    from pyinfra.api.exceptions import OperationError
    check, decision, run, seen = copies_verify
    with pytest.raises(OperationError, match=r"previous release was restored and every copy verified: rolled back: "
                                             r"copy b \(qwen27b@b\.service\): qwen27b@b\.service is not serving"):
        check(decision, _replaced())
    # the swap `qwen27b rollback` makes: every copy's env file, the template and the record, the link back
    for kept in ("/etc/qwen27b/qwen27b@a.env", "/etc/qwen27b/qwen27b@b.env", "/etc/systemd/system/qwen27b@.service",
                 "/etc/qwen27b/release.json"):
        assert f"cp -a /etc/qwen27b/rollback/{kept.rsplit('/', 1)[1]} {kept}" in seen["commands"]
    assert "ln -sfn /opt/qwen27b/releases/old /opt/qwen27b/current.new" in " ".join(seen["commands"])
    restarts = [c for c in seen["commands"] if c.startswith("systemctl stop ")]
    assert restarts == [f"systemctl stop qwen27b@{n}.service; systemctl reset-failed qwen27b@{n}.service; "
                        f"systemctl start --no-block qwen27b@{n}.service" for n in ("a", "b")]
    assert not any("qwen27b.service" in c for c in seen["commands"])
    assert seen["commands"].index("systemctl daemon-reload") < seen["commands"].index(restarts[0])
    # a verified, b failed on the new release; then both on the previous one, each with its own key
    ports = {"a": ":8000", "b": ":8001"}
    assert [(unit, release) for unit, _, _, release in seen["served"]] == [
        ("qwen27b@a.service", "new"), ("qwen27b@b.service", "new"),
        ("qwen27b@a.service", "previous"), ("qwen27b@b.service", "previous")]
    for unit, url, key, _ in seen["served"]:
        name = unit[len("qwen27b@")]
        assert url.endswith(ports[name]) and key == f"sk-{name}.key"
    assert "loop qwen27b@b.service" in seen["said"]  # the crash loop waited for on b's own unit
    assert any("rolling the whole host back" in line and "(a, b)" in line for line in seen["said"])
    # one row per copy, each `rolled back` naming b and why (the run summary reads the host's last row)
    assert [(r.url[-4:], r.status) for r in run.results] == [("8000", "rolled back"), ("8001", "rolled back")]
    # the reason is b's own health check's crash-loop sentence, as one service's is, named by copy
    assert all(r.reason == f"rolled back: copy b (qwen27b@b.service): {LOOP}" for r in run.results)
    assert run.results[1].journal is not None and run.results[1].health["verdict"] == "CRITICAL"  # b's evidence
    assert run.results[0].health is None
    from qwen27b.controller.runreport import verified
    assert verified(run)["gpu-a"][0] == "rolled back"


def test_the_rollback_asks_each_copy_what_the_restored_record_says(copies_verify, monkeypatch):
    """The failed deploy renamed the model, moved the host's address and waited longer: the restored
    release serves the old name at the old address (its record, which the swap put back, says so),
    so each copy is verified there, on its own port and with its own key, with the old time-out."""
    from qwen27b.controller import startwatch
    from qwen27b.plan.lifecycle import Record, record_text
    from pyinfra.api.exceptions import OperationError
    check, decision, run, seen = copies_verify
    kept = Record({"/opt/qwen27b/current": "/opt/qwen27b/releases/old"}, model_ref="org/m@old",
                  url="http://10.9.9.9:8000", served_name="old-name", speculative=False, start_timeout_s=123)
    monkeypatch.setattr(startwatch, "host_lines", lambda command: seen["commands"].append(command) or
                        (record_text(kept).splitlines() if seen["rolled"] and "release.json" in command else []))
    with pytest.raises(OperationError, match="every copy verified: rolled back"):
        check(decision, _replaced())
    new_name = decision.copies[0][1].serve.value("--served-model-name")
    assert new_name != "old-name" and seen["reach"][0][0] == new_name  # the new release was asked its own name
    assert [url for _, url, _, release in seen["served"] if release == "previous"] == \
        ["http://10.9.9.9:8000", "http://10.9.9.9:8001"]
    assert [reach for reach, (_, _, _, release) in zip(seen["reach"], seen["served"]) if release == "previous"] == \
        [("old-name", 123, False)] * 2
    assert [key for _, _, key, release in seen["served"] if release == "previous"] == ["sk-a.key", "sk-b.key"]
    assert [(r.url, r.served_name) for r in run.results] == [("http://10.9.9.9:8000", "old-name"),
                                                             ("http://10.9.9.9:8001", "old-name")]


def test_one_services_rollback_reaches_the_restored_release_by_its_record(monkeypatch):
    """verify's rollback of one service: the restored record's URL, name, time-out and speculation;
    this deploy's where the host has no readable record (a host from before records)."""
    import roles.verify as verify
    from qwen27b.controller import startwatch
    from qwen27b.plan.lifecycle import Record, record_text
    decision = copies().copies[0][1]
    now = verify.reached(decision)
    assert now.served_name == decision.serve.value("--served-model-name") and now.url.endswith(":8000")
    kept = Record({"/opt/qwen27b/current": "/opt/qwen27b/releases/old"}, url="http://[fd00::5]:8100",
                  served_name="old", speculative=True, start_timeout_s=900)
    monkeypatch.setattr(startwatch, "host_lines", lambda command: record_text(kept).splitlines())  # host_record's read
    back = verify.restored_reach(decision, now)
    assert (back.url, back.served_name, back.speculative, back.start_timeout_s) == ("http://[fd00::5]:8100", "old", True, 900)
    monkeypatch.setattr(startwatch, "host_lines", lambda command: [])
    assert verify.restored_reach(decision, now) == now


def test_the_first_copy_failing_rolls_back_and_the_second_is_verified_on_the_previous_release(copies_verify):
    from pyinfra.api.exceptions import OperationError
    check, decision, run, seen = copies_verify
    seen["bad"] = {"a"}
    with pytest.raises(OperationError, match=r"rolled back: copy a \(qwen27b@a\.service\)"):
        check(decision, _replaced())
    assert [(unit, release) for unit, _, _, release in seen["served"]] == [
        ("qwen27b@a.service", "new"), ("qwen27b@a.service", "previous"), ("qwen27b@b.service", "previous")]
    assert [r.status for r in run.results] == ["rolled back", "rolled back"]


def test_a_copy_failing_with_nothing_replaced_is_failed_and_not_rolled_back(copies_verify):
    from pyinfra.api.exceptions import OperationError
    check, decision, run, seen = copies_verify
    with pytest.raises(OperationError, match=r"^verify failed: copy b \(qwen27b@b\.service\)"):
        check(decision, [])
    assert not seen["rolled"] and [r.status for r in run.results] == ["ok", "failed"]


def test_a_rollback_whose_copy_fails_again_says_it_did_not_recover(copies_verify):
    from pyinfra.api.exceptions import OperationError
    check, decision, run, seen = copies_verify
    seen["bad_after"] = {"a"}
    with pytest.raises(OperationError, match="verify failed and rollback did not recover: copy a: "):
        check(decision, _replaced())
    assert [r.status for r in run.results] == ["failed", "failed"]
    assert all("; rollback did not recover: copy a: " in r.reason and r.reason.startswith("copy b (")
               for r in run.results)


def test_every_copy_verified_drops_the_release_kept_before_this_one(copies_verify):
    check, decision, run, seen = copies_verify
    seen["bad"] = set()
    check(decision, _replaced())
    assert not seen["rolled"] and [r.status for r in run.results] == ["ok", "ok"]
    assert seen["commands"] == ["rm -rf /etc/qwen27b/rollback.prev"]
