"""rollback.py and uninstall.py on recorded @fake hosts: the exact commands planned (`pyinfra
... --dry`), and what is refused. The converged 4x V100 recording stands for a deployed host
(V100s and the NVIDIA driver cannot be had here, so the driver's unhold and purge are proven
here only); the release records and the deployed state are the answers of the ReleaseRecords
and DeployedState facts (their JSON cases in tests/host_facts/). The real runs on systemd test
hosts: tests/e2e/test_lifecycle_e2e.py.
"""

from __future__ import annotations

import json
import re

from tests.support.dryrun import run_pyinfra
from tests.support.releases import CURRENT, PREVIOUS

HOST = "@fake/v100x4-converged"
KEPT = ["qwen27b.env", "qwen27b.service", "qwen27b-health.service", "release.json"]
DEPLOYED = ["path root:root /opt/qwen27b", "path root:root /etc/qwen27b", "path qwen27b:qwen27b /var/lib/qwen27b",
            "path root:qwen27b /var/lib/qwen27b/models", "path root:root /etc/modprobe.d/blacklist-nouveau.conf",
            "path root:root /etc/systemd/system/qwen27b.service", "path root:root /etc/systemd/system/qwen27b-health.service",
            "path root:root /etc/systemd/system/qwen27b-health.timer",
            "path root:root /etc/systemd/system/qwen27b-health-http.socket",
            "path root:root /etc/systemd/system/qwen27b-health-http@.service",
            "unit qwen27b-health.timer active", "unit qwen27b-health-http.socket active", "unit qwen27b.service active",
            "unit qwen27b-health.service inactive", "unit qwen27b-seed.service inactive",
            "unit qwen27b-firewall.service inactive", "user qwen27b", "group qwen27b"]


def converged_inventory(answers: dict) -> str:
    """An inventory of the converged recorded host whose host_facts (by class name) answer `answers` first."""
    return ("from inventory.recorded import _fake\n"
            "from qwen27b.controller import facts, host_facts\n"
            "from tests.support.recorded import fake_match\n"
            "_name, _data = _fake('v100x4-converged', ssh_hostname='10.0.0.5')\n"
            f"_data['fake_responses'] = {{fake_match(getattr(host_facts, k, None) or getattr(facts, k)): v for k, v in {answers!r}.items()}} | _data['fake_responses']\n"
            "hosts = [(_name, _data)]\n")


def plan(tmp_path, deploy_file: str, records: dict | None = None, deployed: list[str] | None = None, *data: str,
         unit_files: list[str] | None = None):
    """(exit code, the host's plan block and the run summary) of `pyinfra INV FILE --dry` on the converged host;
    `unit_files`: the UnitFiles fact's answer (issue 52)."""
    inventory = tmp_path / "inv.py"
    answers = {} if unit_files is None else {"UnitFiles": unit_files}
    if records is not None:
        answers["ReleaseRecords"] = [json.dumps(records)]
    if deployed is not None:
        answers["DeployedState"] = deployed
    inventory.write_text(converged_inventory(answers))
    extra = [part for item in data for part in ("--data", item)]
    result = run_pyinfra(str(inventory), deploy_file, "--dry", "-y", *extra, QWEN27B_REPORTS=str(tmp_path / "reports"))
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.returncode, result.stderr


def ops(out: str) -> list[str]:
    block = re.search(rf"^== {re.escape(HOST)}: \d+ operation.*?(?=^\s*$|\Z)", out, re.M | re.S).group(0)
    return [line.strip() for line in block.splitlines()]


def test_rollback_plan_switches_back_restores_the_kept_files_and_verifies(tmp_path):
    rc, out = plan(tmp_path, "rollback.py", {"current": CURRENT, "previous": PREVIOUS, "kept": KEPT, "missing": []})
    assert rc == 0, out[-3000:]
    assert ("   rollback: from release bc7b88da5403, model nvidia--Qwen3.8-27B-NVFP4@main\n"
            "             to   release bc7b88da5403, model nvidia--Qwen3.8-27B-NVFP4@abc1234\n") in out
    assert ops(out) == [
        f"== {HOST}: 4 operation(s) planned, 1 would change the host",
        "ok      lock: one deploy at a time on this host",
        "CHANGE  rollback: switch to the previous release (symlinks, units, env, record) and restart",
        "$ rm -rf /etc/qwen27b/rollback.swap && mkdir /etc/qwen27b/rollback.swap && cp -a /etc/qwen27b/qwen27b.env "
        "/etc/systemd/system/qwen27b.service /etc/systemd/system/qwen27b-health.service /etc/qwen27b/release.json "
        "/etc/qwen27b/rollback.swap/",
        "$ cp -a /etc/qwen27b/rollback/qwen27b.env /etc/qwen27b/qwen27b.env",
        "$ cp -a /etc/qwen27b/rollback/qwen27b.service /etc/systemd/system/qwen27b.service",
        # issue 56: the health check's unit (QWEN27B_MODEL_REF, qwen27b_build_info's model label) is the release's
        "$ cp -a /etc/qwen27b/rollback/qwen27b-health.service /etc/systemd/system/qwen27b-health.service",
        "$ cp -a /etc/qwen27b/rollback/release.json /etc/qwen27b/release.json",
        "$ ln -sfn /opt/qwen27b/releases/bc7b88da5403 /opt/qwen27b/current.new && mv -Tf /opt/qwen27b/current.new /opt/qwen27b/current",
        "$ ln -sfn /var/lib/qwen27b/models/nvidia--Qwen3.8-27B-NVFP4@abc1234 /var/lib/qwen27b/models/current.new && "
        "mv -Tf /var/lib/qwen27b/models/current.new /var/lib/qwen27b/models/current",
        "$ ln -sfn /var/lib/qwen27b/models/incoai--Qwen3.8-27B-DFlash2@main /var/lib/qwen27b/models/draft.new && "
        "mv -Tf /var/lib/qwen27b/models/draft.new /var/lib/qwen27b/models/draft",
        "$ rm -rf /etc/qwen27b/rollback && mv -T /etc/qwen27b/rollback.swap /etc/qwen27b/rollback",
        "$ systemctl daemon-reload",
        "$ systemctl stop qwen27b.service; systemctl reset-failed qwen27b.service; systemctl start --no-block qwen27b.service",
        "ok      verify: the release rolled back to (readiness, /v1/models, streamed completion)",
        "ok      unlock: this deploy is done"]


def test_rollback_of_a_dir_kept_before_the_health_unit_was_leaves_it_and_says_so(tmp_path):
    """A rollback dir kept by a qwen27b before issue 56 holds no health unit: the rollback still runs
    (env, unit, record), names the health unit it leaves, and never copies a file that is not there."""
    rc, out = plan(tmp_path, "rollback.py", {"current": CURRENT, "previous": PREVIOUS, "missing": [],
                                             "kept": ["qwen27b.env", "qwen27b.service", "release.json"]})
    assert rc == 0, out[-3000:]
    assert ("   /etc/systemd/system/qwen27b-health.service: not kept (the rollback dir predates it): "
            "left as it is until the next deploy") in out
    assert "rollback/qwen27b-health.service" not in out and "/etc/systemd/system/qwen27b-health.service /etc" not in out


def test_rollback_on_a_host_whose_models_are_on_the_big_disk_names_the_revisions_there(tmp_path):
    """qwen27b_models_dir (issue 52 item 4): the release records' model links are under that dir, and the
    rollback plan reads them there (it said "model ?" when it read the stack's default models path)."""
    moved = {k: json.loads(json.dumps(v).replace("/var/lib/qwen27b/models", "/data/qwen27b/models"))
             for k, v in (("current", CURRENT), ("previous", PREVIOUS))}
    rc, out = plan(tmp_path, "rollback.py", {**moved, "kept": KEPT, "missing": []}, None,
                   "qwen27b_models_dir=/data/qwen27b/models")
    assert rc == 0, out[-3000:]
    assert ("   rollback: from release bc7b88da5403, model nvidia--Qwen3.8-27B-NVFP4@main\n"
            "             to   release bc7b88da5403, model nvidia--Qwen3.8-27B-NVFP4@abc1234\n") in out, out[-3000:]
    assert ("$ ln -sfn /data/qwen27b/models/nvidia--Qwen3.8-27B-NVFP4@abc1234 /data/qwen27b/models/current.new && "
            "mv -Tf /data/qwen27b/models/current.new /data/qwen27b/models/current") in ops(out)


def test_rollback_with_nothing_recorded_or_a_pruned_target_is_refused(tmp_path):
    rc, out = plan(tmp_path, "rollback.py", {"current": CURRENT, "previous": None, "kept": [], "missing": []})
    assert rc == 1 and f"== {HOST}: REFUSED (nothing will be run on this host)" in out
    assert "cause: no previous release is recorded on this host" in out and "operation(s) planned" not in out
    assert re.search(rf"^{re.escape(HOST)}\s+refused\s+no previous release", out, re.M), out[-2000:]
    rc, out = plan(tmp_path, "rollback.py", {"current": CURRENT, "previous": PREVIOUS, "kept": KEPT,
                                             "missing": ["/var/lib/qwen27b/models/nvidia--Qwen3.8-27B-NVFP4@abc1234"]})
    assert rc == 1 and "NVFP4@abc1234 is gone from the host (pruned or deleted)" in out


def test_uninstall_plan_lists_and_removes_what_is_there(tmp_path):
    rc, out = plan(tmp_path, "uninstall.py", None, DEPLOYED)
    assert rc == 0, out[-3000:]
    listing = out[out.index(f"== {HOST}: uninstall plan"):].split("\n\n", 1)[0].splitlines()
    assert listing[0] == f"== {HOST}: uninstall plan (7 removal(s))"
    assert [line.split(":", 1)[0].strip() for line in listing[1:]] == [
        "remove stop qwen27b-health.timer, qwen27b-health-http.socket, qwen27b.service",
        "remove unit files qwen27b.service, qwen27b-health.service, qwen27b-health.timer, qwen27b-health-http.socket, "
        "qwen27b-health-http@.service",
        "remove /opt/qwen27b", "remove /etc/qwen27b", "remove /var/lib/qwen27b except /var/lib/qwen27b/models",
        "remove service user qwen27b", "remove group qwen27b", "keep   /var/lib/qwen27b/models",
        "keep   the NVIDIA driver (nvidia-driver-580-server held), the nouveau blacklist"]
    commands = [line for line in ops(out) if line.startswith("$")]
    assert commands[:2] == ["$ systemctl disable --now qwen27b-health.timer qwen27b-health-http.socket qwen27b.service",
                            "$ systemctl disable qwen27b.service qwen27b-health.service qwen27b-health.timer "
                            "qwen27b-health-http.socket 2>/dev/null || true"]
    assert "$ rm -rf /opt/qwen27b" in commands and "$ userdel qwen27b" in commands
    assert not [c for c in commands if "apt" in c or "nvidia" in c or "initramfs" in c]  # the driver stays


def test_uninstall_of_the_driver_when_asked(tmp_path):
    rc, out = plan(tmp_path, "uninstall.py", None, DEPLOYED, "qwen27b_uninstall_driver=true", "qwen27b_uninstall_weights=true")
    assert rc == 0, out[-3000:]
    commands = [line for line in ops(out) if line.startswith("$")]
    assert "$ apt-mark unhold nvidia-driver-580-server" in commands
    purge = next(c for c in commands if "apt-get -y purge" in c)
    assert "nvidia-driver-580-server" in purge and "libnvidia-compute-580-server" in purge and "cuda" not in purge
    assert commands[-3:] == ["$ rm -f /etc/modprobe.d/blacklist-nouveau.conf", "$ update-initramfs -u",
                             "$ rmdir /run/qwen27b 2>/dev/null || true"]  # the lock's directory, once released
    assert "$ rm -rf /var/lib/qwen27b" in commands


def test_uninstall_removes_apts_proxy_setting_and_its_login(tmp_path):
    """Issue 32: the apt.conf line and the 0600 apt_auth file (the proxy's password) stayed after an uninstall."""
    rc, out = plan(tmp_path, "uninstall.py", None, DEPLOYED + ["path root:root /etc/apt/apt.conf.d/90qwen27b-proxy",
                                                               "path root:root /etc/apt/auth.conf.d/90qwen27b-proxy.conf"])
    assert rc == 0, out[-3000:]
    commands = [line for line in ops(out) if line.startswith("$")]
    assert "$ rm -rf /etc/apt/apt.conf.d/90qwen27b-proxy" in commands
    assert "$ rm -rf /etc/apt/auth.conf.d/90qwen27b-proxy.conf" in commands
    assert "remove /etc/apt/auth.conf.d/90qwen27b-proxy.conf: apt's login to the proxy (its password)" in out


def test_uninstall_removes_the_apt_mirror_files_conf_first(tmp_path):
    """qwen27b_apt_mirror's conf goes before the list it names (apt then reads the host's own sources)."""
    paths = ["/etc/apt/apt.conf.d/90qwen27b-mirror", "/etc/apt/qwen27b-mirror.list", "/etc/apt/qwen27b-mirror.list.d",
             "/etc/apt/auth.conf.d/90qwen27b-mirror.conf"]
    rc, out = plan(tmp_path, "uninstall.py", None, DEPLOYED + [f"path root:root {p}" for p in paths])
    assert rc == 0, out[-3000:]
    commands = [line for line in ops(out) if line.startswith("$")]
    assert [commands.index(f"$ rm -rf {p}") for p in paths] == sorted(commands.index(f"$ rm -rf {p}") for p in paths)


def test_a_second_uninstall_changes_nothing(tmp_path):
    rc, out = plan(tmp_path, "uninstall.py", None, ["unit qwen27b.service inactive", "unit qwen27b-seed.service inactive"])
    assert rc == 0 and "   nothing (more) to remove on this host" in out
    assert ops(out) == [f"== {HOST}: 0 operation(s) planned, 0 would change the host"]


def test_uninstall_of_a_gateways_backend_says_what_the_gateway_keeps(tmp_path):
    """Issue 48 item 8: uninstalling a backend said nothing of the gateway, which keeps it in its
    backend list: the plan now says so and how to drop it (the real `pyinfra --dry --limit`)."""
    key = tmp_path / "team-a.key"
    key.write_text("team-a-key-0123\n")
    key.chmod(0o600)
    inventory = tmp_path / "inv.py"
    answers = {"DeployedState": DEPLOYED}
    inventory.write_text(converged_inventory(answers) +
        f"qwen27b_gateway = [('@fake/gw', {{'ssh_hostname': '10.0.0.9', 'qwen27b_gateway_key_files': [{str(key)!r}]}})]\n")
    result = run_pyinfra(str(inventory), "uninstall.py", "--dry", "-y", "--limit", HOST,
                         QWEN27B_REPORTS=str(tmp_path / "reports"))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (f"   note   gateway @fake/gw lists {HOST} as backend(s): once the service is gone its watcher takes them "
            "out of the pool") in result.stderr, result.stderr[-3000:]
    assert "deploy the gateway: pyinfra INVENTORY deploy.py -y --limit @fake/gw" in result.stderr
    (tmp_path / "alone").mkdir()
    rc, out = plan(tmp_path / "alone", "uninstall.py", None, DEPLOYED)
    assert rc == 0 and "   note   gateway" not in out  # no gateway in the inventory: no note


# issue 52 item 1: a lab's own unit the first deploy took over (plan/foreignunit.py, roles/_takeover.py)
OURS_OVER_LAB = ["== unit qwen27b.service enabled active",
                 "# Rendered by qwen27b from the plan; edit the inventory or stack file, not this file.",
                 "ExecStart=/opt/qwen27b/current/venv/bin/vllm serve /var/lib/qwen27b/models/current",
                 "== kept", "unit qwen27b.service enabled active", "env 0 /etc/default/qwen27b"]
LAB_ONLY = ["== unit qwen27b.service enabled active", "[Unit]", "ExecStart=/opt/vllm/bin/vllm serve m --port 8000", "== kept"]


def test_rollback_with_no_earlier_release_puts_the_taken_over_unit_back(tmp_path):
    rc, out = plan(tmp_path, "rollback.py", {"current": CURRENT, "previous": None, "kept": [], "missing": []},
                   unit_files=OURS_OVER_LAB)
    assert rc == 0, out[-3000:]
    assert "no earlier release of qwen27b here: put back qwen27b.service" in out
    assert ops(out) == [
        f"== {HOST}: 3 operation(s) planned, 1 would change the host",
        "ok      lock: one deploy at a time on this host",
        "CHANGE  rollback: put back qwen27b.service (taken over by the first deploy), ours stopped",
        "$ for u in qwen27b-health.timer qwen27b-health-http.socket qwen27b.service qwen27b-health.service "
        "qwen27b-ray.service qwen27b-seed.service qwen27b-chat-page.service qwen27b-gateway.service "
        "qwen27b-gateway-pool.service qwen27b-firewall.service; do systemctl disable --now \"$u\" 2>/dev/null || true; done",
        "$ sh /var/lib/qwen27b/takeover/restore.sh", "$ rm -rf /var/lib/qwen27b/takeover",
        "ok      unlock: this deploy is done"]


def test_uninstall_stages_the_taken_over_unit_and_puts_it_back_last(tmp_path):
    rc, out = plan(tmp_path, "uninstall.py", None, DEPLOYED, unit_files=OURS_OVER_LAB)
    assert rc == 0, out[-3000:]
    assert "   put back qwen27b.service: the lab's unit the deploy took over" in out
    commands = [line for line in ops(out) if line.startswith("$")]
    staged = commands.index("$ cp -a /var/lib/qwen27b/takeover /run/qwen27b-takeover")
    removed = commands.index("$ rm -rf /opt/qwen27b")
    restored = commands.index("$ sh /run/qwen27b-takeover/restore.sh")
    assert staged < removed < restored and commands[restored + 1] == "$ rm -rf /run/qwen27b-takeover"
    assert "remove unit files qwen27b.service" in out  # ours goes; the lab's comes back after


def test_uninstall_leaves_a_lab_unit_it_never_took_over(tmp_path):
    rc, out = plan(tmp_path, "uninstall.py", None, DEPLOYED, unit_files=LAB_ONLY)
    assert rc == 0, out[-3000:]
    assert "   keep   /etc/systemd/system/qwen27b.service: the lab's own unit (not rendered by qwen27b)" in out
    assert "remove stop qwen27b-health.timer, qwen27b-health-http.socket:" in out  # not qwen27b.service
    assert "remove unit files qwen27b-health.service," in out and "put back" not in out
    commands = [line for line in ops(out) if line.startswith("$")]
    assert not [c for c in commands if re.search(r"qwen27b\.service(?![\w@-])", c) and "rm" in c]
