"""A whole `pyinfra INVENTORY deploy.py --dry` over a lab with a gateway: recorded @fake hosts
(tests/fixtures/hosts: a real 22.04 box without GPU stands for the gateway, the real converged 4x
V100 host for its backend), so the run's own code paths for a gateway host are planned end to
end without a GPU. Its real run is tests/e2e/test_scaleout_gateway.py.

Also: a run whose deploy file raises on one host never calls the others "ok" or "planned" (pyinfra
stops the whole run; they are "not run")."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tests.support.paths import ROOT

# the shim: pyinfra's CLI with one function of the deploy's made to raise for the gateway host only
RAISING = """
import sys
import roles._run as p
real = p.format_operation_lines
def broken(host, *a, **k):
    if host == "@fake/gw":
        raise RuntimeError("a bug while printing the gateway's plan")
    return real(host, *a, **k)
p.format_operation_lines = broken
sys.argv[0] = "pyinfra"
from pyinfra_cli.main import main
main()
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    work = tmp_path_factory.mktemp("gwlab")
    key = work / "team.key"
    key.write_text("q27-team-" + os.urandom(8).hex() + "\n")
    key.chmod(0o600)
    inventory = work / "lab.py"
    inventory.write_text(
        "from inventory.recorded import _fake\n"
        f"qwen27b_gateway = [_fake('gw', 'nogpu-2204', qwen27b_gateway_key_files=[{str(key)!r}], "
        "ssh_hostname='192.168.10.9')]\n"
        "backends = [_fake('v100x4-converged', qwen27b_bind_address='192.168.10.21', ssh_hostname='192.168.10.21', "
        "qwen27b_metrics_allow=['192.168.10.9/32'])]\n")
    return {"inventory": inventory, "work": work, "key": key}


def run(lab, argv_prefix: list[str], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_CACHE=str(lab["work"] / "cache"), QWEN27B_REPORTS=str(lab["work"] / "r"))
    return subprocess.run([sys.executable, *argv_prefix, str(lab["inventory"]), "deploy.py", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)


def test_a_lab_with_a_gateway_plans_both_hosts(lab):
    result = run(lab, ["-m", "pyinfra"], "--dry", "-y")
    out = result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    gateway = re.search(r"^== @fake/gw: (\d+) operation\(s\) planned, (\d+) would change the host$", out, re.M)
    assert gateway and int(gateway.group(2)) >= 1, out[-4000:]  # a bare box: nginx, the units...
    # a 22.04 gateway: its archive has no nginx Lua module, so no token counts, and the plan says so
    assert "CHANGE  nginx and python3 (the gateway)" in out and "libnginx-mod-http-lua" not in out.split("== @fake/gw: ")[2]
    assert "usage per key: tokens NOT counted on ubuntu 22.04: its archive has no libnginx-mod-http-lua" in out
    assert re.search(r"^== @fake/v100x4-converged: \d+ operation\(s\) planned", out, re.M)
    assert re.search(r"^--> qwen27b run summary: 2 of 2 host\(s\) ok$", out, re.M), out[-2000:]
    assert re.search(r"^@fake/gw\s+planned\s*$", out, re.M) and re.search(r"^@fake/v100x4-converged\s+planned\s*$",
                                                                          out, re.M)
    assert lab["key"].read_text().strip() not in out + result.stdout


def test_a_deploy_file_that_raises_on_one_host_leaves_no_host_ok(lab):
    result = run(lab, ["-c", RAISING], "--dry", "-y")
    out = result.stderr
    assert result.returncode != 0
    assert "a bug while printing the gateway's plan" in out
    assert re.search(r"^--> qwen27b run summary: 0 of 2 host\(s\) ok$", out, re.M), out[-3000:]
    assert re.search(r"^@fake/gw\s+failed\s+while planning: the deploy file raised RuntimeError: a bug while printing",
                     out, re.M), out[-2000:]
    assert re.search(r"^@fake/v100x4-converged\s+not run\s+the deploy file raised on @fake/gw: no operation ran",
                     out, re.M), out[-2000:]


def test_a_gateway_with_a_lab_ca_plans_its_certificate_and_never_prints_its_key(lab):
    """Issue 28's TLS, planned: the lab CA is made on the controller (0600 keys), the gateway's
    certificate and key are planned (the key as a secret), and with --diff the certificate may show
    but no line of either private key does. The same run again makes no new CA or certificate."""
    lab_ca = lab["work"] / "lab-ca"
    tls = dict(lab, inventory=lab["work"] / "lab-tls.py")
    tls["inventory"].write_text(lab["inventory"].read_text().replace(  # a 20.04 gateway: with the Lua module
        "ssh_hostname='192.168.10.9')", f"ssh_hostname='192.168.10.9', qwen27b_gateway_tls_lab_ca={str(lab_ca)!r})")
        .replace("'nogpu-2204'", "'v100x1-2004'"))
    result = run(tls, ["-m", "pyinfra"], "--dry", "--diff", "-y")
    out = result.stderr + result.stdout
    assert result.returncode == 0, out[-4000:]
    assert "TLS: a certificate for its address signed by the lab CA in" in out, out[-4000:]
    assert "CHANGE  TLS certificate /etc/qwen27b-gateway/tls.crt" in out and "CHANGE  TLS key (0600)" in out
    assert "CHANGE  nginx, its Lua module and python3 (the gateway)" in out and "install --no-install-recommends" in out
    assert ("usage per key: tokens counted from the responses (nginx's Lua module, libnginx-mod-http-lua from the "
            "archive's universe component)") in out
    assert "CHANGE  usage per key (nginx's Lua module) /opt/qwen27b-gateway/lib/qwen27b_gateway_usage.lua" in out
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in lab_ca.glob("*.key")} == {"ca.key": "0o600", "_fake_gw.key": "0o600"}
    public = "".join(path.read_text() for path in lab_ca.rglob("*.crt"))  # an EC key's last line is its public point
    private = [line for path in lab_ca.rglob("*.key") for line in path.read_text().splitlines()
               if line and not line.startswith("-----") and line not in public]
    assert private and not [line for line in private if line in out]
    made = {p: p.read_bytes() for p in lab_ca.rglob("*") if p.is_file()}
    again = run(tls, ["-m", "pyinfra"], "--dry", "-y")
    assert again.returncode == 0 and {p: p.read_bytes() for p in lab_ca.rglob("*") if p.is_file()} == made


def test_a_token_budget_on_a_gateway_without_the_lua_module_is_refused_not_ignored(lab):
    """tokens_per_day needs the token counts of nginx's Lua module, which Ubuntu 22.04's archive lacks:
    the 22.04 gateway is refused naming the key and the fix, rather than deployed with a budget that
    nothing would enforce."""
    budget = dict(lab, inventory=lab["work"] / "lab-budget.py")
    budget["inventory"].write_text(lab["inventory"].read_text().replace(
        f"qwen27b_gateway_key_files=[{str(lab['key'])!r}]",
        f"qwen27b_gateway_key_files=[{{'file': {str(lab['key'])!r}, 'name': 'team', 'tokens_per_day': 100000}}]"))
    result = run(budget, ["-m", "pyinfra"], "--dry", "-y")
    out = result.stderr + result.stdout
    assert result.returncode != 0, out[-3000:]
    assert "tokens_per_day is set for team, but this host's OS archive has no nginx Lua module" in out, out[-3000:]
    assert re.search(r"^@fake/gw\s+refused", out, re.M), out[-2000:]


def test_a_gateway_with_the_chat_page_plans_it_and_says_where_its_python_and_wheels_come_from(lab):
    """Issue 29, planned on the recorded 22.04 gateway (no python3.11 there): the page's plan lines, the
    note that uv would download Python 3.11 from GitHub (what an offline gateway needs instead), the
    wheelhouse this controller lacks named with the command that builds it, the page's secrets made once
    on the controller and never printed, and the page's unit and environment planned."""
    page = dict(lab, inventory=lab["work"] / "lab-page.py")
    page["inventory"].write_text(lab["inventory"].read_text().replace(
        "ssh_hostname='192.168.10.9')", "ssh_hostname='192.168.10.9', qwen27b_chat_page=True)"))
    result = run(page, ["-m", "pyinfra"], "--dry", "--diff", "-y")
    out = result.stderr + result.stdout
    assert result.returncode == 0, out[-4000:]
    for line in ("chat page: Open WebUI 0.12.4 at http://192.168.10.9:8080/",
                 "chat page: no /usr/bin/python3.11 on this host (Ubuntu 20.04/22.04 have none): uv downloads",
                 "build it first: python3 -m qwen27b.tools.chat_page wheelhouse",
                 "CHANGE  chat page environment (0600: its gateway key, the admin's first password)",
                 "CHANGE  render /etc/systemd/system/qwen27b-chat-page.service"):
        assert line in out, (line, out[-4000:])
    secrets = sorted((lab["work"] / ".qwen27b" / "chat-page" / "_fake_gw").iterdir())
    assert [p.name for p in secrets] == ["admin.password", "page.key", "session.secret"]
    assert not [p.name for p in secrets if p.read_text().strip() in out]


def test_a_gateway_with_qwen27b_firewall_allow_plans_the_serving_hosts_firewall(lab):
    """Issue 56 item 3: the gateway host gets the serving hosts' nftables rule (the same shared step,
    roles/_firewall.py: `nft -c`, then the one-transaction swap), its API port only from the listed
    networks; without the key the plan says every network reaches it."""
    walled = dict(lab, inventory=lab["work"] / "lab-fw.py")
    walled["inventory"].write_text(lab["inventory"].read_text().replace(
        "ssh_hostname='192.168.10.9')", "ssh_hostname='192.168.10.9', qwen27b_firewall_allow=['192.168.10.0/24'])"))
    result = run(walled, ["-m", "pyinfra"], "--dry", "-y", "-v")
    out = result.stderr + result.stdout
    assert result.returncode == 0, out[-4000:]
    mine = re.search(r"^== @fake/gw: \d+ operation\(s\) planned.*?(?=^== |\Z)", out, re.M | re.S).group(0)
    assert "firewall: port 8000/tcp only from 192.168.10.0/24 and the host itself, qwen27b-gateway.service (the " \
           "gateway's API)" in out, out[-4000:]
    assert "CHANGE  render the firewall rule" in mine and "CHANGE  load the firewall rule" in mine
    assert "$ nft -c -f /etc/qwen27b-gateway/firewall.nft" in mine
    assert "firewall: none (qwen27b_firewall_allow unset)" not in out
    plain = run(lab, ["-m", "pyinfra"], "--dry", "-y")
    assert "firewall: none (qwen27b_firewall_allow unset): the API answer every network that reaches this host" in plain.stderr
