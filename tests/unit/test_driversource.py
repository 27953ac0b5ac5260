"""plan/driversource.py (issue 52 item 5): a driver from the graphics-drivers PPA is kept and held, and
the plan says where it comes from and what would move it. The recorded host v100x2-ppa-580's
driver-source.txt is written in the formats of apt-cache policy, grep -Hs over the apt preferences
and apt-config dump; the gate runs on its recorded facts."""

from __future__ import annotations

from qwen27b.plan.driversource import kept_source, parse_driver_source
from tests.support.gate_run import run
from tests.support.paths import TESTS

RECORDED = (TESTS / "fixtures" / "hosts" / "v100x2-ppa-580" / "driver-source.txt").read_text().splitlines()
PPA_VERSION = "580.95.05-0ubuntu0~gpu22.04.1"


def test_the_fact_reads_policy_pins_and_origins():
    found = parse_driver_source(RECORDED)
    driver = found["policy"]["nvidia-driver-580"]
    assert driver["installed"] == PPA_VERSION and found["policy"]["nvidia-driver-535"]["installed"] is None
    assert driver["versions"][0]["priority"] == 1001
    assert driver["versions"][0]["sources"][0].startswith("https://ppa.launchpadcontent.net/graphics-drivers/ppa/")
    assert found["pins"] == [{"file": "/etc/apt/preferences.d/nvidia-ppa", "package": "nvidia-* libnvidia-*",
                              "pin": "release o=LP-PPA-graphics-drivers", "pin_priority": "1001"}]
    assert "LP-PPA-graphics-drivers:${distro_codename}" in found["origins"] and len(found["origins"]) == 5
    assert parse_driver_source([]) is None


def test_the_kept_ppa_driver_is_held_and_its_source_and_movers_are_said():
    d = run("v100x2-ppa-580")
    assert d.driver.action == "keep" and d.driver.hold == ("nvidia-driver-580",)
    reason = d.driver.reason
    assert "comes from the graphics-drivers PPA (ppa:graphics-drivers/ppa" in reason
    assert "Pin-Priority 1001 for nvidia-* libnvidia-* (release o=LP-PPA-graphics-drivers" in reason
    assert 'unattended-upgrades takes its updates ("LP-PPA-graphics-drivers:${distro_codename}")' in reason
    assert "What would move it: a newer build in that PPA installed by unattended-upgrades" in reason
    assert "which the hold below stops" in reason


def test_an_archive_driver_or_an_unread_source_says_nothing_more():
    archive = parse_driver_source(["== policy", "nvidia-driver-580-server:", "  Installed: 1", "  Candidate: 2",
                                   "  Version table:", "     2 500",
                                   "        500 http://archive.ubuntu.com/ubuntu jammy-updates/restricted amd64 Packages",
                                   " *** 1 100", "        100 /var/lib/dpkg/status", "== pins", "== origins"])
    assert kept_source(archive, "nvidia-driver-580-server", "1") is None
    assert kept_source(None, "nvidia-driver-580", PPA_VERSION) is None
    # a PPA build with no pin and no origin: still named, and a newer candidate said
    bare = parse_driver_source(RECORDED[:RECORDED.index("== pins")])
    bare["policy"]["nvidia-driver-580"]["candidate"] = "580.105.08-0ubuntu0~gpu22.04.1"
    said = kept_source(bare, "nvidia-driver-580", PPA_VERSION)
    assert "apt pin" not in said and "unattended-upgrades takes" not in said
    assert "(its candidate now: 580.105.08-0ubuntu0~gpu22.04.1)" in said
    # the converged host's archive -server driver: the row is as before
    assert "PPA" not in run("v100x4-converged").driver.reason


def test_a_genuine_ppa_policy_is_read_as_the_ppa():
    """`apt policy nvidia-driver-550` as its owner pasted it (tests/fixtures/public-v100/README.md): the
    installed ~gpu build's source is the graphics-drivers PPA, the archive's build beside it."""
    said = (TESTS / "fixtures" / "public-v100" / "apt-policy-ppa-550.txt").read_text().splitlines()
    found = parse_driver_source(["== policy", *said, "== pins", "== origins"])
    versions = found["policy"]["nvidia-driver-550"]["versions"]
    assert [v["version"] for v in versions] == ["550.78-0ubuntu0~gpu24.04.1", "550.67-0ubuntu3"]
    text = kept_source(found, "nvidia-driver-550", "550.78-0ubuntu0~gpu24.04.1")
    assert text.startswith("nvidia-driver-550 550.78-0ubuntu0~gpu24.04.1 comes from the graphics-drivers PPA")
    assert kept_source(found, "nvidia-driver-550", "550.67-0ubuntu3") is None  # the archive's build
