"""Plans for recorded hosts: the real `pyinfra inventory/recorded.py deploy.py --dry -y` run.

The hosts are pyinfra @fake hosts answering with recorded command output (tests/fixtures/hosts;
V100 outputs are hand-written in the real formats, the H200 one is genuine), because V100s and
the NVIDIA driver cannot be had here. The test asserts the exact operations and commands planned
per host against golden files (tests/golden/<host>.txt), and the refusals.
Regenerate the golden files after an intentional change: QWEN27B_UPDATE_GOLDEN=1 pytest tests/plans/test_plans.py
"""

import os
import re
import shutil
import tempfile

import pytest
from tests.support.paths import ROOT, TESTS
from tests.support.dryrun import host_plan, run_pyinfra, section

GOLDEN = TESTS / "golden"
HOSTS = ["v100x4-2204-fresh", "v100x1-2004", "v100x2-16gb", "v100x2-mixed", "v100x2-mixed-32gb-only", "v100x4-converged", "t4x1-2204", "a100x2-2204",
         "nogpu-2204", "centos7", "v100x1-secureboot", "h200", "h100", "h100-b", "v100x1-open-loaded", "v100x2-open-unloaded",
         "v100x2-r470", "v100x2-r470-held", "v100x4-pg500", "v100x4-noheaders", "v100x4-converged-8g",
         # issue 24: a failed driver build, a newer kernel installed but not booted
         "v100x4-dkms-failed", "v100x4-newer-kernel", "v100x2-old-vllm", "v100x1-pg500", "v100x2-cuda-drivers",
         # issue 52: the lab's own unit on our name, refused; with qwen27b_take_over_unit, kept and taken over
         "v100x2-lab-unit", "v100x2-lab-unit-take-over",
         # a serving group: two 2x V100 16 GB workstations over 10 GbE (qwen27b/plan/multinode.py)
         "v100x2-16gb-pair-head", "v100x2-16gb-pair-worker",
         # the 4x V100 box as two TP-2 copies (qwen27b_instances), fresh and converged (qwen27b/plan/instances.py)
         "v100x4-copies", "v100x4-copies-converged",
         # copy b dropped from qwen27b_instances on the converged copies host: its units and files removed
         "v100x4-copies-drop-b", "v100x4-copies-to-one",
         # GPU topology: the all-reduce per TP group (qwen27b/plan/topology.py)
         "v100x2-pcie", "v100x4-pcie", "v100x8-sxm2-dgx1", "mixed-3090-v100x2",
         # the TP group and a copy's GPUs picked by their links (topology.pick_group)
         "v100x8-dgx1-tp2-of-4", "mixed-3090-v100x2-copy", "v100x8-dgx1-copies-4x2", "v100x4-small-var", "v100x4-data-disk",
         # used cards (issue 27): one GPU left out, a warning naming the GPU, a host refused, persistence off, a cap
         "v100x4-wear-xid79", "v100x4-wear-warn", "v100x2-pcie-worn", "v100x4-converged-nopm", "v100x4-power-cap",
         # sources a lab can reach (issue 30): offline without and with a Python mirror, lab mirrors for every fetch
         "v100x1-2004-offline", "v100x1-2004-offline-pymirror", "v100x1-2004-lab-sources", "v100x1-2004-offline-apt",
         "v100x1-2004-modelscope", "debian12-cpu-lab-index",
         # issue 52 items 3, 5, 7, 8: the driver after unattended-upgrades, the PPA's driver, the MOK key's reboot
         "v100x2-r580-mismatch", "v100x1-secureboot-mok", "v100x2-ppa-580",
         # issue 52 item 2: nvidia-smi never returns (its bounded read timed out, exit 137): refused naming the hang
         "v100x4-wedged"]


@pytest.fixture(scope="module")
def dry_run():
    """With -v: each host's whole plan (a normal run prints only what changes: test_quiet_plan_*)."""
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "-v")
    return result


def test_refused_hosts_make_the_run_fail(dry_run):
    assert dry_run.returncode == 1, dry_run.stderr[-2000:]
    assert "Traceback" not in dry_run.stderr


def onhost_digests(text: str) -> str:
    """Each on-host source file's sha256 (the one it must be shipped with) as <sha256 NAME>, so a
    golden holds the check, not the digest of today's code; a wrong digest stays and fails."""
    from qwen27b.controller.artifacts import source_manifest
    from roles._common import ONHOST_SOURCE
    for name, digest in source_manifest(ONHOST_SOURCE).items():
        text = text.replace(digest, f"<sha256 {name}>")
    return text


@pytest.mark.parametrize("host", HOSTS)
def test_plan_matches_golden(dry_run, host):
    out = dry_run.stderr
    if f"== @fake/{host}: REFUSED" in out:
        text = section(out, host, "REFUSED")
        assert f"@fake/{host}: " not in out.split(text, 1)[1].split("Skipping change detection")[0].replace(
            f"[@fake/{host}]", ""), "a refused host must get no plan after its refusal"
    else:
        text = host_plan(out, host)
    text = onhost_digests(text)
    golden = GOLDEN / f"{host}.txt"
    if os.environ.get("QWEN27B_UPDATE_GOLDEN"):
        golden.write_text(text + "\n")
    assert text + "\n" == golden.read_text()


def test_fresh_v100_plan_shows_the_volta_stack(dry_run):
    plan = re.sub(r" +", " ", host_plan(dry_run.stderr, "v100x4-2204-fresh"))  # column widths aside
    for needle in ("nvidia-driver-580-server", "cuda install cuda-toolkit-12-8", "TileLang", "python install 3.12",
                   "1cat_vllm==1.5.1", "--dtype float16", "FLASH_ATTN_V100", "QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4@main",
                   '{"method":"dflash","model":"/var/lib/qwen27b/models/draft","num_speculative_tokens":7,',
                   "incoai/Qwen3.8-27B-DFlash2@dedf8df68adfb1afeaf7b7480c0a0243108177b4",
                   "--tensor-parallel-size 4", "--max-model-len 262144", "--gpu-memory-utilization 0.8",
                   "--kv-cache-dtype fp8_e5m2", "--block-size 2048", "--mamba-block-size 8192",
                   "KV capacity", "left for KV cache", "CUDA_HOME=/usr/local/cuda-12.8",
                   "--disable-custom-all-reduce (on) TP 4, GPU links not read"):
        assert needle in plan, needle


def test_a100_plan_uses_upstream_vllm(dry_run):
    plan = host_plan(dry_run.stderr, "a100x2-2204")
    assert "profile sm75plus" in plan and "vllm==0.32.0" in plan and "1cat_vllm" not in plan and "build '1cat'" not in plan


def test_run_summary_lists_every_host_and_reruns_only_the_failed(dry_run):
    """The end of a many-host run: each host's outcome, and --limit for exactly the refused ones."""
    summary = dry_run.stderr.split("--> qwen27b run summary: ", 1)[1]
    refused = [h for h in HOSTS if f"== @fake/{h}: REFUSED" in dry_run.stderr]
    assert summary.startswith(f"{len(HOSTS) - len(refused)} of {len(HOSTS)} host(s) ok")
    for h in HOSTS:
        assert re.search(rf"^@fake/{re.escape(h)}\s+{'refused' if h in refused else 'planned'}\b", summary, re.M), h
    rerun = summary.split("re-run only the failed host(s), after fixing the cause:\n", 1)[1].splitlines()[0].split()
    assert rerun[:3] == ["pyinfra", "inventory/recorded.py", "deploy.py"]
    assert sorted(rerun[i + 1] for i, a in enumerate(rerun) if a == "--limit") == sorted(f"@fake/{h}" for h in refused)
    # the PG500 without a driver installs the driver only: planned, said so, and its own re-run line
    assert re.search(r"^@fake/v100x1-pg500\s+planned\s+the driver only .*re-run the deploy after its reboot", summary, re.M)
    again = summary.split("to serve on the host(s) whose driver came first:\n", 1)[1].splitlines()[0].split()
    assert again == ["pyinfra", "inventory/recorded.py", "deploy.py", "--dry", "-y", "-v", "--limit", "@fake/v100x1-pg500"]


def test_refusals_name_cause_and_fix(dry_run):
    out = dry_run.stderr
    assert "cause: unsupported OS CentOS Linux 7 (Core)" in section(out, "centos7", "REFUSED")
    assert "cause: no NVIDIA GPU found" in section(out, "nogpu-2204", "REFUSED")


@pytest.mark.parametrize("host", ["v100x4-converged", "v100x4-copies-converged"])
def test_converged_host_plans_no_change(host):
    """v100x4-copies-converged: the same recorded box serving two copies (qwen27b_instances) plans
    nothing either: the templated unit, both env files, both units running (recorded output)."""
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "--limit", f"@fake/{host}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"== @fake/{host}: [1-9][0-9]* operation\(s\) planned, 0 would change the host", result.stderr)


def test_a_copy_dropped_from_the_inventory_is_stopped_and_removed(dry_run):
    """v100x4-copies-drop-b: converged with copies a and b, the inventory now lists a only. b's unit
    and health timer are stopped and disabled and every file of b removed, by one operation that names
    it, before the listed copy's files; a is left running, untouched (issue 26)."""
    plan = host_plan(dry_run.stderr, "v100x4-copies-drop-b")
    ops = [line.strip() for line in plan.splitlines() if re.match(r"^   (ok|CHANGE) ", line)]
    drop = "CHANGE  stop and remove copy 'b' (qwen27b@b.service, qwen27b-health@b.timer: no longer in qwen27b_instances)"
    assert drop in ops and ops.index(drop) < ops.index("ok      render /etc/qwen27b/qwen27b@a.env")
    commands = plan.split(drop, 1)[1].split("   ok ", 1)[0]
    assert "systemctl disable --now qwen27b-health@b.timer qwen27b@b.service" in commands
    for path in ("/etc/qwen27b/qwen27b@b.env", "/etc/qwen27b/qwen27b@b-api-key.env", "/etc/systemd/system/qwen27b-health@b.service",
                 "/etc/systemd/system/qwen27b-health@b.timer", "/var/lib/qwen27b/health@b.json",
                 "/var/lib/qwen27b/health-restart@b.request", "/var/lib/prometheus/node-exporter/qwen27b@b.prom"):
        assert path in commands, path
    assert "ok      qwen27b@a.service enabled and running" in ops  # not restarted
    assert not [op for op in ops if "@a" in op and op.startswith("CHANGE")]
    assert "stop and remove copy" not in host_plan(dry_run.stderr, "v100x4-copies-converged")


def test_a_host_back_to_one_service_removes_its_copies_first(dry_run):
    """v100x4-copies-to-one: converged with copies a and b, the inventory serves one service. Both
    copies and their template go before qwen27b.service is rendered and started on their GPUs and port."""
    ops = [line.strip() for line in host_plan(dry_run.stderr, "v100x4-copies-to-one").splitlines()
           if re.match(r"^   (ok|CHANGE) ", line)]
    order = [next(i for i, op in enumerate(ops) if op.startswith(start)) for start in (
        "CHANGE  stop and remove copy 'a'", "CHANGE  stop and remove copy 'b'",
        "CHANGE  remove qwen27b@.service (the host serves one service, no copies)",
        "CHANGE  render /etc/systemd/system/qwen27b.service", "CHANGE  restart qwen27b.service")]
    assert order == sorted(order)
    assert "remove qwen27b@.service" not in host_plan(dry_run.stderr, "v100x4-converged")


def test_bad_inventory_is_refused_before_any_host_is_touched(tmp_path):
    inventory = tmp_path / "bad.py"
    inventory.write_text(
        "from inventory.recorded import _fake\n"
        "hosts = [_fake('v100x4-2204-fresh', qwen27b_port='8000'), _fake('v100x1-2004', qwen27b_prot=1)]\n")
    result = run_pyinfra(str(inventory), "deploy.py", "--dry", "-y")
    assert result.returncode != 0
    assert "bad inventory data, no host was touched: @fake/v100x4-2204-fresh: qwen27b_port: expected int, got str '8000'" in result.stderr
    assert "Loaded fact" not in result.stderr and "operation(s) planned" not in result.stderr


def test_secure_boot_with_a_mok_key_signs_the_module_and_open_driver_is_refused(tmp_path):
    inventory = tmp_path / "variants.py"
    inventory.write_text(
        "from inventory.recorded import _fake\n"
        "hosts = [_fake('v100x1-secureboot', qwen27b_mok_key_path='/root/mok/MOK.priv'),\n"
        "         ('@fake/open-driver', _fake('v100x4-2204-fresh', qwen27b_stack_overrides={'driver': {'package': 'nvidia-driver-580-open'}})[1])]\n")
    result = run_pyinfra(str(inventory), "deploy.py", "--dry", "-y")
    out = result.stderr
    assert result.returncode == 1  # the -open host is refused
    refusal = section(out, "open-driver", "REFUSED")
    assert "nvidia-driver-580-open on Tesla V100-SXM2-32GB" in refusal and "GSP" in refusal
    assert "fix:   use the proprietary nvidia-driver-580" in refusal
    plan = host_plan(out, "v100x1-secureboot")
    assert "DKMS signs the module with the MOK key" in plan and "qwen27b-mok.conf" in plan


def converged_plan_with_dirs(tmp_path, directory: str, listing: list[str], records: str | None = None) -> str:
    """The converged host's dry plan, with `directory` recorded as holding `listing` (Subdirectories
    lines '<mtime> <name>', oldest first) and, optionally, its ReleaseRecords answer (one JSON line)."""
    inventory = tmp_path / "dirs.py"
    inventory.write_text(
        "import re\n"
        "from inventory.recorded import _fake\n"
        "from qwen27b.controller.host_facts import ReleaseRecords\n"
        "from tests.support.recorded import fake_match\n"
        "name, data = _fake('v100x4-converged')\n"
        f"data['fake_responses'][{directory + ' -mindepth 1 -maxdepth 1 -type d'!r}] = {listing!r}\n"
        + (f"data['fake_responses'] = {{fake_match(ReleaseRecords): [{records!r}], **data['fake_responses']}}\n"
           if records else "")
        + "hosts = [(name, data)]\n")
    result = run_pyinfra(str(inventory), "deploy.py", "--dry", "-y")
    return host_plan(result.stderr, "v100x4-converged")


DRAFT_REVISION = "dedf8df68adfb1afeaf7b7480c0a0243108177b4"  # the vendor's release profile pins it
CURRENT_RELEASE = "cc145ac8918e"  # v100x4-converged's release (its extra.yaml, tests/fixtures/hosts)


def test_old_model_revisions_are_pruned_but_the_rollback_target_stays(tmp_path):
    """The converged host, recorded with three older revisions of its checkpoint on disk."""
    plan = converged_plan_with_dirs(tmp_path, "/var/lib/qwen27b/models", [
        "1764000000 QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@zzzoldest", "1764000100 QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@aaaolder",
        "1764000200 QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@0000newer", "1764000300 QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@main",
        f"1764000400 incoai--Qwen3.8-27B-DFlash2@{DRAFT_REVISION}", "1764000500 unrelated@x"])
    prune = [line for line in plan.splitlines() if "$ rm -rf" in line]
    # nothing is replaced on this run: one old revision (the newest, 0000newer) stays for rollback
    assert prune == ["            $ rm -rf -- /var/lib/qwen27b/models/QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@zzzoldest "
                     "/var/lib/qwen27b/models/QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@aaaolder"], plan[-2500:]


def test_old_releases_are_pruned_never_the_current_nor_the_previous(tmp_path):
    """The converged host (current release CURRENT_RELEASE, nothing replaced on this run), recorded
    with three older release dirs: with qwen27b_keep_releases=1 the newest old one stays for a
    rollback, the two older go, oldest first; the current one never (stale_dirs below covers the
    previous one of an upgrade)."""
    plan = converged_plan_with_dirs(tmp_path, "/opt/qwen27b/releases", [
        "1764000000 aaaa00000001", "1764000100 aaaa00000002", "1764000200 aaaa00000003", f"1764000300 {CURRENT_RELEASE}"])
    prune = [line.strip() for line in plan.splitlines() if "$ rm -rf -- /opt/qwen27b/releases" in line]
    assert prune == ["$ rm -rf -- /opt/qwen27b/releases/aaaa00000001 /opt/qwen27b/releases/aaaa00000002"], plan[-3000:]


def test_the_release_kept_on_the_host_for_rollback_is_never_pruned(tmp_path):
    """The converged host (nothing replaced on this run) whose kept release record (the rollback
    deploy's target, /etc/qwen27b/rollback/release.json) names the OLDEST release dir: that one
    stays, counted against qwen27b_keep_releases=1, and the two newer old ones go."""
    import json
    records = json.dumps({"current": None, "kept": ["qwen27b.env", "qwen27b.service", "release.json"], "missing": [],
                          "previous": {"links": {"/opt/qwen27b/current": "/opt/qwen27b/releases/aaaa00000001"}}})
    plan = converged_plan_with_dirs(tmp_path, "/opt/qwen27b/releases", [
        "1764000000 aaaa00000001", "1764000100 aaaa00000002", "1764000200 aaaa00000003", f"1764000300 {CURRENT_RELEASE}"],
        records)
    prune = [line.strip() for line in plan.splitlines() if "$ rm -rf -- /opt/qwen27b/releases" in line]
    assert prune == ["$ rm -rf -- /opt/qwen27b/releases/aaaa00000002 /opt/qwen27b/releases/aaaa00000003"], plan[-3000:]


def test_kept_driver_gets_no_reboot_and_the_host_python_is_the_venvs(dry_run):
    """The genuine H200 recording (driver outside apt): nothing driver-related changes, and the venv
    uses the /usr/bin/python3.12 the plan keeps, never a downloaded one."""
    plan = host_plan(dry_run.stderr, "h200")
    operations = plan.split("== @fake/h200: ")[-1]
    assert "reboot" not in operations and "NVIDIA driver" not in operations and "nvidia-persistenced" not in operations
    assert "uv venv --no-managed-python --seed --python /usr/bin/python3.12 " in plan
    assert "python install" not in plan and "python   keep     3.12" in plan


def test_open_driver_is_purged_in_the_same_apt_transaction(dry_run):
    plan = host_plan(dry_run.stderr, "v100x1-open-loaded")
    assert ("--purge install nvidia-driver-580-server nvidia-dkms-580-open- nvidia-driver-580-open- "
            "nvidia-kernel-source-580-open-\n") in plan
    assert plan.count("reboot to load the new driver") == 1
    unloaded = host_plan(dry_run.stderr, "v100x2-open-unloaded")  # qwen27b_skip_reboot
    assert "reboot to load" not in unloaded and "By hand: `sudo systemctl reboot`" in unloaded


def test_dry_run_fetches_nothing_and_says_what_it_would(tmp_path):
    """An empty controller cache: --dry plans the uv fetch as a line and downloads nothing."""
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "--limit", "@fake/v100x4-2204-fresh",
                         QWEN27B_CACHE=str(tmp_path))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "toolchain: will fetch uv 0.13.9 from PyPI into the controller cache" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_artifact_that_cannot_be_fetched_fails_the_host_never_ok(tmp_path):
    """Offline controller (pip finds no index), a real (not --dry) run on the @fake H200, which plans
    no reboot: the host fails with the fix, no traceback, and the summary says failed."""
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "-y", "--limit", "@fake/h200",
                         QWEN27B_CACHE=str(tmp_path), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "none"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "== @fake/h200: FAILED while planning" in result.stderr and "Put the uv binary at" in result.stderr
    assert re.search(r"^@fake/h200\s+failed\s+while planning: could not download uv", result.stderr, re.M)
    assert "0 of 1 host(s) ok" in result.stderr


def test_garbled_fact_output_refuses_that_host_naming_the_fact_and_its_command(tmp_path):
    """A copy of the converged recording whose nvidia-smi line is cut short, beside the real one:
    that host is refused (fact, command, fix; no traceback), the other still gets its plan."""
    hosts = ROOT / "tests" / "fixtures" / "hosts"
    garbled = tmp_path / "garbled"
    shutil.copytree(hosts / "v100x4-converged", garbled)
    shutil.copy(hosts / "linux-common.yaml", tmp_path)
    (garbled / "nvidia-smi-query-gpu.csv").write_text("0, Tesla V100-SXM2-32GB, GPU-4d7c\n")
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "from pathlib import Path\nfrom tests.support.recorded import fake_responses\n"
        "data = {'fake_delay': 0, 'fake_delay_jitter': 0}\n"
        f"hosts = [('@fake/garbled', dict(data, fake_responses=fake_responses(Path({str(garbled)!r})))),\n"
        f"         ('@fake/converged', dict(data, fake_responses=fake_responses(Path({str(hosts / 'v100x4-converged')!r}))))]\n")
    result = run_pyinfra(str(inventory), "deploy.py", "--dry", "-y")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    refusal = section(result.stderr, "garbled", "REFUSED")
    assert "the NvidiaGpus fact's output could not be parsed" in refusal and "nvidia-smi --query-gpu=" in refusal
    assert "fix:   run that command on the host" in refusal
    alone = run_pyinfra(str(inventory), "deploy.py", "--dry", "-y", "--limit", "@fake/converged")
    expected = re.search(r"^== @fake/converged: \d+ operation\(s\) planned.*$", alone.stderr, re.M)
    assert expected and expected.group(0) in result.stderr  # the same plan as when it runs alone
    assert re.search(r"^@fake/garbled\s+refused\s+the NvidiaGpus fact", result.stderr, re.M)


def test_a_normal_run_prints_what_changes_and_v_the_whole_plan(dry_run):
    """Without -v: the converged host is its head, warnings and one count line (its -v plan is the
    golden, ~120 lines); the fresh host gets its decision tables and only the operations that change."""
    out = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "--limit", "@fake/v100x4-converged",
                      "--limit", "@fake/v100x4-2204-fresh").stderr
    converged = out.split("== @fake/v100x4-converged: profile", 1)[1].split("\n\n    [", 1)[0]
    assert len(converged.splitlines()) <= 12, converged
    assert "vllm serve flag" not in converged and "install  action" not in converged
    counted = re.search(r"== @fake/v100x4-converged: (\d+) operation\(s\) planned, 0 would change the host\n"
                        r"   \(\1 operation\(s\) with nothing to change, the decision tables and notes: pyinfra -v shows "
                        r"the whole plan\)", converged)
    assert counted, converged
    every_op = re.findall(r"^   (?:CHANGE|ok    )  ", GOLDEN.joinpath("v100x4-converged.txt").read_text(), re.M)
    assert int(counted.group(1)) == len(every_op)  # the count is the -v plan's operations, none hidden
    assert "WARNING: model QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 follows the moving branch 'main'" in converged
    assert "WARNING: draft" not in converged  # the DFlash2 draft is pinned (the vendor's release profile)
    assert "verify: not verified: the service listens on 127.0.0.1 only" in converged  # a note for the reader
    fresh = host_plan(out, "v100x4-2204-fresh")
    assert "install  action" in fresh and "vllm serve flag" in fresh and "memory plan" in fresh
    listed = re.findall(r"^   (CHANGE|ok    )  ", fresh, re.M)
    assert listed and set(listed) == {"CHANGE"}, listed
    unchanged = re.search(r"\((\d+) operation\(s\) with nothing to change: pyinfra -v shows the whole plan\)", fresh)
    assert unchanged and int(unchanged.group(1)) >= 1, fresh
    whole = GOLDEN.joinpath("v100x4-2204-fresh.txt").read_text()
    every_op = re.findall(r"^   (CHANGE|ok    )  ", whole, re.M)  # -v: every operation
    assert len(listed) == every_op.count("CHANGE") and len(listed) + int(unchanged.group(1)) == len(every_op)


def test_a_host_nobody_can_verify_is_unverified_and_the_run_fails():
    """A real (not --dry) run of the @fake converged host, which serves on loopback: verify cannot
    reach it, so the run exits 1 and the summary says `unverified` with the fix, never `ok`."""
    work = tempfile.mkdtemp(prefix="qwen27b-unverified-")  # its own cache: this run fetches uv into it
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "-y", "--limit", "@fake/v100x4-converged",
                         QWEN27B_REPORTS=f"{work}/reports", QWEN27B_CACHE=f"{work}/cache")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(r"^@fake/v100x4-converged\s+unverified\s+not verified: the service listens on 127\.0\.0\.1 only, "
                     r"which the controller cannot reach; set qwen27b_bind_address", result.stderr, re.M)
    assert "0 of 1 host(s) ok" in result.stderr
