"""Addresses from host data (issue 25): every address key is parsed into an `ipaddress` object and
re-printed from it. An IPv6 zone id (`fe80::1%eth0`) is refused in every qwen27b key (systemd's
ListenStream=/IPAddressAllow=, nft and nginx take none) and, in ssh_hostname, must be an interface
name and is never used as the host's lab address. Python's
ipaddress takes anything after the '%' (`fe80::1%eth0;touch${IFS}x` parses), and before this the
raw text reached the unit, the env file, nft rules, nginx upstreams and other hosts' root fan-out
commands.

Hostile values (hypothesis) go through every address key and every place an address lands: the
rendered units (`systemd-analyze verify`), the nft rule file (`nft -c`), the planned commands
(shlex), the gateway's nginx config (`nginx -t`) and the fan-out's fetch and seed commands.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qwen27b.controller.render import render
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.plan import fanout
from qwen27b.plan.gateway import plan_gateways
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.addresses import lab_address
from qwen27b.plan.inventory import validate_inventory
from recordings import recorded_facts
from tests.support.gateway_lab import free_port as P_free_port
from tests.support.gateway_stubs import GW, lab, nginx_binary
from tests.support.gateway_stubs import keys  # noqa: F401 (a fixture)
from tests.support.inprocess import STACK, InProcessPlan, check_units, needs_systemd, planner  # noqa: F401 (planner: a fixture)
from fuzz_budget import examples
from tests.support.gateway_lab import config_test

HOSTILE_ZONES = ["eth0;touch${IFS}x", "$(id)", "a b", "eth0|nc", "'q", '"q', "`id`", "eth0&&id", "x>y",
                 "0123456789abcdef"]  # 16: longer than an interface name
BASES = ["192.168.1.20", "10.10.0.2", "fd00::7", "fe80::1", "2001:db8::1", "::ffff:10.0.0.1", "FD00:0::7"]
ZONE_CHARS = st.sampled_from(list("abcXYZ0189._-") + list(" ;|&$()`'\"\\*?[]~#!{}<>=,@+:"))
ZONES = st.one_of(st.sampled_from(HOSTILE_ZONES + ["eth0", "enp65s0f0", "br-lab.12"]),
                  st.text(alphabet=ZONE_CHARS, min_size=0, max_size=18))


def addresses(zoned: list[str]):
    return st.builds(lambda base, sep, zone: base + sep + zone if sep else base,
                     st.sampled_from(BASES), st.sampled_from(zoned), ZONES)


ADDRESS = addresses(["", "%", "%"])
MOSTLY_PLAIN = addresses(["", "", "", "", "", "%"])  # so that plans get made
NETWORK = st.builds(lambda a, prefix: a + prefix, ADDRESS, st.sampled_from(["", "/24", "/64", "/128", "/x"]))
# what a re-printed address or network may hold: hex digits, dots, colons, the prefix's /
CLEAN = re.compile(r"[0-9a-f.:/]+")
ADDRESS_KEYS = ["qwen27b_bind_address", "qwen27b_node_address"]
NETWORK_KEYS = ["qwen27b_firewall_allow", "qwen27b_metrics_allow"]
HOST = "v100x4-2204-fresh"
# qwen27b_node_address is read for a member of a serving group only
GROUP = {"qwen27b_node_group": "pair", "qwen27b_node_role": "head", "qwen27b_node_interface": "eth0",
         "qwen27b_interconnect_gbps": 10}


def data_for(key: str, value) -> dict:
    return {key: value, **(GROUP if key == "qwen27b_node_address" else {})}


def reprinted(value: str) -> str:
    return str(ipaddress.ip_address(value))


@pytest.mark.parametrize("key", ADDRESS_KEYS + ["ssh_hostname"])
@pytest.mark.parametrize("zone", HOSTILE_ZONES)
def test_a_zone_id_that_is_no_interface_name_is_refused_naming_host_key_and_fix(key, zone):
    with pytest.raises(BadHostData) as caught:
        settings_for("h", data_for(key, f"fe80::1%{zone}"))
    assert caught.value.key == key and "interface name" in caught.value.fix and str(caught.value).startswith("h: ")


@pytest.mark.parametrize("key", ADDRESS_KEYS)
def test_a_zone_id_is_refused_in_the_address_keys(key):
    with pytest.raises(BadHostData) as caught:
        settings_for("h", data_for(key, "fe80::1%eth0"))
    assert caught.value.key == key and "zone id" in caught.value.problem


@pytest.mark.parametrize("key", NETWORK_KEYS)
@pytest.mark.parametrize("network", ["fe80::%eth0/64", "fe80::%eth0;touch${IFS}x/64", "fe80::1%$(id)"])
def test_a_network_with_a_zone_id_is_refused(key, network):
    with pytest.raises(BadHostData) as caught:
        settings_for("h", {key: [network]})
    assert caught.value.key == key and "zone" in caught.value.problem


def test_a_hostile_ssh_hostname_is_refused_and_never_a_lab_address():
    data = {"ssh_hostname": "fe80::1%eth0;id"}
    assert lab_address(data) is None
    with pytest.raises(BadHostData) as caught:
        validate_inventory([("h", data)])
    assert caught.value.key == "ssh_hostname"
    assert lab_address({"ssh_hostname": "fe80::1%eth0"}) is None  # SSH may use it; no unit or rule can
    settings_for("h", {"ssh_hostname": "fe80::1%eth0"})


def test_addresses_are_reprinted_from_their_parsed_form():
    s = settings_for("h", {"qwen27b_bind_address": "FD00:0::7", "qwen27b_node_address": "FE80::0:1",
                           "qwen27b_firewall_allow": ["FD00::/64", "10.0.0.7"], "qwen27b_metrics_allow": ["10.0.0.5/32"], **GROUP})
    assert (s.bind_address, s.node_address) == ("fd00::7", "fe80::1")
    assert s.firewall_allow == ["fd00::/64", "10.0.0.7/32"] and s.metrics_allow == ["10.0.0.5/32"]


@settings(max_examples=examples(300), deadline=None)
@given(key=st.sampled_from(ADDRESS_KEYS + NETWORK_KEYS + ["ssh_hostname"]), value=st.one_of(ADDRESS, NETWORK))
def test_every_address_key_refuses_or_reprints(key, value):
    data = data_for(key, [value] if key in NETWORK_KEYS else value)
    try:
        s = settings_for("h", data)
    except BadHostData as error:
        assert error.host == "h" and error.key == key and error.fix
        event("refused")
        return
    event("accepted")
    got = getattr(s, key[len("qwen27b_"):])[0] if key in NETWORK_KEYS else (
        lab_address(data) if key == "ssh_hostname" else getattr(s, key[len("qwen27b_"):]))
    if key == "ssh_hostname" and got is None:
        return  # not an IP (a host name, which pyinfra resolves) or scoped: never a lab address
    assert CLEAN.fullmatch(got), got
    if key in NETWORK_KEYS:
        assert ipaddress.ip_network(got, strict=False) == ipaddress.ip_network(value, strict=False)
    else:
        assert got == reprinted(value)


def _hostile_chars(text: str) -> set[str]:
    return set(text) & set(" ;|&$()`'\"\\*?[]~#!{}<>")


@needs_systemd
@pytest.mark.skipif(shutil.which("nft") is None, reason="nft not installed")
@settings(max_examples=int(os.environ.get("QWEN27B_FUZZ_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(bind=MOSTLY_PLAIN, allow=st.builds(lambda a, p: a + p, MOSTLY_PLAIN, st.sampled_from(["", "/24", "/64", "/x"])),
       scrape=st.builds(lambda a, p: a + p, MOSTLY_PLAIN, st.just("/24")))
def test_hostile_addresses_never_reach_a_unit_a_rule_or_a_command(planner, bind, allow, scrape):
    data = {"qwen27b_bind_address": bind, "qwen27b_firewall_allow": [allow], "qwen27b_metrics_allow": [scrape]}
    try:
        decision = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, data))
    except (BadHostData, RefusedHost):
        event("refused")
        return
    event("planned")
    address = decision.settings.bind_address
    assert address == reprinted(bind) and CLEAN.fullmatch(address)
    with tempfile.TemporaryDirectory() as scratch:
        check_units(decision, Path(scratch))  # systemd-analyze verify of every unit, the env file's lines
        context = firewall_contexts(decision)["qwen27b-firewall.nft.j2"]
        rules = Path(scratch, "firewall.nft")
        rules.write_text(render("qwen27b-firewall.nft.j2", context))
        check = subprocess.run(["nft", "-c", "-f", str(rules)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr + rules.read_text()
    for op, commands in planner(HOST, data, decision):
        for command in commands:
            if command.startswith(("python: ", "upload")):
                continue
            argv = shlex.split(command)
            if address in command:
                assert any(address in word for word in argv), (op, command)


@settings(max_examples=examples(200), deadline=None)
@given(address=ADDRESS)
def test_fanout_commands_hold_an_accepted_seed_address_in_one_word(address):
    try:
        address = settings_for("h", {"qwen27b_bind_address": address}).bind_address
    except BadHostData:
        return
    copy = fanout.Copy("b", 1, "a", address, "wave 1")
    command = fanout.fetch_command("/opt/venv/bin/python -m qwen27b_onhost.fetch /dst", copy, "https://m.lab/x",
                                   "model@rev", token_file="/run/t")
    argv = shlex.split(command)
    url = argv[argv.index("--base") + 1]
    assert url.startswith("http://") and address in url and argv.count("--base") == 2
    start = fanout.seed_start_commands(["python", "-m", "mirror"], "/var/lib/m/rev", address, ["10.0.0.2"], "/run/t",
                                       "qwen27b", 600, "/var/lib/m")
    run = shlex.split(start[1])
    assert run[run.index("--host") + 1] == address
    assert f"--property=IPAddressAllow={address} 10.0.0.2" in run


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(backend=ADDRESS, gateway=ADDRESS)
def test_gateway_addresses_are_refused_or_plain_and_pass_nginx_t(tmp_path_factory, keys, backend, gateway):
    """nginx takes no zone id and the wildcard would make it send the backends' key to its own host."""
    scrapers = {"qwen27b_metrics_allow": [f"{GW}/32", "::/0", "0.0.0.0/0"]}  # wherever the gateway is
    hosts, groups = lab(keys, gateway={"qwen27b_gateway_bind_address": gateway},
                        b1={"qwen27b_bind_address": backend, **scrapers}, b2=scrapers)
    try:
        plan = plan_gateways(hosts, groups, validate_inventory(hosts, groups))["gw"]
    except BadHostData as error:
        assert error.host in ("gw", "gpu-1") and error.key in ("qwen27b_gateway_bind_address", "qwen27b_bind_address")
        event("refused")
        return
    event("planned")
    for address in [plan.address] + [b.address for b in plan.backends]:
        ip = ipaddress.ip_address(address)
        assert CLEAN.fullmatch(address) and "%" not in address and not ip.is_unspecified and not ip.is_loopback
    local = dataclasses.replace(plan, address="127.0.0.1", port=P_free_port())  # -t binds the listen address
    result = config_test(local, tmp_path_factory.mktemp("gw"), nginx_binary(), ["gpu-1", "gpu-2"])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("where", [{"b1": {"qwen27b_bind_address": "0.0.0.0"}}, {"b1": {"qwen27b_bind_address": "::"}},
                                   {"b1": {"qwen27b_bind_address": "fe80::1%eth0"}},
                                   {"gateway": {"qwen27b_gateway_bind_address": "fe80::9%eth0"}}])
def test_a_wildcard_or_zoned_gateway_address_is_refused(keys, where):
    hosts, groups = lab(keys, **where)
    with pytest.raises(BadHostData) as caught:
        plan_gateways(hosts, groups, validate_inventory(hosts, groups))
    assert caught.value.key in ("qwen27b_bind_address", "qwen27b_gateway_bind_address")


def test_an_ipv6_bind_address_is_bracketed_in_every_url():
    """http://fd00::7:8000 is no URL: the readiness check, the copies' URL and verify use [fd00::7]."""
    from qwen27b.controller.render import render_all
    from qwen27b.plan.hostdata import http_base

    decision = decide(HOST, recorded_facts(HOST), STACK, settings_for(HOST, {"qwen27b_bind_address": "FD00::7"}))
    unit = render_all(decision)["qwen27b.service.j2"]
    assert "qwen27b_onhost.warmup --url 'http://[fd00::7]:8000' " in unit  # the start-up warm-up's URL
    assert http_base("10.0.0.1", 8000) == "http://10.0.0.1:8000"


@pytest.mark.parametrize("url, loopback", [
    ("http://127.0.0.1:8000", True), ("http://127.1.2.3:8000", True), ("http://[::1]:8000", True),
    ("http://[fd00::7]:8000", False), ("http://10.0.0.7:8000", False), ("", False), ("http://lab-host:8000", False),
])
def test_rollback_skips_verify_only_for_loopback_urls_ipv6_included(url, loopback):
    """Issue 24 (IPv6-only labs): the rollback's loopback test read 'http://127.' only, so a service on
    [::1] was verified from the controller, which cannot reach it."""
    from qwen27b.plan.lifecycle import loopback_url

    assert loopback_url(url) is loopback
