"""`qwen27b uninstall` on a real systemd test host over SSH (issue 12): listed (--dry), removed, then
nothing left to remove, and a re-deploy plans reusing the weights it kept.

The tier's one lab, last (tests/e2e/conftest.py LAB_ORDER, issue 31): host 2, the lifecycle's B, left
serving by the gateway module as one of its backends (its health check every 10 s, the gateway
allowed to its /metrics), so the uninstall also removes what a day-two host gathered. Run alone, the
module deploys its host fresh first. The real `qwen27b uninstall` CLI and a real `pyinfra ... deploy.py
--dry`, the CPU smoke profile (test_deploy.py's fixtures).
"""

from __future__ import annotations

import re
import shlex
import time

import pytest

from tests.support.e2e_deploy import GOOD, assert_key_not_in_runs, PORT, deploy, make_lab, serving_record

pytestmark = pytest.mark.e2e
MODELS = "/var/lib/qwen27b/models"
CLI = "qwen27b.tools.cli"
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def fleet(testhosts, mirror, tmp_path_factory):
    """The lab's host 2 (B) serving, or its last host when the lab is smaller (the module alone); an
    inventory of it with the lifecycle's data."""
    started = time.monotonic()
    b = testhosts[min(2, len(testhosts) - 1)]
    lab = make_lab(b, testhosts.inventory, mirror, tmp_path_factory.mktemp("uninstall"),
                   {"qwen27b_weights_fanout": "tree"})
    try:
        serving_record(lab, TIMES)
        lab["b"] = b
        lab["weights"] = sorted(set(b.run(f"ls {MODELS}").stdout.split()) - {"current"})  # the link goes too
        yield lab
    finally:
        TIMES["module"] = time.monotonic() - started
        print("\n" + "\n".join(f"  {what:44} {secs:6.1f} s" for what, secs in TIMES.items()))


def timed(label: str, lab, argv, module="pyinfra"):
    started = time.monotonic()
    rc, out = deploy(lab, argv=argv, module=module)
    TIMES[label] = time.monotonic() - started
    return rc, out


def test_uninstall_lists_removes_then_changes_nothing_and_a_redeploy_plans(fleet):
    b = fleet["b"]
    inventory = str(fleet["inventory"])
    rc, out = timed("qwen27b uninstall --dry", fleet, argv=["uninstall", inventory, "--limit", b.name, "--dry"], module=CLI)
    assert rc == 0, out[-3000:]
    plan = out[out.index(f"== {b.name}: uninstall plan"):]
    for removal in ("remove stop qwen27b-health.timer, qwen27b-health-http.socket, qwen27b.service",
                    "remove unit files qwen27b.service", "remove /opt/qwen27b:", "remove /etc/qwen27b:",
                    f"remove /var/lib/qwen27b except {MODELS}:", "remove service user qwen27b",
                    f"keep   {MODELS}: the model weights"):
        assert removal in plan, plan[:3000]
    assert b.run("systemctl is-active qwen27b.service").stdout.strip() == "active"  # --dry changed nothing
    rc, out = timed("qwen27b uninstall B", fleet, argv=["uninstall", inventory, "--limit", b.name], module=CLI)
    assert rc == 0, out[-4000:]
    assert b.run("systemctl list-unit-files 'qwen27b*' --no-legend", check=False).stdout.strip() == ""
    assert b.run("ls /etc/systemd/system | grep -c qwen27b", check=False).stdout.strip() == "0"
    assert b.run("test -e /opt/qwen27b || test -e /etc/qwen27b || getent passwd qwen27b || getent group qwen27b",
                 check=False).returncode != 0
    assert sorted(b.run(f"ls {MODELS}").stdout.split()) == fleet["weights"]  # the weights stay, by default
    assert b.run(f"stat -c %U:%G /var/lib/qwen27b {MODELS}").stdout.split() == ["root:root", "root:root"]  # no dangling uid
    assert b.run(f"ss -Hltn '( sport = :{PORT} or sport = :9120 )'").stdout.strip() == ""
    rc, out = timed("qwen27b uninstall B again (nothing left)", fleet, argv=["uninstall", inventory, "--limit", b.name],
                    module=CLI)
    assert rc == 0 and "nothing (more) to remove on this host" in out, out[-3000:]
    assert re.search(rf"== {re.escape(b.name)}: 0 operation\(s\) planned, 0 would change the host", out), out[-3000:]
    assert re.search(rf"^{re.escape(b.name)} +ok +nothing to do$", out, re.M), out[-1500:]  # not "planned" (issue 32)
    # nothing of the deploy is left: not the lock's directory, nor apt's proxy setting and its login
    assert b.run("ls -d /run/qwen27b /etc/apt/apt.conf.d/90qwen27b-proxy /etc/apt/auth.conf.d/90qwen27b-proxy.conf",
                 check=False).stdout.strip() == ""
    rc, out = timed("uninstall --weights --dry", fleet, argv=["uninstall", inventory, "--limit", b.name, "--weights", "--dry"],
                    module=CLI)
    assert rc == 0 and "remove /var/lib/qwen27b with the model weights" in out, out[-3000:]
    rc, out = timed("re-deploy B --dry after the uninstall", fleet,
                    argv=[inventory, "deploy.py", "--dry", "-y", "--limit", b.name])
    assert rc == 0, out[-4000:]
    assert "service user qwen27b (system, no login)" in out and "release venv" in out
    assert f"weights: {GOOD} verified on the host" in out  # the kept weights are used again, not fetched


LAB_UNIT = """[Unit]
Description=the lab's own server on qwen27b's unit name (not rendered by qwen27b)

[Service]
EnvironmentFile=-/etc/default/qwen27b-lab
ExecStart=/usr/bin/python3 -m http.server 8000 --bind 0.0.0.0

[Install]
WantedBy=multi-user.target
"""


def test_a_lab_unit_on_our_name_is_refused_kept_then_taken_over_and_put_back_by_rollback(fleet):
    """Issue 52 item 1 on B after its uninstall (the weights kept): the lab's own qwen27b.service on the
    port refuses the deploy and stays untouched; with qwen27b_take_over_unit the deploy keeps it and serves;
    `qwen27b rollback` (no earlier release of ours) puts it back, enabled and serving, with its env file."""
    b, inventory = fleet["b"], str(fleet["inventory"])
    unit = "/etc/systemd/system/qwen27b.service"
    b.run(f"printf %s {shlex.quote(LAB_UNIT)} > {unit} && echo LAB=1 > /etc/default/qwen27b-lab && "
          "systemctl daemon-reload && systemctl enable --now qwen27b.service")
    digest = b.run(f"sha256sum {unit} /etc/default/qwen27b-lab").stdout
    try:
        rc, out = timed("deploy B over the lab's unit (refused)", fleet, argv=[inventory, "deploy.py", "-y", "--limit", b.name])
        assert rc != 0 and "qwen27b.service (enabled, active; ExecStart=/usr/bin/python3 -m http.server 8000" in out, out[-3000:]
        assert "is not a unit qwen27b rendered" in out and "qwen27b_take_over_unit: true" in out, out[-3000:]
        assert b.run(f"sha256sum {unit} /etc/default/qwen27b-lab").stdout == digest  # untouched
        assert b.run("systemctl is-active qwen27b.service").stdout.strip() == "active"
        t0 = time.monotonic()
        rc, out = deploy(fleet, extra={"qwen27b_take_over_unit": True}, argv=[inventory, "deploy.py", "-y", "--limit", b.name])
        TIMES["deploy B with qwen27b_take_over_unit"] = time.monotonic() - t0
        assert rc == 0, out[-4000:]
        assert b.run(f"head -1 {unit}").stdout.startswith("# Rendered by qwen27b")
        assert b.run("stat -c %a:%U /var/lib/qwen27b/takeover").stdout.strip() == "700:root"
        assert b.run("sha256sum /var/lib/qwen27b/takeover/units/qwen27b.service").stdout.split()[0] == digest.split()[0]
        rc, out = timed("qwen27b rollback B (the lab's unit back)", fleet, argv=["rollback", inventory, "--limit", b.name],
                        module=CLI)
        assert rc == 0 and "put back qwen27b.service" in out, out[-3000:]
        assert b.run(f"sha256sum {unit} /etc/default/qwen27b-lab").stdout == digest
        assert [b.run(f"systemctl {what} qwen27b.service", check=False).stdout.strip()
                for what in ("is-enabled", "is-active")] == ["enabled", "active"]
        assert b.run("systemctl is-active qwen27b-health.timer", check=False).stdout.strip() != "active"
        assert b.run("test -e /var/lib/qwen27b/takeover", check=False).returncode != 0
    finally:
        b.run(f"systemctl disable --now qwen27b.service; rm -f {unit} /etc/default/qwen27b-lab; systemctl daemon-reload",
              check=False)


def test_api_key_never_leaked_in_these_runs(fleet):
    """Every log and report of this module: the key never (the lifecycle module's check, on this one's runs)."""
    assert_key_not_in_runs(fleet)
