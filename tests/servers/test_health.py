"""qwen27b.onhost.health: pure parts offline, then the CLI against a real vLLM OpenAI server.

The CLI always runs the way hosts run it: the package copied to ``<venv>/lib/qwen27b_onhost/``
behind the rendered wrapper ``<venv>/bin/qwen27b-health`` (here a real scratch venv with the host
packages installed from the controller wheelhouse, as the vllm role does on a host).
``systemctl`` and ``journalctl`` are fakes first on PATH, so the watchdog's restart is recorded,
never executed, and Xid lines can be fed in.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwen27b.onhost import health as hc
from qwen27b.onhost import contract
from qwen27b.onhost import gpu
from qwen27b.onhost import secretfile
from qwen27b.onhost import statusfile
from tests.support.health_check import _fake_driver, cli, fakebin, venv  # noqa: F401 (cli, fakebin, venv: fixtures)

HEALTH_PY = Path(hc.__file__)

# Real kernel-line shapes: journalctl -o short-iso, dmesg --time-format=iso, older drivers.
KERNEL_LOG = """\
2026-12-02T14:30:01+0000 v100-a kernel: nvidia-nvlink: Nvlink Core is being initialized
2026-12-02T14:31:07+0000 v100-a kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1423, name=python3, GPU has fallen off the bus.
2026-12-02T14:31:07+0000 v100-a kernel: NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
2026-12-02T14:32:10+0000 v100-a kernel: NVRM: Xid (PCI:0000:86:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x404600=0x80000002
2026-12-02T14:33:00,512345+00:00 NVRM: Xid (PCI:0000:af:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.
[ 8123.441] NVRM: Xid (0000:d8:00): 31, Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2e_4c000000.
NVRM: Xid (PCI:0000:3b:00): notanumber, garbage
"""


# ============================================================================ pure parts

def test_decode_throttle():
    assert gpu.decode_throttle(0) == []
    assert gpu.decode_throttle(0x1) == ["gpu_idle"]  # the genuine H200 reading (fixtures)
    assert gpu.decode_throttle(0x44) == ["sw_power_cap", "hw_thermal"]
    assert gpu.decode_throttle(0x80 | 0x800) == ["hw_power_brake", "0x800"]  # unknown bits kept


def test_parse_xids_real_line_shapes():
    xids = gpu.parse_xids(KERNEL_LOG)
    assert [x["xid"] for x in xids] == [79, 13, 48, 31]
    x79 = xids[0]
    assert x79 == {"time": "2026-12-02T14:31:07+00:00", "pci": "0000:3b:00", "xid": 79, "pid": "1423",
                   "name": "python3", "message": "GPU has fallen off the bus."}
    assert xids[1]["pid"] == "<unknown>" and xids[1]["name"] == "<unknown>"
    assert xids[2]["time"] == "2026-12-02T14:33:00+00:00" and xids[2]["pid"] is None
    assert xids[2]["message"].startswith("An uncorrectable double bit error")
    assert xids[3]["time"] is None and xids[3]["pci"] == "0000:d8:00"  # dmesg without -T


def test_parse_xids_since_drops_old_and_unstamped_lines():
    since = statusfile.epoch("2026-12-02T14:32:00+00:00")
    assert [x["xid"] for x in gpu.parse_xids(KERNEL_LOG, since=since)] == [13, 48]
    assert gpu.parse_xids("random\n\n", since=since) == []


def _readings(**kw):
    r = {"url": "http://127.0.0.1:8000", "unit": "qwen27b.service", "served_name": "m",
         "key_error": None, "health": {"status": 200, "latency_ms": 3.0, "error": None},
         "models": {"status": 200, "ids": ["m"], "error": None}, "gpu": None, "xids": []}
    r.update(kw)
    return r


def _gpu(**kw):
    g = {"index": 0, "name": "Tesla V100-SXM2-32GB", "pci": "00000000:3B:00.0", "memory_used_mib": 30000,
         "memory_total_mib": 32768, "temperature_c": 60, "ecc_uncorrected": 0, "retired_pages_pending": False,
         "throttle": {"mask": "0x4", "reasons": ["sw_power_cap"]}}
    g.update(kw)
    return g


def _xid(n):
    return {"time": "2026-12-02T14:31:07+00:00", "pci": "0000:3b:00", "xid": n, "pid": None, "name": None,
            "message": ""}


@pytest.mark.parametrize("change, code, words", [
    ({}, 0, None),
    ({"gpu": None, "xids": None}, 0, None),  # CPU host, no kernel log: unknown, not an error
    ({"gpu": [_gpu()]}, 0, None),  # power cap under load is normal
    ({"health": {"status": 200, "latency_ms": 2500.0, "error": None}}, 1, "took 2500 ms"),
    ({"gpu": [_gpu(temperature_c=85)]}, 1, "85 C"),
    ({"gpu": [_gpu(throttle={"mask": "0x40", "reasons": ["hw_thermal"]})]}, 1, "hw_thermal"),
    ({"gpu": [_gpu(throttle={"mask": "0x80", "reasons": ["hw_power_brake"]})]}, 1, "power"),
    ({"gpu": [_gpu(retired_pages_pending=True)]}, 1, "retired pages pending"),
    ({"xids": [_xid(13)]}, 1, "Xid 13"),
    ({"xids": [_xid(79)]}, 2, "fallen off the bus"),
    ({"xids": [_xid(48)]}, 2, "Xid 48"),
    ({"xids": [_xid(95)]}, 2, "Xid 95"),
    ({"gpu": [_gpu(ecc_uncorrected=2)]}, 2, "2 uncorrected ECC"),
    ({"gpu": [{"index": 1, "error": "GPU is lost"}]}, 2, "GPU 1 unreadable"),
    ({"health": {"status": 503, "latency_ms": 1.0, "error": None}}, 2, "engine died"),
    ({"health": {"status": None, "latency_ms": None, "error": "ConnectError: refused"},
      "models": {"status": None, "ids": None, "error": "ConnectError: refused"}}, 2, "unreachable"),
    ({"models": {"status": 401, "ids": None, "error": None}}, 2, "API key does not match"),
    ({"models": {"status": 500, "ids": None, "error": None}}, 2, "returned 500"),
    ({"models": {"status": 200, "ids": ["other"], "error": None}}, 2, "'m' is not listed"),
    ({"key_error": "/etc/k: Permission denied"}, 2, "API key file"),
    ({"served_name": None, "models": {"status": 200, "ids": ["other"], "error": None}}, 0, None),
])
def test_verdict_table(change, code, words):
    got, findings = hc.verdict(_readings(**change))
    assert got == code
    if words is None:
        assert findings == []
    else:
        assert any(words in f["text"] for f in findings), findings
        assert all(f["text"].endswith(".") for f in findings)  # each a sentence saying what to do


def test_verdict_takes_the_worst_and_one_sentence_per_outage():
    down = {"status": None, "latency_ms": None, "error": "ConnectError: refused"}
    code, findings = hc.verdict(_readings(health=down, models=dict(down, ids=None),
                                          gpu=[_gpu(temperature_c=90)]))
    assert code == 2
    assert [f["level"] for f in findings] == ["CRITICAL", "WARNING"]  # no 2nd line for /v1/models


def test_counter_and_restart_decision():
    assert hc.next_failures(0, 2) == 1 and hc.next_failures(4, 2) == 5
    assert hc.next_failures(4, 0) == 0 and hc.next_failures(4, 1) == 0
    base = dict(code=2, failures=3, restart_after=3, last_restart=None, now=10_000.0,
                min_interval_s=600, unit_state="failed", enabled=True, unit="qwen27b.service")
    assert hc.restart_decision(**base)[0] == "restart"
    assert hc.restart_decision(**{**base, "failures": 2}) == ("none", "")
    assert hc.restart_decision(**{**base, "code": 1}) == ("none", "")
    action, why = hc.restart_decision(**{**base, "last_restart": 10_000.0 - 599})
    assert action == "skip" and "599 s ago" in why
    assert hc.restart_decision(**{**base, "last_restart": 10_000.0 - 601})[0] == "restart"
    action, why = hc.restart_decision(**{**base, "unit_state": "activating"})
    assert action == "skip" and "still starting" in why
    action, why = hc.restart_decision(**{**base, "enabled": False})
    assert action == "skip" and "--no-restart" in why


def test_history_keeps_the_last_20():
    h = None
    for i in range(25):
        h = statusfile.push_history(h, f"t{i}", 2 if i % 2 else 0)
    assert len(h) == 20 and h[0]["time"] == "t5" and h[-1] == {"time": "t24", "code": 0, "verdict": "OK"}


@pytest.mark.parametrize("text, key", [
    ("VLLM_API_KEY=abc123\n", "abc123"),  # what the service role writes to api-key.env
    ("  abc123  \n", "abc123"),
])
def test_parse_secret_reads_the_deployed_env_file(text, key):
    """The full format is tested in tests/unit/slow/test_secrets.py (one parser for deploy, health, bench)."""
    assert secretfile.parse_secret(text) == key


@pytest.mark.parametrize("text", ["OTHER=1\n", "VLLM_API_KEY=\n", "", "VLLM_API_KEY=a\nLD_PRELOAD=/x.so\n"])
def test_parse_secret_refuses(text):
    with pytest.raises(secretfile.SecretFileError):
        secretfile.parse_secret(text)


def test_status_file_atomic_and_tolerant(tmp_path):
    path = tmp_path / "state" / "health.json"
    statusfile.write_status(str(path), {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["health.json"]  # no temp file left behind
    path.write_text("{half a fi")
    assert statusfile.load_status(str(path)) == {}  # a torn/corrupt file is a first run, not a crash
    assert statusfile.load_status(str(tmp_path / "missing.json")) == {}


# ---------------------------------------------------------------------------- NVML (real pynvml, faked driver)

def test_read_gpus_from_the_recorded_h200(monkeypatch):
    _fake_driver(monkeypatch)
    gpus, note = gpu.read_gpus()
    assert note is None
    assert gpus == [{"index": 0, "name": "NVIDIA H200", "pci": "00000000:18:00.0", "memory_used_mib": 615,
                     "memory_total_mib": 143771, "temperature_c": 32, "ecc_uncorrected": 0,
                     "retired_pages_pending": None, "retired_pages": None, "throttle": {"mask": "0x1", "reasons": ["gpu_idle"]}}]
    assert hc.verdict(_readings(gpu=gpus)) == (0, [])


def test_read_gpus_lost_gpu_and_cpu_only_host(monkeypatch):
    pynvml = pytest.importorskip("pynvml")
    _fake_driver(monkeypatch, count=2, lost={1})
    gpus, _ = gpu.read_gpus()
    assert gpus[1] == {"index": 1, "error": "GPU is lost"}
    assert hc.verdict(_readings(gpu=gpus))[0] == 2
    _fake_driver(monkeypatch, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert gpu.read_gpus() == (None, "NVML Shared Library Not Found")


# ============================================================================ shipped as one package

ONHOST = sorted(HEALTH_PY.parent.glob("*.py"))


@pytest.mark.parametrize("path", ONHOST, ids=lambda p: p.name)
def test_onhost_imports_only_stdlib_its_siblings_and_the_host_packages(path):
    """The package runs in the release venv as qwen27b_onhost: stdlib, siblings (relative imports),
    httpx at the top (health only, and idleprobe, the part of it that sends the idle probe: issue 56),
    pynvml and prometheus_client lazily; never qwen27b or pyinfra.
    qualify.py (issue 27's burn-in) imports torch lazily: the release venv holds the vLLM build's."""
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            top.add((node.module or "").split(".")[0])
    assert top - sys.stdlib_module_names - {"__future__"} <= ({"httpx"} if path.name in ("health.py", "idleprobe.py") else set())
    every = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    every |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert every - sys.stdlib_module_names - {"__future__"} <= {"httpx", "pynvml", "prometheus_client"} | (
        {"torch"} if path.name == "qualify.py" else set())


def test_release_venv_is_a_real_venv(venv):
    """The scratch venv must be isolated: its interpreter's prefix is the venv, and it can import
    httpx only because the wheelhouse put it there."""
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sys, httpx; print(sys.prefix); print(httpx.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert Path(out[0]) == venv
    assert Path(out[1]).is_relative_to(venv)


def test_wrapper_script_shape():
    text = contract.wrapper_script("/opt/qwen27b/releases/1/venv")
    assert text.startswith("#!/opt/qwen27b/releases/1/venv/bin/python\n")
    assert "sys.path.insert(0, '/opt/qwen27b/releases/1/venv/lib')" in text
    assert text.endswith("from qwen27b_onhost.health import main\nraise SystemExit(main())\n")


def closed_url():
    from qwen27b.tools.cpu_smoke import free_port
    return f"http://127.0.0.1:{free_port()}"  # bound then released: nothing listens there


def test_cli_closed_port_counts_and_restarts_after_k_rate_limited(cli):
    url = closed_url()
    unit = "qwen27b-health-test-fake.service"
    args = ("--url", url, "--unit", unit, "--restart-after", "3", "--timeout", "2")
    for n in (1, 2):
        rc, out, err, s = cli(*args)
        assert rc == 2 and s["consecutive_failures"] == n and s["restart"] is None
        assert "unreachable" in out and err == ""
    rc, out, err, s = cli(*args, "--json")
    assert rc == 2 and json.loads(out) == s
    assert s["restart"]["action"] == "restart" and s["restart"]["ok"] is True
    assert s["last_restart"]["time"] == s["time"] and "3 consecutive CRITICAL" in s["last_restart"]["reason"]
    assert f"restarting {unit}" in err  # stderr: the journal when systemd runs it
    assert f"restart --no-block {unit}" in cli.calls.read_text()
    # 4th failure: the rate limit (600 s) holds the next restart back, and says so
    rc, out, err, s = cli(*args)
    assert s["consecutive_failures"] == 4 and s["restart"]["action"] == "skip"
    assert "ago" in s["restart"]["reason"] and "ago" in out
    assert cli.calls.read_text().count("restart --no-block") == 1


def test_cli_no_restart_and_activating_unit_are_skipped(cli):
    args = ("--url", closed_url(), "--unit", "fake-qwen27b.service", "--restart-after", "1", "--timeout", "2")
    rc, out, err, s = cli(*args, "--no-restart")
    assert rc == 2 and s["restart"]["action"] == "skip" and "--no-restart" in s["restart"]["reason"]
    rc, out, err, s = cli(*args, env={"FAKE_STATE": "activating"})
    assert s["unit_state"] == "activating" and s["restart"]["action"] == "skip"
    assert "still starting" in s["restart"]["reason"]
    assert "restart --no-block" not in cli.calls.read_text()


def test_cli_failed_restart_is_reported(cli):
    rc, out, err, s = cli("--url", closed_url(), "--unit", "fake.service", "--restart-after", "1",
                          "--timeout", "2", env={"FAKE_SYSTEMCTL_RC": "1"})
    assert s["restart"]["ok"] is False and s["last_restart"]["ok"] is False
    assert "failed" in err and "restart it by hand" in out


def test_cli_reads_xids_since_the_last_check(cli, tmp_path):
    kernel = tmp_path / "kernel.log"
    kernel.write_text(KERNEL_LOG)
    url = closed_url()
    # a previous run at 14:32:00: only the Xid 13 and Xid 48 are new
    statusfile.write_status(str(cli.status), {"time": "2026-12-02T14:32:00+00:00", "consecutive_failures": 0})
    rc, out, err, s = cli("--url", url, "--no-restart", "--timeout", "2", env={"FAKE_KERNEL": str(kernel)})
    assert [x["xid"] for x in s["xids"]] == [13, 48] and s["xid_source"] == "journalctl"
    assert "--since=@" + str(int(statusfile.epoch("2026-12-02T14:32:00+00:00"))) in cli.calls.read_text()
    assert any("Xid 48" in f["text"] and f["level"] == "CRITICAL" for f in s["findings"])


def test_cli_writes_the_textfile_and_counts_xids_across_runs(cli, tmp_path):
    """The real release venv (prometheus-client from the wheelhouse) writes node_exporter's file."""
    parser = pytest.importorskip("prometheus_client.parser")
    kernel = tmp_path / "kernel.log"
    kernel.write_text(KERNEL_LOG)
    statusfile.write_status(str(cli.status), {"time": "2026-12-02T14:32:00+00:00", "consecutive_failures": 0})
    args = ("--url", closed_url(), "--no-restart", "--timeout", "2", "--model-ref", "org/m@abc")
    for _ in range(2):  # the second run finds no new Xid lines: the counter stays, never resets
        record = tmp_path / "release.json"  # the one service's slots: its release record's --max-num-seqs
        record.write_text(json.dumps({"links": {}, "flags": ["--max-model-len 2048", "--max-num-seqs 4", "--enforce-eager"]}))
        rc, out, err, s = cli(*args, env={"FAKE_KERNEL": str(kernel), "QWEN27B_SPECULATIVE": "mtp:7",
                                          "QWEN27B_RELEASE_RECORD": str(record)})
        assert rc == 2 and err == "" and s["slots"] == 4  # the engine's --max-num-seqs, for the gateway's fair share
        prom = cli.textfile / "qwen27b.prom"
        assert [p.name for p in cli.textfile.iterdir()] == ["qwen27b.prom"] and prom.stat().st_mode & 0o777 == 0o644
        samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
                   for f in parser.text_string_to_metric_families(prom.read_text()) for x in f.samples}
        assert samples[("qwen27b_health_verdict", ())] == 2 and samples[("qwen27b_service_up", ())] == 0
        assert samples[("qwen27b_xid_total", (("fatal", "true"), ("xid", "48")))] == 1
        assert samples[("qwen27b_build_info", (("model", "org/m@abc"), ("release", cli.venv.parent.name),
                                               ("speculative", "mtp:7"), ("unit", "qwen27b.service")))] == 1
        kernel.write_text("")
    assert s["xid_counts"]["48"] == 1


def test_cli_quiet_prints_one_line_until_the_verdict_changes(cli, tmp_path):
    """--quiet (the timer's unit): ~10 journal lines a check only when the verdict changes."""
    args = ("--url", closed_url(), "--no-restart", "--timeout", "2", "--quiet")
    rc, out, err, s = cli(*args)
    assert rc == 2 and out.startswith("verdict ") and len(out.splitlines()) > 5  # first run: the table
    first = s["time"]
    rc, out, err, s = cli(*args)
    assert rc == 2 and len(out.splitlines()) == 1
    assert out.startswith(f"CRITICAL (2) unchanged since {first}") and "2 consecutive failures" in out
    assert "/health unreachable" in out  # the first CRITICAL finding's sentence, with its fix
    # a different verdict (history says OK last): the table again
    s["history"][-1].update(code=0, verdict="OK")
    statusfile.write_status(str(cli.status), s)
    rc, out, err, s = cli(*args)
    assert len(out.splitlines()) > 5


def test_one_line_since_reaches_back_through_the_history():
    s = {"time": "t3", "code": 1, "verdict": "WARNING", "health_status": 200, "latency_ms": 1500.0,
         "gpu": [{"index": 0}, {"index": 1, "error": "GPU is lost"}], "xids": [], "consecutive_failures": 0,
         "findings": [hc.finding(1, "slow")],
         "history": [{"time": "t0", "code": 2}, {"time": "t1", "code": 1}, {"time": "t2", "code": 1},
                     {"time": "t3", "code": 1}]}
    assert not hc.verdict_changed(s)
    assert hc.one_line(s) == ("WARNING (1) unchanged since t1; /health 200 in 1500.0 ms; 1/2 GPUs read; "
                              "0 new Xids; 1 finding(s), first: slow")
    assert hc.verdict_changed({"history": [{"time": "t0", "code": 1}]})  # a first run shows the table


def test_cli_bad_key_file_and_usage(cli, tmp_path):
    rc, out, err, s = cli("--url", closed_url(), "--api-key-file", str(tmp_path / "nope.env"), "--no-restart")
    assert rc == 2 and any("cannot use the API key file" in f["text"] for f in s["findings"])
    rc, out, err, _ = cli("--restart-after", "1", status_file=False)
    assert rc == 2 and "--url" in err  # argparse usage error


# ============================================================================ against a real vLLM server

@pytest.fixture
def key_file(tmp_path, vllm_server):
    p = tmp_path / "api-key.env"
    p.write_text(f"VLLM_API_KEY={vllm_server['api_key']}\n")  # as the service role writes it
    p.chmod(0o600)
    return p


def _no_secret(secret, *texts):
    for t in texts:
        assert secret not in (t if isinstance(t, str) else json.dumps(t))


def test_real_server_ok(cli, vllm_server, key_file):
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    rc, out, err, s = cli("--url", vllm_server["url"], "--served-name", vllm_server["name"],
                          "--api-key-file", str(key_file), "--unit", "fake-qwen27b.service")
    assert rc == 0, out + err
    assert s["verdict"] == "OK" and s["findings"] == [] and s["consecutive_failures"] == 0
    assert s["models"] == [vllm_server["name"]] and s["health_status"] == 200
    assert isinstance(s["latency_ms"], float) and s["latency_ms"] < 1000
    assert s["gpu"] is None  # CPU-only: not an error
    assert out.startswith("verdict   OK (0)") and "no findings" in out
    _no_secret(vllm_server["api_key"], out, err, cli.status.read_text())
    rc, out, err, s2 = cli("--url", vllm_server["url"], "--served-name", vllm_server["name"],
                           "--api-key-file", str(key_file), "--json")
    assert rc == 0 and json.loads(out) == s2 and len(s2["history"]) == 2
    _no_secret(vllm_server["api_key"], out, err)


def test_real_server_bare_key_file(cli, vllm_server, tmp_path):
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    bare = tmp_path / "key"
    bare.write_text(vllm_server["api_key"] + "\n")
    rc, out, err, s = cli("--url", vllm_server["url"], "--api-key-file", str(bare), "--no-restart")
    assert rc == 0, out


def test_real_server_wrong_served_name(cli, vllm_server, key_file):
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    rc, out, err, s = cli("--url", vllm_server["url"], "--served-name", "qwen3.8-27b",
                          "--api-key-file", str(key_file), "--no-restart")
    assert rc == 2 and s["models"] == [vllm_server["name"]]
    assert "'qwen3.8-27b' is not listed" in out


def test_real_server_still_warming_up_is_not_in_service(cli, vllm_server, key_file):
    """vLLM answers while the unit's start-up warm-up runs (activating, start-post): CRITICAL, so the
    health endpoint says 503 and the gateway's pool keeps it out; no restart of a starting unit."""
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    rc, out, err, s = cli("--url", vllm_server["url"], "--served-name", vllm_server["name"], "--restart-after", "1",
                          "--api-key-file", str(key_file), "--unit", "fake-qwen27b.service", env={"FAKE_STATE": "activating"})
    assert rc == 2 and s["health_status"] == 200 and s["models"] == [vllm_server["name"]]
    assert "is warming up" in out and s["restart"]["action"] == "skip"
    assert "restart --no-block" not in cli.calls.read_text()


@pytest.mark.parametrize("key", ["sk-wrong", None])
def test_real_server_wrong_or_missing_key(cli, vllm_server, tmp_path, key):
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    args = ["--url", vllm_server["url"], "--served-name", vllm_server["name"], "--no-restart"]
    if key:
        (tmp_path / "wrong.env").write_text(f"VLLM_API_KEY={key}\n")
        args += ["--api-key-file", str(tmp_path / "wrong.env")]
    rc, out, err, s = cli(*args)
    assert rc == 2 and s["health_status"] == 200  # /health is open, /v1 is guarded
    assert [f["text"] for f in s["findings"]] == [hc.verdict(_readings(
        models={"status": 401, "ids": None, "error": None}))[1][0]["text"]]
    _no_secret(vllm_server["api_key"], out, err, cli.status.read_text())


def test_real_server_outage_and_recovery_in_history(cli, vllm_server, key_file):
    cli.main_pid = vllm_server["pid"]  # the fake systemctl says MainPID: the unit's process
    unit = "qwen27b-health-test-fake.service"
    good = ("--url", vllm_server["url"], "--served-name", vllm_server["name"], "--api-key-file", str(key_file),
            "--unit", unit, "--restart-after", "2")
    bad = ("--url", closed_url(), *good[2:], "--timeout", "2")
    codes = [cli(*args)[0] for args in (good, bad, bad, bad, good)]
    assert codes == [0, 2, 2, 2, 0]
    s = json.loads(cli.status.read_text())
    assert [h["verdict"] for h in s["history"]] == ["OK", "CRITICAL", "CRITICAL", "CRITICAL", "OK"]
    assert s["consecutive_failures"] == 0  # reset on OK
    assert s["last_restart"]["ok"] is True and "2 consecutive CRITICAL" in s["last_restart"]["reason"]
    assert cli.calls.read_text().count(f"restart --no-block {unit}") == 1  # 3rd failure: rate-limited
    _no_secret(vllm_server["api_key"], cli.status.read_text())


@pytest.mark.parametrize("text", [
    '{"time": "2026-12-02T14:32:00+00:00", "consecutive_fail',  # torn by a power cut
    "not json at all\n",
    "\xff\xfe binary",
    '["a", "list"]',
    '{"consecutive_failures": "2"}',
    '{"consecutive_failures": -1}',
    '{"consecutive_failures": true}',
    '{"time": 12}',
    '{"last_restart": "yesterday"}',
    '{"last_restart": {"time": "noon"}}',
    '{"history": "abc"}',
    '{"history": [{"code": 9}]}',
])
def test_cli_a_corrupt_status_file_starts_fresh_and_says_so_once(cli, text):
    """A status file the watchdog cannot trust must not make every run fail (no status written, so
    the watchdog never counts again): the run starts from 0, says why once, and replaces it."""
    cli.status.parent.mkdir(exist_ok=True)
    cli.status.write_bytes(text.encode("latin-1"))
    args = ("--url", closed_url(), "--unit", "fake.service", "--restart-after", "2", "--timeout", "2")
    rc, out, err, s = cli(*args)
    assert rc == 2 and s["consecutive_failures"] == 1 and [h["code"] for h in s["history"]] == [2]
    notes = [f["text"] for f in s["findings"] if "starting fresh" in f["text"]]
    assert len(notes) == 1 and f"the previous status {cli.status}" in notes[0] and "starting fresh" in err
    rc, out, err, s = cli(*args)
    assert "starting fresh" not in err + out and s["consecutive_failures"] == 2
    assert s["restart"]["action"] == "restart"  # the watchdog works again


def test_a_valid_previous_status_is_kept():
    good = {"time": "2026-12-02T14:32:00+00:00", "consecutive_failures": 2, "history": [{"code": 2}],
            "last_restart": {"time": "2026-12-02T14:00:00+00:00", "reason": "r", "ok": True}}
    assert statusfile._valid_status(good) is None and statusfile._valid_status({}) is None
    assert statusfile._valid_status({**good, "last_restart": None}) is None


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_cli_restart_by_request_file_runs_no_systemctl_restart(cli, tmp_path, how):
    """The health unit runs unprivileged: its restart is a request file that the unit's root
    ExecStopPost acts on (tests/unit/test_templates.py runs that line); no `systemctl restart` here."""
    request = tmp_path / "state" / "health-restart.request"
    args = ["--url", closed_url(), "--unit", "fake.service", "--restart-after", "1", "--timeout", "2"]
    env = {contract.RESTART_REQUEST_ENV: str(request)} if how == "environment" else {}
    if how == "flag":
        args += ["--restart-request", str(request)]
    rc, out, err, s = cli(*args, env=env)
    assert rc == 2 and s["restart"]["action"] == "restart" and s["restart"]["ok"] is True
    assert "1 consecutive CRITICAL" in request.read_text() and str(request) in s["restart"]["detail"]
    assert "restart --no-block" not in cli.calls.read_text()


# ============================================================================ a copy's own GPUs (issue 26)

def test_read_gpus_of_one_copy_reads_its_own_and_names_the_others(monkeypatch):
    """A copy's check reads only its GPUs (another copy's lost GPU is not its CRITICAL) and learns
    the others' PCI addresses, so their Xid lines are not its findings either."""
    _fake_driver(monkeypatch, count=4, lost={3})
    others: list = []
    gpus, note = gpu.read_gpus(only=[0, 1], others=others)
    assert note is None and [g["index"] for g in gpus] == [0, 1] and not any(g.get("error") for g in gpus)
    assert others == ["00000000:1A:00.0"]  # GPU 2; GPU 3 is lost: no address, nothing claimed
    assert hc.verdict(_readings(gpu=gpus))[0] == 0
    assert [g["index"] for g in gpu.read_gpus(only=[3])[0]] == [3] and gpu.read_gpus(only=[3])[0][0]["error"]


def test_own_xids_drops_only_lines_on_another_copys_gpu():
    xids = [{"xid": 79, "pci": "0000:1a:00"}, {"xid": 48, "pci": "0000:18:00"}, {"xid": 13, "pci": "garbage"}]
    assert gpu.pci_key("00000000:1A:00.0") == gpu.pci_key("0000:1a:00") == (0, 0x1a, 0)
    assert [x["xid"] for x in gpu.own_xids(xids, ["00000000:1A:00.0"])] == [48, 13]
    assert gpu.own_xids(xids, []) == xids and gpu.own_xids(None, ["00000000:1A:00.0"]) is None


@pytest.mark.parametrize("value, want", [("0,1", [0, 1]), ("3, 2,2", [2, 3]), (None, None)])
def test_copy_and_gpus_from_the_environment(monkeypatch, value, want):
    """The copy's unit sets them with Environment= (a rollback's older qwen27b-health ignores them)."""
    monkeypatch.setenv("QWEN27B_HEALTH_COPY", "a")
    if value is None:
        monkeypatch.delenv("QWEN27B_HEALTH_GPUS", raising=False)
    else:
        monkeypatch.setenv("QWEN27B_HEALTH_GPUS", value)
    args = hc.parse_args(["--url", "http://127.0.0.1:1"])
    assert args.copy == "a" and args.gpus == want


def test_gpus_that_are_not_indices_are_refused(monkeypatch, capsys):
    monkeypatch.delenv("QWEN27B_HEALTH_GPUS", raising=False)
    with pytest.raises(SystemExit):
        hc.parse_args(["--url", "http://127.0.0.1:1", "--gpus", "0,x"])
    assert "--gpus must be GPU indices" in capsys.readouterr().err


def test_the_engines_slots_come_from_a_copys_own_value_or_the_release_records_flags(tmp_path):
    """/health's "slots" (the gateway's fair share): a copy's QWEN27B_SLOTS, else the release record's
    --max-num-seqs (a rollback restores the record, so the check follows it); None when neither says."""
    from qwen27b.onhost.health import engine_slots

    record = tmp_path / "release.json"
    record.write_text(json.dumps({"flags": ["--max-num-seqs 2", "--port 8000"]}))
    assert engine_slots(3, str(record)) == 3
    assert engine_slots(None, str(record)) == 2
    assert engine_slots(None, None) is None and engine_slots(None, str(tmp_path / "absent.json")) is None
    for text in ("not json", json.dumps({"links": {}}), json.dumps({"flags": ["--max-num-seqs x"]}), json.dumps([1])):
        record.write_text(text)
        assert engine_slots(None, str(record)) is None


def test_a_hung_server_costs_the_probe_one_timeout_not_two():
    """A real listening socket that never answers (a SIGSTOPped vLLM: the kernel still accepts the
    connection, nobody reads it): /health and /v1/models time out together, so a run of the check
    takes one --timeout, and each reading names its own timeout."""
    import socket
    import time

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        t0 = time.monotonic()
        health, models = hc.probe(url, "k", timeout=1.5)
        took = time.monotonic() - t0
    assert health["status"] is None and health["error"].startswith("ReadTimeout"), health
    assert models["status"] is None and models["error"].startswith("ReadTimeout"), models
    assert 1.4 < took < 2.6, took  # in turn: 3 s


# ---------------------------------------------------------------------------- the key only to the unit's listener

def test_a_planted_listener_gets_no_key_and_is_named(cli, tmp_path):
    """Issue 51 item 2: a plain Python HTTP server (tests/support/planted.py, its own process, not the
    unit's) holds the port and answers 200 to everything. The unit's MainPID (the fake systemctl's) is
    another real process: the check sends the key nowhere, names the squatter's pid, CRITICAL. With the
    squatter as MainPID the same check sends the key: the test can tell the two apart."""
    from qwen27b.tools.cpu_smoke import free_port
    from tests.support.planted import other_process, planted_listener
    key = tmp_path / "key.env"
    key.write_text("VLLM_API_KEY=sk-planted-test-secret\n")
    port, log = free_port(), tmp_path / "squatter.log"
    args = ("--url", f"http://127.0.0.1:{port}", "--api-key-file", str(key), "--served-name", "m",
            "--no-restart", "--timeout", "5")
    with planted_listener(port, log) as squatter, other_process() as unit_process:
        cli.main_pid = unit_process.pid
        rc, out, err, s = cli(*args)
        assert "sk-planted-test-secret" not in log.read_text(), log.read_text()
        assert rc == 2 and s["verdict"] == "CRITICAL" and not s["listener"]["ours"]
        named = [f["text"] for f in s["findings"] if f["level"] == "CRITICAL"]
        assert any(f"pid {squatter.pid} (python" in t and "the API key was not sent" in t for t in named), named
        assert s["listener"]["holders"][0]["processes"][0]["pid"] == squatter.pid
        cli.main_pid = None  # no unit process at all (MainPID=0): still no key
        rc, out, err, s = cli(*args)
        assert rc == 2 and "sk-planted-test-secret" not in log.read_text()
        assert "the unit has no main process" in s["listener"]["text"]
        cli.main_pid = squatter.pid  # the control: the listener is the unit's own, the key goes
        rc, out, err, s = cli(*args)
        assert s["listener"]["ours"] and "GET /v1/models auth=Bearer sk-planted-test-secret" in log.read_text()
        _no_secret("sk-planted-test-secret", out, err, cli.status.read_text())
