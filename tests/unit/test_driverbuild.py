"""A failed driver build and a newer kernel not booted (issue 24): the parsers on genuine and
recorded outputs, the gate's decisions on the recorded hosts and their neighbours."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qwen27b.plan import driverbuild as D
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts
from tests.support.paths import TESTS

PUBLIC = TESTS / "fixtures" / "public-v100"


def public(name: str) -> list[str]:
    return (PUBLIC / name).read_text(encoding="utf-8").splitlines()


def run(host: str, **facts):
    return decide(host, recorded_facts(host, **facts), load_stack(), Settings())


def test_dkms_status_of_a_genuine_machine():
    build = D.parse_driver_build(["== dpkg", "== dkms", *public("dkms-status-nvidia-added-390.157.txt")])
    # only the driver's line is kept; 'added' (never built) and no kernel, as its owner saw it
    assert build["dkms"] == [{"module": "nvidia", "version": "390.157", "kernel": None, "status": "added"}]
    old = D.parse_driver_build(["== dkms", "nvidia, 470.74, 5.4.0-89-generic, x86_64: installed"])
    assert old["dkms"] == [{"module": "nvidia", "version": "470.74", "kernel": "5.4.0-89-generic", "status": "installed"}]
    assert D.parse_driver_build([]) is None


def test_a_genuine_make_log_names_the_compiler_the_kernel_was_built_with():
    log = public("dkms-make-log-gcc-mismatch-535.98.txt") + public("gcc-unrecognized-option-line.txt")
    cause, fix = D._log_cause(log, "6.4.6-76060406-generic", 535)
    assert "compiler does not match" in cause and "-ftrivial-auto-var-init=zero" in cause
    assert fix.startswith("`sudo apt-get install gcc-12`") and "dpkg --configure -a" in fix
    # the warning alone (the genuine head, no error line) is no verdict on the compiler
    cause, _ = D._log_cause(public("dkms-make-log-gcc-mismatch-535.98.txt"), "6.4.6", 535)
    assert "compiler" not in cause and "name no error" in cause


@pytest.mark.parametrize("line, cause", [
    ("/var/lib/dkms/nvidia/530.41.03/build/nvidia-drm/nvidia-drm-drv.c:1439:18: error: 'struct drm_driver' has no "
     "member named 'dumb_destroy'", "newer than the branch supports"),
    ("Error! Your kernel headers for kernel 6.8.0-45-generic cannot be found at /lib/modules/6.8.0-45-generic/build",
     "headers are missing"),
    ("/bin/sh: 1: gcc-12: not found", "compiler does not match"),
    ("nvidia/nv.c:42:10: fatal error: something.h: No such file or directory", "last error"),
])
def test_each_cause_and_its_fix(line, cause):
    got, fix = D._log_cause(["make[1]: Entering directory '/usr/src/linux-headers-6.8.0-45-generic'", line], "6.8.0-45-generic", 580)
    assert cause in got and fix


def test_recorded_failed_build_is_refused_naming_compiler_and_fix():
    with pytest.raises(RefusedHost) as refused:
        run("v100x4-dkms-failed")
    text = str(refused.value)
    assert "R580 driver build failed" in text and "-ftrivial-auto-var-init=zero" in text
    assert "nvidia-dkms-580-server 580.95.05-0ubuntu0.22.04.1 (half-configured)" in text
    assert "Fix: `sudo apt-get install gcc-12`" in text and "dpkg --configure -a" in text


def test_neighbours_of_the_failed_build():
    facts = recorded_facts("v100x4-dkms-failed")
    # the repair done (packages configured, dkms installed for the running kernel): no refusal from it
    fixed = {"half": [], "dkms": [{"module": "nvidia-srv", "version": "580.95.05", "kernel": "6.8.0-45-generic",
                                   "status": "installed"}], "log": None}
    assert D.failed_build(fixed, facts.kernel, 580) is None
    # a failed build for another kernel than the running one is not this boot's problem
    other = {**fixed, "dkms": [{**fixed["dkms"][0], "kernel": "6.5.0-1-generic", "status": "added"}]}
    assert D.failed_build(other, facts.kernel, 580) is None
    # another branch left half-configured: purged by name first
    old = {"half": [{"package": "nvidia-dkms-470", "version": "470.256.02-0ubuntu0.22.04.1", "state": "half-configured"}],
           "dkms": [], "log": None}
    failure = D.failed_build(old, facts.kernel, 580)
    assert "an earlier driver install failed" in failure.cause and "apt-get purge nvidia-dkms-470" in failure.fix


def test_parse_installed_kernels_and_grub_default():
    kernels = D.parse_installed_kernels(["ii  linux-image-5.15.0-125-generic 5.15.0-125.135",
                                         "ii  linux-headers-5.15.0-125-generic 5.15.0-125.135",
                                         "rc  linux-image-5.15.0-60-generic 5.15.0-60.66",
                                         'GRUB_DEFAULT="saved"'])
    assert kernels == {"images": ["5.15.0-125-generic"], "headers": ["5.15.0-125-generic"], "grub_default": "saved"}
    assert D.kernel_key("5.15.0-125-generic") > D.kernel_key("5.15.0-60-generic")
    assert D.kernel_key("6.8.0-45-generic") > D.kernel_key("5.15.0-125-generic")


def test_recorded_newer_kernel_gets_its_headers_and_the_plan_says_it_boots():
    d = run("v100x4-newer-kernel")
    assert d.driver.header_packages == ("linux-headers-5.15.0-125-generic", "linux-headers-5.15.0-130-generic")
    assert "the reboot boots 5.15.0-130-generic" in d.driver.reason


def test_neighbours_of_the_newer_kernel():
    base = recorded_facts("v100x4-newer-kernel").kernels
    # its headers already there: nothing more to install, the plan still says which kernel boots
    d = run("v100x4-newer-kernel", kernels={**base, "headers": ["5.15.0-130-generic"]})
    assert d.driver.boot_headers == () and "its headers are installed" in d.driver.reason
    # GRUB_DEFAULT=saved: any newer kernel may boot, so headers for each of them
    d = run("v100x4-newer-kernel", kernels={**base, "grub_default": "saved",
                                            "images": base["images"] + ["5.15.0-127-generic"]})
    assert d.driver.boot_headers == ("linux-headers-5.15.0-127-generic", "linux-headers-5.15.0-130-generic")
    assert "GRUB_DEFAULT=saved" in d.driver.reason
    # only the running kernel: as before
    assert run("v100x4-newer-kernel", kernels={**base, "images": ["5.15.0-125-generic"]}).driver.boot_headers == ()


def test_a_kept_driver_warns_that_the_next_reboot_has_no_module():
    facts = recorded_facts("v100x4-converged")
    newer = {"images": [facts.kernel, "5.15.0-130-generic"], "headers": [facts.kernel], "grub_default": "0"}
    d = decide("v100x4-converged", replace(facts, kernels=newer), load_stack(), Settings())
    assert d.driver.action == "keep" and d.driver.boot_headers == ()
    assert any("5.15.0-130-generic" in w and "without linux-headers-5.15.0-130-generic" in w for w in d.warnings)
