"""Day two's decisions (qwen27b.plan.lifecycle, pure) and the commands they make, run for real
where a shell can run them here: rollout batches, the release record, the rollback target and the
swap (executed in a scratch dir, twice: back and forward again), what pruning keeps, the uninstall
list; and `qwen27b rollout`'s control flow over run reports.

The planned commands of rollback.py and uninstall.py on recorded @fake hosts are in
tests/plans/test_lifecycle_plans.py; the real thing on two systemd test hosts in tests/e2e/test_lifecycle_e2e.py.
"""

from __future__ import annotations

import os
import json
import re
import subprocess
from pathlib import Path

import pytest

from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.lifecycle import (Installed, NoRollback, Record, UninstallOptions, parse_record, plan_rollback,
                                    record_text, restored, rollout_batches, stale_dirs, swap_commands, uninstall_plan)
from qwen27b.plan.stack import load_stack
from qwen27b.tools import rollout as R

PATHS = load_stack()["paths"]
REL, MODEL = PATHS["current_release"], PATHS["current_model"]
FILES = ["/etc/qwen27b/qwen27b.env", "/etc/systemd/system/qwen27b.service", "/etc/qwen27b/release.json"]
KEPT = ["qwen27b.env", "qwen27b.service", "release.json"]


# ---------------------------------------------------------------------------------- rollout order

def test_the_canary_is_the_first_host_then_one_at_a_time():
    assert rollout_batches(["a", "b", "c"]) == [["a"], ["b"], ["c"]]


def test_a_named_canary_goes_first_then_batches_in_inventory_order():
    hosts = ["a", "b", "c", "d", "e", "f"]
    assert rollout_batches(hosts, ["d"], 2) == [["d"], ["a", "b"], ["c", "e"], ["f"]]
    assert rollout_batches(hosts, ["f", "b", "f"], 3) == [["f", "b"], ["a", "c", "d"], ["e"]]
    assert rollout_batches(["a"]) == [["a"]] and rollout_batches([]) == []


@pytest.mark.parametrize(("hosts", "canary", "size", "message"), [
    (["a", "b"], ["x"], 1, "canary x is not among the selected hosts (a, b)"),
    (["a", "b"], None, 0, "batch size must be 1 or more, got 0"),
    (["a", "a"], None, 1, "a host is listed twice"),
])
def test_bad_rollout_arguments_are_refused(hosts, canary, size, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        rollout_batches(hosts, canary, size)


# ---------------------------------------------------------------------------------- release record

RUNNING = Record({REL: "/opt/qwen27b/releases/bbbb", MODEL: "/var/lib/qwen27b/models/m@rev-b"}, "org/m@rev-b",
                 "http://10.0.0.5:8000", "m", False, 300)
KEPT_RECORD = Record({REL: "/opt/qwen27b/releases/aaaa", MODEL: "/var/lib/qwen27b/models/m@rev-a"}, "org/m@rev-a",
                     "http://10.0.0.5:8000", "m", False, 300)


def test_the_record_round_trips_and_its_text_is_stable():
    text = record_text(RUNNING)
    assert text == record_text(RUNNING) and text.endswith("}\n")
    assert set(json.loads(text)) == {"links", "model_ref", "url", "served_name", "speculative", "start_timeout_s"}
    assert parse_record(json.loads(text)) == RUNNING
    assert parse_record(None) is None


@pytest.mark.parametrize("data", [
    {"links": {}},
    {"links": {REL: "releases/relative"}},
    {"links": {REL: "/opt/qwen27b/releases/x; rm -rf /"}},
    {"links": {REL: "/opt/qwen27b/releases/../../etc"}},
    {"unreadable": "Expecting value: line 1 column 2 (char 1)"},
    ["not", "a", "record"],
])
def test_a_record_we_did_not_write_is_refused(data):
    with pytest.raises(ValueError):
        parse_record(data)


# ---------------------------------------------------------------------------------- rollback

def test_rollback_switches_every_link_that_differs_and_restores_the_files():
    plan = plan_rollback(RUNNING, KEPT_RECORD, KEPT, [], FILES)
    assert plan.switch == ((REL, "/opt/qwen27b/releases/bbbb", "/opt/qwen27b/releases/aaaa"),
                           (MODEL, "/var/lib/qwen27b/models/m@rev-b", "/var/lib/qwen27b/models/m@rev-a"))
    assert plan.target == KEPT_RECORD and plan.back == RUNNING and plan.restore == tuple(FILES)
    assert plan.lines(PATHS)[:2] == ["rollback: from release bbbb, model m@rev-b",
                                     "          to   release aaaa, model m@rev-a"]


HEALTH = "/etc/systemd/system/qwen27b-health.service"


def test_the_health_checks_unit_comes_back_with_its_release_and_is_left_where_it_was_not_kept():
    """Issue 56: the health unit holds the release's model label (QWEN27B_MODEL_REF, qwen27b_build_info),
    served name and speculative method: the swap restores it with the env, unit and record. A rollback
    dir kept by a qwen27b before issue 56 lacks it: the rollback still runs, leaves it and says so; a
    missing env or main unit is still refused."""
    files = FILES[:2] + [HEALTH] + FILES[2:]
    plan = plan_rollback(RUNNING, KEPT_RECORD, KEPT + ["qwen27b-health.service"], [], files, [HEALTH])
    assert plan.restore == tuple(files) and plan.unkept == ()
    swap = swap_commands(plan.target.links, list(plan.restore), "/etc/qwen27b/rollback", ["systemctl daemon-reload"])
    assert f"cp -a /etc/qwen27b/rollback/qwen27b-health.service {HEALTH}" in swap
    assert swap.index(f"cp -a /etc/qwen27b/rollback/qwen27b-health.service {HEALTH}") < swap.index("systemctl daemon-reload")
    old = plan_rollback(RUNNING, KEPT_RECORD, KEPT, [], files, [HEALTH])
    assert old.restore == tuple(FILES) and old.unkept == (HEALTH,)
    assert f"   {HEALTH}: not kept (the rollback dir predates it): left as it is until the next deploy" in old.lines(PATHS)
    with pytest.raises(NoRollback, match="lacks the kept qwen27b.env"):
        plan_rollback(RUNNING, KEPT_RECORD, ["qwen27b.service", "release.json"], [], files, [HEALTH])


def test_a_flag_only_rollback_shows_the_flags_it_changes():
    """Issue 32: the same release and model on both sides, and not the flag that differs."""
    now = Record(dict(RUNNING.links), flags=("--dtype float16", "--max-num-seqs 4", "--enforce-eager"))
    kept = Record(dict(RUNNING.links), flags=("--dtype float16", "--max-num-seqs 2"))
    assert parse_record(json.loads(record_text(kept))) == kept  # the flags round-trip
    lines = plan_rollback(now, kept, KEPT, [], FILES).lines(PATHS)
    assert [line for line in lines if "serve flag" in line] == ["   serve flag --enforce-eager: set -> -",
                                                                "   serve flag --max-num-seqs: 4 -> 2"]
    # a kept record from before flags were recorded: nothing is claimed
    assert not [line for line in plan_rollback(now, Record(dict(RUNNING.links)), KEPT, [], FILES).lines(PATHS)
                if "serve flag" in line]


def test_the_restored_release_is_reached_as_its_own_record_says_not_as_the_failed_one():
    """The deploy that failed renamed the model, moved the port, turned speculation on and waited
    longer: the release put back is asked at its own address for its own name, with its own time-out
    (verify's rollback after a failed deploy and the rollback on demand read it alike)."""
    failed = Record(dict(RUNNING.links), url="http://10.0.0.5:9000", served_name="renamed", speculative=True,
                    start_timeout_s=1800)
    kept = Record(dict(KEPT_RECORD.links), model_ref="org/m@rev-a", url="http://10.0.0.5:8000", served_name="m",
                  speculative=False, start_timeout_s=600)
    back = restored(kept, failed)
    assert (back.links, back.url, back.served_name, back.speculative, back.start_timeout_s) == \
        (kept.links, "http://10.0.0.5:8000", "m", False, 600)
    assert plan_rollback(failed, kept, KEPT, [], FILES).target == back


def test_a_kept_record_made_from_links_only_is_verified_like_the_running_one():
    """A host deployed before records existed: the kept record holds the symlinks only."""
    plan = plan_rollback(RUNNING, Record(dict(KEPT_RECORD.links)), KEPT, [], FILES)
    assert (plan.target.url, plan.target.served_name, plan.target.model_ref) == ("http://10.0.0.5:8000", "m", "org/m@rev-b")


@pytest.mark.parametrize(("current", "previous", "kept", "missing", "cause"), [
    (RUNNING, None, [], [], "no previous release is recorded on this host"),
    (None, KEPT_RECORD, KEPT, [], "the running release is not recorded"),
    (RUNNING, KEPT_RECORD, KEPT, ["/var/lib/qwen27b/models/m@rev-a"], "m@rev-a is gone from the host (pruned or deleted)"),
    (RUNNING, KEPT_RECORD, ["release.json"], [], "the rollback dir lacks the kept qwen27b.env, qwen27b.service"),
])
def test_nothing_safe_to_roll_back_to_is_refused_with_the_fix(current, previous, kept, missing, cause):
    with pytest.raises(NoRollback) as refused:
        plan_rollback(current, previous, kept, missing, FILES)
    assert cause in refused.value.cause and "deploy" in refused.value.fix


def _scratch(tmp: Path) -> tuple[dict, list[str], str]:
    """A host layout in a scratch dir: two releases, the running files and the kept copies."""
    (tmp / "releases/a").mkdir(parents=True)
    (tmp / "releases/b").mkdir()
    (tmp / "kept").mkdir()
    files = [str(tmp / name) for name in ("qwen27b.env", "qwen27b.service", "release.json")]
    for path in files:
        Path(path).write_text("running\n")
        (tmp / "kept" / Path(path).name).write_text("kept\n")
    (tmp / "current").symlink_to(tmp / "releases/b")
    return {str(tmp / "current"): str(tmp / "releases/a")}, files, str(tmp / "kept")


def test_the_swap_runs_and_a_second_swap_rolls_forward_again(tmp_path):
    links, files, kept = _scratch(tmp_path)
    for command in swap_commands(links, files, kept, ["true"]):
        subprocess.run(["sh", "-c", command], check=True)
    assert (tmp_path / "current").resolve() == tmp_path / "releases/a"
    assert [Path(p).read_text() for p in files] == ["kept\n"] * 3
    assert sorted(p.name for p in Path(kept).iterdir()) == KEPT and (Path(kept) / "qwen27b.env").read_text() == "running\n"
    assert not Path(kept + ".swap").exists()
    for command in swap_commands({str(tmp_path / "current"): str(tmp_path / "releases/b")}, files, kept, ["true"]):
        subprocess.run(["sh", "-c", command], check=True)
    assert (tmp_path / "current").resolve() == tmp_path / "releases/b"
    assert [Path(p).read_text() for p in files] == ["running\n"] * 3


def test_an_interrupted_swap_leaves_the_kept_copies_whole(tmp_path):
    links, files, kept = _scratch(tmp_path)
    commands = swap_commands(links, files, kept, ["true"])
    for command in commands[:3]:  # cut off after the first restored file
        subprocess.run(["sh", "-c", command], check=True)
    assert [(Path(kept) / name).read_text() for name in KEPT] == ["kept\n"] * 3


# ---------------------------------------------------------------------------------- prune

def test_stale_dirs_keeps_current_the_protected_and_the_quota():
    paths = ["/r/a", "/r/b", "/r/c", "/r/cur", "/r/prev"]
    assert stale_dirs(paths, "/r/cur", {"/r/prev"}, 1) == ["/r/a", "/r/b", "/r/c"]  # previous is the one kept
    assert stale_dirs(paths, "/r/cur", {"/r/prev"}, 2) == ["/r/a", "/r/b"]
    assert stale_dirs(paths, "/r/cur", set(), 1) == ["/r/a", "/r/b", "/r/c"]  # nothing protected: newest spare stays
    assert stale_dirs(paths, "/r/cur", {"/r/cur"}, 1) == ["/r/a", "/r/b", "/r/c"]
    assert stale_dirs(paths, "/r/cur", set(), 5) == [] and stale_dirs(["/r/cur"], "/r/cur", set(), 1) == []
    # the kept record names the OLDEST dir: it stays, the newer spares go
    assert stale_dirs(paths, "/r/cur", {"/r/a"}, 1) == ["/r/b", "/r/c", "/r/prev"]
    assert stale_dirs(paths, "/r/cur", {"/r/a", "/r/prev"}, 1) == ["/r/b", "/r/c"]  # never the protected, even over N


# ---------------------------------------------------------------------------------- uninstall

UNIT_DIR, TEXTFILE = "/etc/systemd/system", "/var/lib/prometheus/node-exporter/qwen27b.prom"
DEPLOYED = Installed(
    paths={"/opt/qwen27b": "root:root", "/etc/qwen27b": "root:root", "/var/lib/qwen27b": "qwen27b:qwen27b",
           "/var/lib/qwen27b/models": "root:qwen27b", f"{UNIT_DIR}/qwen27b.service": "root:root",
           f"{UNIT_DIR}/qwen27b-health.timer": "root:root", f"{UNIT_DIR}/qwen27b-health-http@.service": "root:root",
           f"{UNIT_DIR}/qwen27b-firewall.service": "root:root", TEXTFILE: "qwen27b:qwen27b",
           "/var/lib/prometheus/node-exporter": "root:qwen27b", "/etc/modprobe.d/blacklist-nouveau.conf": "root:root"},
    units={"qwen27b.service": "active", "qwen27b-health.timer": "active", "qwen27b-seed.service": "inactive",
           "qwen27b-firewall.service": "active"},
    users=["qwen27b"], groups=["qwen27b"], nft=["inet qwen27b"], held=["nvidia-driver-580-server", "linux-image-5.15.0"],
    packages={"nvidia-driver-580-server": "580.95.05", "libnvidia-compute-580-server": "580.95.05", "cuda-keyring": "1.1-1"})


def test_uninstall_lists_every_removal_in_order_and_keeps_weights_and_driver():
    removals, kept = uninstall_plan(DEPLOYED, PATHS, UninstallOptions(), UNIT_DIR, TEXTFILE)
    assert [r.what for r in removals] == [
        "stop qwen27b-health.timer, qwen27b.service, qwen27b-firewall.service", "nftables table inet qwen27b",
        "unit files qwen27b.service, qwen27b-health.timer, qwen27b-health-http@.service, qwen27b-firewall.service",
        "/opt/qwen27b", "/etc/qwen27b", "/var/lib/qwen27b except /var/lib/qwen27b/models", TEXTFILE,
        "/var/lib/prometheus/node-exporter: group qwen27b", "service user qwen27b", "group qwen27b"]
    assert removals[0].commands == ("systemctl disable --now qwen27b-health.timer qwen27b.service qwen27b-firewall.service",)
    assert removals[2].commands[0] == ("systemctl disable qwen27b.service qwen27b-health.timer qwen27b-firewall.service "
                                       "2>/dev/null || true")  # the template unit cannot be disabled by name
    assert kept == ["/var/lib/qwen27b/models: the model weights (set qwen27b_uninstall_weights=true to remove them; "
                    "a later deploy uses them again instead of fetching)",
                    "the NVIDIA driver (nvidia-driver-580-server held), the nouveau blacklist: set "
                    "qwen27b_uninstall_driver=true to unhold and purge them"]


def test_uninstall_with_weights_and_driver():
    removals, kept = uninstall_plan(DEPLOYED, PATHS, UninstallOptions(weights=True, driver=True), UNIT_DIR, TEXTFILE)
    by_what = {r.what: r.commands for r in removals}
    assert by_what["/var/lib/qwen27b with the model weights"] == ("rm -rf /var/lib/qwen27b",)
    assert by_what["apt hold on linux-image-5.15.0, nvidia-driver-580-server"] == (
        "apt-mark unhold linux-image-5.15.0 nvidia-driver-580-server",)
    assert by_what["NVIDIA driver packages libnvidia-compute-580-server, nvidia-driver-580-server"] == (
        "DEBIAN_FRONTEND=noninteractive apt-get -y purge libnvidia-compute-580-server nvidia-driver-580-server",)
    assert by_what["/etc/modprobe.d/blacklist-nouveau.conf"] == ("rm -f /etc/modprobe.d/blacklist-nouveau.conf",
                                                                 "update-initramfs -u")
    assert kept == [] and "cuda-keyring" not in str(removals)  # the CUDA toolkit is not the driver


def test_after_an_uninstall_that_kept_the_weights_nothing_is_left_to_remove():
    """What the first run leaves (the weights, root's) is not planned again; before it, the
    service user's state dir and leftovers beside the weights are."""
    left = Installed(paths={"/var/lib/qwen27b": "root:root", "/var/lib/qwen27b/models": "root:root"})
    assert uninstall_plan(left, PATHS, UninstallOptions(), UNIT_DIR, TEXTFILE)[0] == []
    for extra in ({"/var/lib/qwen27b": "998:998"}, {"/var/lib/qwen27b/models/current": "root:root"},
                  {"/var/lib/qwen27b/cache": "998:998"}):
        removals, _ = uninstall_plan(Installed(paths={**left.paths, **extra}), PATHS, UninstallOptions(), UNIT_DIR, TEXTFILE)
        assert [r.what for r in removals] == ["/var/lib/qwen27b except /var/lib/qwen27b/models"], extra
    assert removals[0].commands[-2] == "chown root:root /var/lib/qwen27b && chmod 0755 /var/lib/qwen27b"
    assert removals[0].commands[-1].startswith("if [ -L /var/lib/qwen27b/models ] || [ ! -d /var/lib/qwen27b/models ]; then")


def test_a_second_uninstall_plans_nothing():
    removals, kept = uninstall_plan(Installed(units={u: "inactive" for u in ("qwen27b.service", "qwen27b-seed.service")}),
                                    PATHS, UninstallOptions(weights=True, driver=True), UNIT_DIR, TEXTFILE)
    assert removals == [] and kept == []


def test_the_uninstall_keys_are_checked():
    assert settings_for("h", {"qwen27b_uninstall_weights": True}).uninstall_weights
    with pytest.raises(BadHostData, match="qwen27b_uninstall_driver: expected bool, got str 'yes'"):
        settings_for("h", {"qwen27b_uninstall_driver": "yes"})
    with pytest.raises(BadHostData, match="did you mean 'qwen27b_uninstall_weights'"):
        settings_for("h", {"qwen27b_uninstall_weight": True})


# ---------------------------------------------------------------------------------- qwen27b rollout

class _Deploys:
    """Stands in for `pyinfra ... deploy.py -y --limit ...` in the rollout's control flow only (the
    real runs are in tests/e2e/test_lifecycle_e2e.py): writes the run report the deploy would, with
    the outcome given per host."""

    def __init__(self, reports: Path, outcomes: dict[str, str]):
        self.reports, self.outcomes, self.argvs = reports, outcomes, []

    def __call__(self, argv):
        self.argvs.append(argv)
        hosts = [argv[i + 1] for i, a in enumerate(argv) if a == "--limit"]
        self.reports.mkdir(exist_ok=True)
        summary = [{"host": h, "status": self.outcomes.get(h, "ok"), "detail": f"rolled back: {h} crash-looped"
                    if self.outcomes.get(h) == "rolled back" else "", "failed": self.outcomes.get(h, "ok") != "ok"}
                   for h in hosts]
        run = f"{len(self.argvs):04d}"
        (self.reports / f"deploy-{run}.json").write_text(json.dumps({
            "run": run, "hosts": [{"host": h, "status": s["status"], "ttft_s": 0.12} for h, s in zip(hosts, summary)],
            "summary": summary}))
        return subprocess.CompletedProcess(argv, 1 if any(s["failed"] for s in summary) else 0)


def test_rollout_stops_at_the_first_failed_host_and_names_it(tmp_path):
    runs = _Deploys(tmp_path / "reports", {"c": "rolled back"})
    hooks = []

    class Gateway(R.Hooks):
        def drain(self, hosts):
            hooks.append(("drain", hosts))

        def undrain(self, hosts):
            hooks.append(("undrain", hosts))

    result = R.rollout("inv.py", [["a"], ["b", "c"], ["d"]], ["--data", "x=1"], tmp_path / "reports", Gateway(),
                       run=runs, say=lambda text: None)
    assert [a[a.index("--limit"):] for a in runs.argvs] == [["--limit", "a", "--data", "x=1"],
                                                          ["--limit", "b", "--limit", "c", "--data", "x=1"]]
    assert result.stopped_at == "c" and not result.ok
    assert [(r.batch, r.host, r.outcome) for r in result.rows] == [(1, "a", "ok"), (2, "b", "ok"), (2, "c", "rolled back"),
                                                                   (3, "d", "not started")]
    assert hooks == [("drain", ["a"]), ("undrain", ["a"]), ("drain", ["b", "c"]), ("undrain", ["b", "c"])]  # c: rolled back, verified
    text = R.summary(result)
    assert text.startswith("--> rollout STOPPED at c (rolled back: c crash-looped)")
    assert "not started: d (still on their release)" in text


def test_a_rollout_counts_the_gateway_as_verified_never_as_upgraded(tmp_path):
    """Issue 48 item 8: 'rollout done: 3 host(s) upgraded' counted the gateway host, which has no
    release to upgrade (its deploy re-renders its config and verifies it as a client)."""
    runs = _Deploys(tmp_path / "reports", {})
    result = R.rollout("inv.py", [["a"], ["gw", "b"]], [], tmp_path / "reports", run=runs, say=lambda text: None,
                       gateways={"gw"})
    text = R.summary(result)
    assert result.ok and text.splitlines()[0] == ("--> rollout done: 2 host(s) upgraded and verified, batch by batch; "
                                                  "gateway gw verified (no release to upgrade)")
    assert [r.detail for r in result.rows] == ["", R.GATEWAY_DETAIL, ""]


def test_rollout_help_shows_the_pyinfra_arguments_after_two_dashes(capsys):
    """The README's `qwen27b rollout INVENTORY ... -- --data KEY=VALUE` form, in --help too."""
    with pytest.raises(SystemExit):
        R.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "[-- PYINFRA_ARGS ...]" in out and "-- --data KEY=VALUE" in out and "qwen27b_stack_overrides=" in out


def test_rollout_without_a_report_counts_the_batch_failed(tmp_path):
    result = R.rollout("inv.py", [["a"], ["b"]], [], tmp_path / "reports",
                       run=lambda argv: subprocess.CompletedProcess(argv, 1), say=lambda text: None)
    assert result.stopped_at == "a" and result.rows[0].detail.startswith("no outcome in a run report (pyinfra exit 1)")


def test_rollout_dry_prints_the_batches_and_commands(tmp_path, capsys):
    inventory = tmp_path / "inv.py"
    inventory.write_text("lab = [('@fake/a', {}), ('@fake/b', {}), ('@fake/c', {})]\n")
    assert R.main([str(inventory), "--canary", "@fake/b", "--batch-size", "2", "--dry", "--", "--data", "k=v"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--> rollout of 3 host(s) in 2 batch(es): 1) @fake/b; 2) @fake/a, @fake/c"
    assert out[1:] == [f"    pyinfra {inventory} deploy.py -y --limit @fake/b --data k=v",
                       f"    pyinfra {inventory} deploy.py -y --limit @fake/a --limit @fake/c --data k=v"]


def test_rollout_command_lines_mask_passwords(tmp_path, capsys):
    """Issue 25: a password given with `--data` (or a URL's) was printed in the batch commands."""
    inventory = tmp_path / "inv.py"
    inventory.write_text("lab = [('@fake/a', {})]\n")
    assert R.main([str(inventory), "--dry", "--", "--data", "ssh_password=hunter2",
                   "--data", "qwen27b_hf_endpoint=https://u:pw9@mirror.lab"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "pw9" not in out
    assert "--data 'ssh_password=***' --data 'qwen27b_hf_endpoint=https://u:***@mirror.lab'" in out


def test_uninstall_and_rollback_need_the_hosts_named(tmp_path, capsys):
    from qwen27b.tools import rollback, uninstall

    assert uninstall.main([str(tmp_path / "inv.py")]) == 2 and rollback.main([str(tmp_path / "inv.py")]) == 2
    assert "name the hosts with --limit HOST (or --all" in capsys.readouterr().err


def test_the_roles_and_the_plan_name_the_same_files():
    """The service role keeps (and the rollback restores) the files the renderer writes, in the dir
    the plan module names; the record the service role writes parses back as one."""
    from qwen27b.controller.releasefiles import copies_serving_files, kept_health_units, serving_files
    from qwen27b.onhost.contract import HEALTH_UNIT, SERVICE_UNIT
    from qwen27b.plan.hostlayout import UNIT_DIR
    from qwen27b.plan.lifecycle import release_record_file, rollback_dir
    from roles._common import ROLLBACK_DIR

    # the health check's unit too (issue 56): its model label and served name are the release's
    assert serving_files(PATHS) == [f"{PATHS['config']}/qwen27b.env", f"{UNIT_DIR}/{SERVICE_UNIT}", f"{UNIT_DIR}/{HEALTH_UNIT}",
                                    release_record_file(PATHS)]
    assert copies_serving_files(PATHS, ["a", "b"])[-4:] == [f"{UNIT_DIR}/qwen27b@.service", f"{UNIT_DIR}/qwen27b-health@a.service",
                                                            f"{UNIT_DIR}/qwen27b-health@b.service", release_record_file(PATHS)]
    assert kept_health_units() == [f"{UNIT_DIR}/{HEALTH_UNIT}"] and set(kept_health_units(["a"])) < set(copies_serving_files(PATHS, ["a"]))
    assert ROLLBACK_DIR == rollback_dir(PATHS)


def test_the_record_a_v100_deploy_writes_names_release_model_and_draft():
    from qwen27b.plan.gate import decide
    from recordings import recorded_facts
    from roles.service import release_record

    decision = decide("gpu-a", recorded_facts("v100x4-converged"), load_stack(), settings_for("gpu-a", {"ssh_hostname": "10.0.0.5"}),
                      bind_address="10.0.0.5")
    record = release_record(decision)
    draft = f"{PATHS['models']}/draft"  # the DFlash2 draft of the vendor's profile (issue 49): its own link
    assert set(record.links) == {REL, MODEL, draft}
    assert record.links[MODEL] == f"{PATHS['models']}/QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@main"
    assert record.links[draft] == f"{PATHS['models']}/incoai--Qwen3.8-27B-DFlash2@dedf8df68adfb1afeaf7b7480c0a0243108177b4"
    assert (record.url, record.served_name, record.speculative) == ("http://10.0.0.5:8000", "qwen3.8-27b", True)
    assert parse_record(json.loads(record_text(record))) == record


def test_a_failed_drain_stops_the_rollout_before_the_batch_is_touched(tmp_path):
    runs = _Deploys(tmp_path / "reports", {})

    class Unreachable(R.Hooks):
        def drain(self, hosts):
            if "b" in hosts:
                raise RuntimeError("drain b: gw-1: connection refused")

    result = R.rollout("inv.py", [["a"], ["b"], ["c"]], [], tmp_path / "reports", Unreachable(), run=runs,
                       say=lambda text: None)
    assert len(runs.argvs) == 1 and result.stopped_at == "b"
    assert [(r.host, r.outcome) for r in result.rows] == [("a", "ok"), ("b", "failed"), ("c", "not started")]
    assert result.rows[1].detail == "not deployed: drain failed: drain b: gw-1: connection refused"


def test_the_cli_drains_through_every_gateway_and_skips_the_gateways(tmp_path, monkeypatch):
    """GatewayHooks over gateway_drain (its real gateways: tests/e2e/test_scaleout_gateway.py)."""
    from qwen27b.controller import gateway_drain

    calls = []
    monkeypatch.setattr(gateway_drain, "drain", lambda inv, host: calls.append(("drain", inv, host)))
    monkeypatch.setattr(gateway_drain, "undrain", lambda inv, host: calls.append(("undrain", inv, host)))
    hooks = R.GatewayHooks("inv.py", {"gw-1"})
    hooks.drain(["gw-1", "a", "b"])
    hooks.undrain(["a"])
    assert calls == [("drain", "inv.py", "a"), ("drain", "inv.py", "b"), ("undrain", "inv.py", "a")]


def test_uninstall_of_a_ray_member_and_a_gateway_host():
    """A serving group's Ray unit and a gateway host's own units, dirs and user go too; the names
    are the ones the multinode and gateway roles render."""
    from qwen27b.controller import gateway_render as G
    from qwen27b.onhost.contract import RAY_UNIT
    from qwen27b.plan.lifecycle import GATEWAY_DIRS, GATEWAY_USER, SERVICE_UNITS, UNIT_FILES

    assert {RAY_UNIT, G.GATEWAY_UNIT, G.POOL_UNIT} <= set(SERVICE_UNITS) & set(UNIT_FILES)
    assert G.USER == GATEWAY_USER and {G.CONFIG_DIR, G.STATE_DIR, G.LIB_DIR.rsplit("/", 1)[0]} == set(GATEWAY_DIRS)
    gateway = Installed(paths={"/etc/qwen27b-gateway": "root:root", f"{UNIT_DIR}/qwen27b-gateway.service": "root:root"},
                        units={"qwen27b-gateway.service": "active", "qwen27b-gateway-pool.service": "active"},
                        users=[GATEWAY_USER], groups=[GATEWAY_USER])
    removals, _ = uninstall_plan(gateway, PATHS, UninstallOptions(), UNIT_DIR, TEXTFILE)
    assert [r.what for r in removals] == ["stop qwen27b-gateway.service, qwen27b-gateway-pool.service",
                                          "unit files qwen27b-gateway.service", "/etc/qwen27b-gateway",
                                          "gateway user qwen27b-gateway"]


def test_a_rollout_drains_each_copy_of_a_copies_host_by_its_backend_name(tmp_path, monkeypatch):
    """A host serving copies (qwen27b_instances) is a gateway backend per copy, HOST.NAME
    (plan/gateway.py): the rollout drains and takes back each copy, never the bare host name the
    gateway does not know."""
    from qwen27b.controller import gateway_drain

    inventory = tmp_path / "inv.py"
    inventory.write_text(
        "qwen27b_gateway = [('gw-1', {})]\n"
        "gpus = [('gpu-a', {}), ('gpu-c', {'qwen27b_instances': [{'name': 'a', 'gpus': [0, 1], 'port': 8000},"
        " {'name': 'b', 'gpus': [2, 3], 'port': 8001}]})]\n")
    names, gateways, backends = R.selected_hosts(str(inventory), None)
    assert gateways == {"gw-1"} and set(names) == {"gw-1", "gpu-a", "gpu-c"}
    assert backends["gpu-c"] == ["gpu-c.a", "gpu-c.b"] and backends["gpu-a"] == ["gpu-a"]
    calls = []
    monkeypatch.setattr(gateway_drain, "drain", lambda inv, name: calls.append(("drain", name)))
    monkeypatch.setattr(gateway_drain, "undrain", lambda inv, name: calls.append(("undrain", name)))
    hooks = R.GatewayHooks(str(inventory), gateways, backends)
    hooks.drain(["gw-1", "gpu-a", "gpu-c"])
    hooks.undrain(["gpu-c"])
    assert calls == [("drain", "gpu-a"), ("drain", "gpu-c.a"), ("drain", "gpu-c.b"),
                     ("undrain", "gpu-c.a"), ("undrain", "gpu-c.b")]


def test_the_backend_names_are_the_gateways_names_for_the_host():
    """What the rollout drains is what the gateway's plan names each backend (plan/gateway._backend)."""
    from qwen27b.plan.gateway import _backend, backend_names
    copies = {"qwen27b_instances": [{"name": "a", "gpus": [0, 1], "port": 8000}, {"name": "b", "gpus": [2, 3], "port": 8001}],
              "ssh_hostname": "10.0.0.8"}
    for name, data in (("gpu-c", copies), ("gpu-a", {"ssh_hostname": "10.0.0.7"})):
        assert backend_names(name, data) == [b.name for b in _backend(name, data, settings_for(name, data))]
    assert backend_names("gpu-c", copies) == ["gpu-c.a", "gpu-c.b"]
    assert backend_names("gpu-a", {"qwen27b_instances": []}) == ["gpu-a"]


def _run_keep_weights(state, models):
    import subprocess

    from qwen27b.plan.lifecycle import keep_weights_as_root

    return subprocess.run(["bash", "-c", " && ".join(f"{{ {c}; }}" for c in keep_weights_as_root(str(state), str(models)))],
                          capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to root and back needs root (CI runs as root)")
def test_the_uninstall_keeping_weights_never_follows_a_planted_link(tmp_path):
    """Issue 51: the service user may plant `models` as a link to a file or directory of root's;
    handing the state to root must leave the link's target alone and say so."""
    nobody = 65534
    state, victim = tmp_path / "state", tmp_path / "victim"
    state.mkdir(mode=0o750)
    victim.mkdir(mode=0o700)
    os.chown(state, nobody, nobody)
    (state / "models").symlink_to(victim, target_is_directory=True)
    os.lchown(state / "models", nobody, nobody)
    run = _run_keep_weights(state, state / "models")
    assert run.returncode != 0 and "is not a directory (a symbolic link?)" in run.stderr
    assert (victim.stat().st_mode & 0o777, victim.stat().st_uid) == (0o700, 0)
    assert (state.stat().st_uid, state.stat().st_mode & 0o777) == (0, 0o755)  # the state dir is root's all the same
    (state / "models").unlink()
    (state / "models").mkdir(mode=0o700)
    os.chown(state / "models", nobody, nobody)
    run = _run_keep_weights(state, state / "models")
    assert run.returncode == 0, run.stderr
    assert ((state / "models").stat().st_uid, (state / "models").stat().st_mode & 0o777) == (0, 0o755)
