"""`qwen27b qualify` (issue 27): the verdict per GPU (pure), nvidia-smi's readings in their real
shapes, the CPU profile's dry path of the on-host burn-in (run here for real), and the command
over pyinfra @fake hosts replaying that run: a serving host refused unless --force, the table
and a JSON record per GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen27b.onhost import qualify as q
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan.stack import load_stack
from qwen27b.tools import qualify as tool
from tests.support.paths import ROOT

H200 = ROOT / "tests" / "fixtures" / "hosts" / "h200" / "genuine" / "query-gpu.csv"  # header row, then the GPU (a copy of shared/)
PATHS = HostLayout.of(load_stack()["paths"])

IDLE = {"index": 0, "name": "Tesla V100-SXM2-32GB", "bus_id": "00000000:3B:00.0", "ecc_corrected": 0,
        "ecc_uncorrected": 0, "retired_pending": False, "throttle": ["gpu_idle"], "sm_mhz": 135, "mem_mhz": 877,
        "sm_max_mhz": 1530, "temperature_c": 38, "power_w": 41.2, "power_limit_w": 300.0, "pcie_gen": 1,
        "pcie_gen_max": 3, "pcie_width": 16, "pcie_width_max": 16}
LOAD = {**IDLE, "throttle": ["sw_power_cap"], "sm_mhz": 1380, "temperature_c": 71, "power_w": 297.5, "pcie_gen": 3}
WORK = {"tflops": 92.1, "copy_rw_gbs": 780.0, "pattern_mib": 12000, "pattern_errors": 0}


def test_a_healthy_card_under_load_passes():
    assert q.judge(IDLE, IDLE, [LOAD, LOAD], [], WORK) == ("PASS", [])  # gen 1 at idle is power saving


@pytest.mark.parametrize("after, load, xids, work, verdict, says", [
    ({**IDLE, "ecc_uncorrected": 2}, [LOAD], [], WORK, "FAIL", "2 new uncorrected ECC"),
    ({**IDLE, "retired_pending": True}, [LOAD], [], WORK, "FAIL", "pending retirement"),
    (IDLE, [LOAD], [{"xid": 79, "message": "GPU has fallen off the bus."}], WORK, "FAIL", "Xid 79"),
    (IDLE, [LOAD], [], {**WORK, "pattern_errors": 3}, "FAIL", "3 wrong value(s)"),
    (IDLE, [{**LOAD, "throttle": ["hw_power_brake"]}], [], WORK, "FAIL", "hw_power_brake"),
    (IDLE, [LOAD], [], {"error": "RuntimeError: CUDA error: an illegal memory access"}, "FAIL", "the load failed"),
    ({**IDLE, "ecc_corrected": 40}, [LOAD], [], WORK, "WARN", "40 new corrected"),
    (IDLE, [{**LOAD, "pcie_gen": 1, "pcie_width": 4}], [], WORK, "WARN", "PCIe gen 1 of 3 under load"),
    (IDLE, [{**LOAD, "temperature_c": 88, "throttle": ["sw_thermal"]}], [], WORK, "WARN", "88 C"),
], ids=["uncorrected", "pending", "xid79", "pattern", "power-brake", "error", "corrected", "link", "hot"])
def test_verdicts_name_the_evidence(after, load, xids, work, verdict, says):
    got, reasons = q.judge(IDLE, after, load, xids, work)
    assert got == verdict and any(says in r for r in reasons), reasons


def test_the_query_reads_nvidia_smis_real_shapes():
    """The genuine H200 row's shapes ([N/A], a 64-bit hex clocks mask, watts with decimals), laid out in
    qualify's field order from its own values (tests/fixtures/qualify/README.md says which)."""
    genuine = H200.read_text().splitlines()[1].split(", ")
    # index, name, uuid, bus, mem total, used, free, cc, driver, gen, genmax, w, wmax, pm, ecc, temp, power, mask, pending, vbios
    line = ", ".join([genuine[0], genuine[1], genuine[3], "0", "0", genuine[18], genuine[17], "1980", "2619", "1980",
                      genuine[15], genuine[16].removesuffix(" W"), "700.00", genuine[9], genuine[10], genuine[11],
                      genuine[12]])
    (row,) = q.parse_query(line)
    assert row["index"] == 0 and row["name"] == "NVIDIA H200" and row["retired_pending"] is None
    assert row["throttle"] == ["gpu_idle"] and row["power_w"] == 79.12 and row["pcie_width_max"] == 16
    assert q.parse_query("Failed to initialize NVML: Driver/library version mismatch") == []


def test_copy_bandwidth_is_the_copies_bytes_read_and_written_over_their_own_time():
    """Not over the whole loop (the matmuls' time too): 50 copies of 1 GB in 0.1 s of a 10 s loop is
    2 x 1 GB x 50 / 0.1 s = 1000 GB/s (a V100's HBM2, ~900 GB/s peak, shows ~750-850 here)."""
    got = q.rates(size=8192, matmuls=100, seconds=10.0, copy_bytes=10**9, copies=50, copy_seconds=0.1)
    assert got == {"tflops": round(2 * 8192 ** 3 * 100 / 10.0 / 1e12, 2), "copy_rw_gbs": 1000.0}
    assert q.rates(8192, 0, 0.0, 10**9, 0, 0.0) == {"tflops": 0.0, "copy_rw_gbs": 0.0}
    assert "copy r+w GB/s" in q.COLUMNS


def test_only_readings_taken_while_the_load_runs_are_load_samples(monkeypatch):
    """The set-up before the loop (allocations) and the pattern read-back after it leave the GPU idle:
    a reading then (345 MHz, gpu_idle) is not the card under load."""
    phase = {"now": "idle"}
    idle = {**IDLE, "sm_mhz": 345}
    busy = {**LOAD, "sm_mhz": 1965}

    def burn(device, seconds, out, size, fill_fraction, loading=None):
        time.sleep(0.3)  # set-up
        phase["now"] = "load"
        if loading is not None:
            loading.set()
        time.sleep(0.4)
        if loading is not None:
            loading.clear()
        phase["now"] = "idle"
        time.sleep(0.3)  # the pattern read-back
        out.update(dict(WORK))

    monkeypatch.setattr(q, "_burn", burn)
    monkeypatch.setattr(q, "read_smi", lambda: [dict(busy if phase["now"] == "load" else idle)])
    monkeypatch.setattr(q, "read_xids", lambda since: ([], "dmesg"))
    (record,) = q.run(0.01, sample_s=0.02)
    load = record["under_load"]
    assert load["samples"] > 0 and load["min_sm_mhz"] == load["max_sm_mhz"] == 1965
    assert load["throttle"] == ["sw_power_cap"] and record["verdict"] == "PASS"


def _dry_run(tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "qwen27b.onhost.qualify", "--dry", "--minutes", "0.02",
                           "--json-dir", str(tmp_path / "json")], capture_output=True, text=True, env=env, timeout=120)


def test_the_cpu_profiles_dry_path_runs_and_writes_json(tmp_path):
    run = _dry_run(tmp_path)
    assert run.returncode == 0, run.stderr
    (record,) = q.parse_records(run.stdout)
    assert record["verdict"] == "DRY" and record["device"] == "cpu"
    assert json.loads((tmp_path / "json" / "qualify-gpu0.json").read_text())["verdict"] == "DRY"
    assert run.stdout.splitlines()[0].startswith("gpu ") and " DRY " in run.stdout


def test_root_writes_the_json_without_following_a_planted_link(tmp_path):
    """Issue 51: qualify runs as root and writes into the state dir the service user owns; a link
    planted where a record goes is replaced, never followed, and a linked directory is refused."""
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    folder = tmp_path / "json"
    folder.mkdir()
    (folder / "qualify-gpu0.json").symlink_to(victim)
    os.link(victim, folder / "qualify-gpu1.json")
    q.write_records(str(folder), [{"host_gpu": 0, "verdict": "DRY"}, {"host_gpu": 1, "verdict": "DRY"}])
    assert victim.read_text() == "root's file\n"
    for n in (0, 1):
        path = folder / f"qualify-gpu{n}.json"
        assert not path.is_symlink() and json.loads(path.read_text())["verdict"] == "DRY"
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(SystemExit, match="symbolic link there is refused"):
        q.write_records(str(linked), [{"host_gpu": 0}])
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_serving_host_is_refused_unless_forced():
    why = tool.refusal("@fake/a", ["qwen27b.service"], True, force=False)
    assert "qwen27b.service is serving" in why and "--force" in why and "systemctl stop qwen27b.service" in why
    assert tool.refusal("@fake/a", ["qwen27b.service"], True, force=True) is None
    assert "no release venv" in tool.refusal("@fake/a", [], False, force=True)
    command = tool.qualify_command(PATHS, 1, False, "/var/lib/qwen27b/qualify")
    assert command.startswith("timeout 360 PYTHONPATH=") and "-m qwen27b_onhost.qualify --minutes 1 " in command


SHIM = ("import sys\nfrom qwen27b.controller import remote\nremote.new_nonce = lambda: 'n'\n"
        "from qwen27b.tools.qualify import main\nsys.exit(main(sys.argv[1:]))\n")


def test_the_command_on_fake_hosts(tmp_path):
    """Two @fake hosts answering the probe (one serving) and the burn-in with the dry run's real output."""
    dry = _dry_run(tmp_path).stdout.splitlines()
    (tmp_path / "dry.txt").write_text("\n".join(dry))

    def probe(serving: str) -> list[str]:
        return ["@@n@@ BEGIN serving", serving, "", "@@n@@ END serving 0", "@@n@@ BEGIN venv", "yes", "", "@@n@@ END venv 0"]

    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "from pathlib import Path\n"
        f"_dry = Path({str(tmp_path / 'dry.txt')!r}).read_text().splitlines()\n"
        "def _host(serving):\n"
        "    return {'fake_responses': {'@@n@@ BEGIN serving': " + "_PROBE.replace('SERVING', serving).split('|'),\n"
        "                              'qwen27b_onhost.qualify': _dry}, 'fake_delay': 0, 'fake_delay_jitter': 0}\n"
        f"_PROBE = {'|'.join(probe('SERVING'))!r}\n"
        "hosts = [('@fake/idle', _host('')), ('@fake/serving', _host('qwen27b.service'))]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", SHIM, str(inventory), "--minutes", "1", "--out", str(tmp_path / "out")],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr  # the serving host was refused
    assert "@fake/serving: refused: qwen27b.service is serving" in result.stderr
    assert "@fake/idle" in result.stdout and " DRY " in result.stdout and "@fake/serving" not in result.stdout
    assert json.loads((tmp_path / "out" / "@fake_idle" / "gpu0.json").read_text())["verdict"] == "DRY"
    forced = subprocess.run([sys.executable, "-c", SHIM, str(inventory), "--force", "--out", str(tmp_path / "out2")],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert forced.returncode == 0, forced.stderr
    assert "@fake/serving" in forced.stdout


# ------------------------------------------------------------------- real runs on NVIDIA GPUs (recorded)

RECORDED = ROOT / "tests" / "fixtures" / "qualify"
RUNS = sorted(d for d in RECORDED.iterdir() if (d / "table.txt").is_file())  # one folder per GPU model
SAMPLED = [d for d in RUNS if (d / "query-gpu.csv").is_file()]  # with nvidia-smi's rows taken beside the run


def test_a_real_gpu_run_is_recorded():
    """So the tests below cannot vanish into an empty parameter set."""
    assert {"nvidia-h200", "nvidia-h100"} <= {d.name for d in RUNS}, f"no recorded GPU run under {RECORDED} (its README says how)"
    assert [d.name for d in SAMPLED] == ["nvidia-h200"]  # the H100's record kept no rows beside the run


def _recorded(run_dir: Path) -> tuple[list[str], list[dict]]:
    stdout = (run_dir / "table.txt").read_text()
    return stdout.splitlines(), q.parse_records(stdout)


def _load_summary(under_load: dict) -> dict:
    """The record keeps the load's extremes, not every sample: one sample holding them is what judge
    reads from the samples (the union of throttle reasons, the lowest link, the hottest reading)."""
    return {"throttle": under_load["throttle"], "pcie_gen": under_load["pcie_gen"],
            "pcie_width": under_load["pcie_width"], "temperature_c": under_load["max_temperature_c"]}


@pytest.mark.parametrize("run_dir", RUNS, ids=[d.name for d in RUNS])
def test_the_recorded_stdout_parses_and_matches_the_json_files(run_dir):
    lines, records = _recorded(run_dir)
    files = sorted(run_dir.glob("qualify-gpu*.json"))
    assert records and len(records) == len(files) == sum(line.startswith(q.MARKER) for line in lines)
    assert [json.loads(f.read_text()) for f in files] == sorted(records, key=lambda r: r["host_gpu"])
    for r in records:
        assert r["device"].startswith("cuda:") and r["verdict"] in q.VERDICTS and r["verdict"] != "DRY"
        copy = r["work"].get("copy_rw_gbs", r["work"].get("copy_gbs"))  # copy_gbs: recorded before the fix
        assert r["work"]["tflops"] > 0 and copy > 0 and r["under_load"]["samples"] > 0


def _cells(table: list[str]) -> list[list[str]]:
    """A fixed-width table's cells, the columns found from its dashed second line."""
    spans, at = [], 0
    for dashes in table[1].split("  "):
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2
    return [[line[a:b].strip() for a, b in spans] for line in table]


@pytest.mark.parametrize("run_dir", RUNS, ids=[d.name for d in RUNS])
def test_render_table_reproduces_the_recorded_table(run_dir):
    lines, records = _recorded(run_dir)
    table = [line for line in lines if not line.startswith(q.MARKER)]
    host = table[2].split(" ")[0]  # the first row reads "<host's nodename> <gpu>  ..."
    if all("copy_rw_gbs" in r["work"] for r in records):
        assert q.render_table({host: records}) == "\n".join(table)
        return
    # recorded before the copy figure became read + written bytes over the copies' own time: its
    # "copy GB/s" (copy_gbs, over the whole loop) is not shown under the new column; the rest is
    recorded, rendered = _cells(table), _cells(q.render_table({host: records}).splitlines())
    copy = recorded[0].index("copy GB/s")
    assert rendered[0][copy] == "copy r+w GB/s" and {row[copy] for row in rendered[2:]} == {"-"}
    assert [row[copy] for row in recorded[2:]] == [str(r["work"]["copy_gbs"]) for r in records]
    drop = lambda rows: [row[:copy] + row[copy + 1:] for row in rows]  # noqa: E731
    assert drop(rendered) == drop(recorded)


@pytest.mark.parametrize("run_dir", RUNS, ids=[d.name for d in RUNS])
def test_judge_gives_the_recorded_verdict_from_the_recorded_readings(run_dir):
    _, records = _recorded(run_dir)
    for r in records:
        got = q.judge(r["before"], r["after"], [_load_summary(r["under_load"])], r["xids"], r["work"])
        assert got == (r["verdict"], r["reasons"])
    if run_dir not in SAMPLED:
        return
    # the raw rows taken beside the run, read as the load's samples, come to the same verdict
    (r,) = [r for r in records if r["host_gpu"] == 0]
    rows = [row for row in q.parse_query((run_dir / "query-gpu.csv").read_text()) if row["index"] == 0]
    assert q.judge(r["before"], r["after"], rows, r["xids"], r["work"])[0] == r["verdict"]


@pytest.mark.parametrize("run_dir", SAMPLED, ids=[d.name for d in SAMPLED])
def test_parse_query_reads_the_recorded_nvidia_smi_rows(run_dir):
    """query-gpu.csv: `nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits`, as read_smi runs
    it, taken every 15 s beside the run and once after it."""
    _, records = _recorded(run_dir)
    raw = [line for line in (run_dir / "query-gpu.csv").read_text().splitlines() if line.strip()]
    rows = q.parse_query("\n".join(raw))
    assert rows and len(rows) == len(raw)
    by_gpu = {r["host_gpu"]: r for r in records}
    for row in rows:
        before = by_gpu[row["index"]]["before"]
        assert set(row) == set(q.KEYS) and row["name"] == before["name"] and row["bus_id"] == before["bus_id"]
        assert isinstance(row["throttle"], list) and isinstance(row["sm_mhz"], int)
        assert not [r for r in row["throttle"] if r.startswith("0x")]  # every bit of the 64-bit mask is known
        assert isinstance(row["power_w"], float) and row["pcie_width_max"] == before["pcie_width_max"]
