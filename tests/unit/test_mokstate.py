"""plan/mokstate.py (issue 52 item 8): on a Secure-Boot host whose MOK key waits for enrolment, the
reboot is the key's (shim's MOK Manager, at the console), not the driver's. The `mokutil --list-new`
lines are mokutil's format (lcp/mokutil src/mokutil.c), as in the recorded host v100x1-secureboot-mok."""

from __future__ import annotations

import dataclasses

import pytest

from qwen27b.controller import facts as F
from qwen27b.plan.hostfacts_parse import FactParseError
from qwen27b.plan.mokstate import enrolment_pending, parse_mok_requests
from tests.support.gate_run import run
from tests.support.paths import TESTS

RECORDED = (TESTS / "fixtures" / "hosts" / "v100x1-secureboot-mok" / "mok-list-new.txt").read_text().splitlines()
KEY = {"qwen27b_mok_key_path": "/var/lib/shim-signed/mok/MOK.priv"}


def test_list_new_is_read():
    assert parse_mok_requests(RECORDED) == [{"fingerprint": "5c:1f:9e:2a:47:b3:0d:e8:61:c4:7a:92:3b:f0:15:d6:88:2e:a4:c7",
                                             "subject": "CN = qwen27b DKMS module signing"}]
    assert F.MokRequests().process(RECORDED) == parse_mok_requests(RECORDED)
    assert parse_mok_requests(["MokNew is empty"]) == []
    assert parse_mok_requests([]) is None
    assert parse_mok_requests(["EFI variables are not supported on this system"]) is None
    two = RECORDED + ["[key 2]", "SHA1 Fingerprint: AA:BB", "Certificate:", "        Subject: CN = lab key"]
    assert [k["subject"] for k in parse_mok_requests(two)] == ["CN = qwen27b DKMS module signing", "CN = lab key"]
    with pytest.raises(FactParseError):
        parse_mok_requests(["something else"])


def test_the_driver_reboot_names_the_key_enrolment_and_the_deploy_does_not_reboot():
    d = run("v100x1-secureboot-mok", KEY)
    assert d.driver.action == "install" and d.driver.console_reboot
    assert "the reboot is for the key enrolment, not the driver" in d.driver.reason
    assert "CN = qwen27b DKMS module signing" in d.driver.reason and "then reboot once" not in d.driver.reason
    assert d.driver.console_reboot.startswith("REBOOT AT THE CONSOLE for the MOK key enrolment")
    assert "Enroll MOK" in d.driver.console_reboot
    # the nouveau warning's reboot is that console reboot too, not one the deploy does
    nouveau = [w for w in d.warnings if w.startswith("nouveau is loaded")]
    assert nouveau and "the console reboot the MOK key enrolment needs" in nouveau[0] and "a reboot follows" not in nouveau[0]


def test_an_enrolled_key_leaves_the_reboot_to_the_driver():
    """MokNew empty (the key enrolled earlier, or none queued): the reboot loads the new driver, as before."""
    d = run("v100x1-secureboot-mok", KEY, mok_requests=parse_mok_requests(["MokNew is empty"]))
    assert d.driver.console_reboot is None and d.driver.reason.endswith("then reboot once [r580-volta, open-gsp]")


def test_a_pending_key_on_a_host_without_secure_boot_is_no_cause():
    facts = run("v100x1-secureboot-mok", KEY).facts
    assert enrolment_pending(facts).startswith("1 MOK key(s) waiting for enrolment")
    assert enrolment_pending(dataclasses.replace(facts, secure_boot="disabled")) is None
