"""Used cards (issue 27): each GPU's wear judged before it serves, with the GPU named; the power caps and
the ECC wish checked against each card; the power unit rendered and accepted by systemd-analyze."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from qwen27b.controller.render import GPU_POWER_UNIT, NVIDIA_SMI, gpu_power_unit
from qwen27b.plan import gpuwear
from qwen27b.plan.hostdata import BadHostData, settings_for
from recordings import recorded_facts

from tests.support.gate_run import refused, run  # the gate's own helpers: a refusal names host and fix


def test_repeated_xid79_and_a_link_at_x4_leave_that_gpu_out_named():
    d = run("v100x4-wear-xid79")
    assert [g.index for g in d.gpus] == [0, 1, 2] and d.serve.value("--tensor-parallel-size") == "2"
    out = [w for w in d.warnings if "left out of the TP group" in w]
    assert out and all(w.startswith("GPU 3 (00000000:AF:00.0) left out") for w in out)
    assert any("Xid 79" in w and "2x" in w and "PSU" in w for w in out)
    assert any("x4 (gen 1) of its x16" in w and "reseat" in w for w in out)
    assert not any(w.startswith("GPU 3 PCIe link degraded") for w in d.warnings)  # said once, with the fix


def test_one_xid48_is_a_warning_that_names_the_gpu_and_it_still_serves():
    d = run("v100x4-wear-warn")
    assert [g.index for g in d.gpus] == [0, 1, 2, 3]
    assert any(w.startswith("GPU 2 (00000000:86:00.0): Xid 48") and "a second one leaves it out" in w for w in d.warnings)
    assert any("on GPU 2 (00000000:86:00.0) 1x" in w for w in d.warnings if w.startswith("Xid 48"))


def test_every_gpu_worn_refuses_the_host_with_each_gpu_its_evidence_and_fix():
    r = refused("v100x2-pcie-worn")
    causes = [c for c, _ in r.problems]
    assert causes[0].startswith("GPU 0 (00000000:3B:00.0) should not serve: memory pages are waiting to be retired")
    assert "reboot the host" in r.problems[0][1] and "restarting the service cannot help" in r.problems[0][1]
    assert causes[1].startswith("GPU 1 (00000000:5E:00.0) should not serve: Xid 79")


def test_host_data_that_selects_a_worn_gpu_is_refused_naming_it():
    r = refused("v100x4-wear-xid79", {"qwen27b_gpu_indices": [2, 3]})
    assert "qwen27b_gpu_indices selects GPU 3 (00000000:AF:00.0), which should not serve" in r.cause
    assert "leave GPU 3 out of qwen27b_gpu_indices" in r.fix
    assert [g.index for g in run("v100x4-wear-xid79", {"qwen27b_gpu_indices": [0, 1]}).gpus] == [0, 1]


def test_pending_retirement_on_one_gpu_leaves_it_out_and_too_few_left_is_refused_with_its_fix():
    facts = recorded_facts("v100x2-pcie-worn")
    one = {**facts.wear, "gpus": [facts.wear["gpus"][0], {**facts.wear["gpus"][1]}]}
    d = run("v100x2-pcie-worn", wear=one, xids=[])
    assert [g.index for g in d.gpus] == [1] and any(w.startswith("GPU 0 (00000000:3B:00.0) left out") for w in d.warnings)
    # the 16 GB pair: one card left cannot hold the model: the refusal says which GPU and why
    pair = recorded_facts("v100x2-pcie-worn")
    small = [{**g, "memory_mib": 16160, "name": "Tesla V100-PCIE-16GB"} for g in pair.gpus]
    r = refused("v100x2-pcie-worn", wear=one, xids=[], gpus=small)
    assert r.cause.startswith("GPU 0 (00000000:3B:00.0) should not serve: memory pages are waiting")
    assert "the 1 GPU(s) left cannot serve" in r.cause and r.fix.startswith("reboot the host")


def test_a_converged_host_with_persistence_off_says_so_and_ecc_off_is_named():
    d = run("v100x4-converged-nopm")
    persist = d.choice("persist")
    assert persist.action == "install" and "persistence mode is off on GPU(s) 0, 1, 2, 3" in persist.reason
    assert d.choice("ecc").value == "as found" and "ECC is off on GPU(s) 1" in d.choice("ecc").reason
    assert any(w.startswith("GPU 1 (00000000:3B:00.0): ECC is off") for w in d.warnings)
    assert run("v100x4-converged").choice("persist").action == "keep"


def test_power_caps_are_checked_against_each_cards_range():
    d = run("v100x4-converged-nopm", {"qwen27b_power_limit_w": {1: 250, 3: 275}, "qwen27b_ecc": "on"})
    assert d.power.limits == ((1, 250), (3, 275)) and d.power.ecc_on == (1,)
    assert "GPU 1: 250 W (now 300 W, range 150-300 W)" in d.choice("power").reason
    ecc = d.choice("ecc")
    assert ecc.action == "pending" and "after a reboot" in ecc.reason
    r = refused("v100x4-converged", {"qwen27b_power_limit_w": 320})
    assert "qwen27b_power_limit_w 320 W for GPU 0 is outside its range 150-300 W" in r.cause and "150-300" in r.fix
    assert "names GPU 7" in refused("v100x4-converged", {"qwen27b_power_limit_w": {7: 250}}).cause
    fresh = run("v100x4-2204-fresh", {"qwen27b_power_limit_w": 275})  # no driver yet: the range is not read
    assert fresh.power.limits == ((0, 275), (1, 275), (2, 275), (3, 275)) and "not read" in fresh.choice("power").reason


@pytest.mark.parametrize("value, says", [(True, "275 (watts for every GPU)"), ("275", "{0: 275, 1: 250}"), (20, "50-1000"),
                                         ({0: 275.5}, "not whole watts"), ({"gpu0": 275}, "not a GPU index"),
                                         ({}, "empty mapping")])
def test_bad_power_data_is_refused_naming_host_key_and_fix(value, says):
    with pytest.raises(BadHostData) as caught:
        settings_for("lab-1", {"qwen27b_power_limit_w": value})
    assert caught.value.host == "lab-1" and caught.value.key == "qwen27b_power_limit_w" and says in str(caught.value)


def test_ecc_takes_on_only_and_yamls_bare_on():
    assert settings_for("h", {"qwen27b_ecc": True}).ecc == "on"  # YAML 1.1: `qwen27b_ecc: on` is True
    with pytest.raises(BadHostData) as caught:
        settings_for("h", {"qwen27b_ecc": "off"})
    assert caught.value.key == "qwen27b_ecc" and "reboot" in caught.value.fix


def test_the_power_unit_runs_before_the_service_with_ints_only():
    d = run("v100x4-converged-nopm", {"qwen27b_power_limit_w": {1: 250, 3: 275}, "qwen27b_ecc": "on"})
    unit = gpu_power_unit(d)
    assert "Before=qwen27b.service" in unit and "Type=oneshot" in unit and "RemainAfterExit=yes" in unit
    lines = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert lines == [f"ExecStart={NVIDIA_SMI} -pm 1", f"ExecStart={NVIDIA_SMI} -i 1 -pl 250",
                     f"ExecStart={NVIDIA_SMI} -i 3 -pl 275", f"ExecStart={NVIDIA_SMI} -i 1 -e 1"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("data", [{}, {"qwen27b_power_limit_w": {1: 250, 3: 275}, "qwen27b_ecc": "on"}])
def test_the_power_unit_passes_systemd_analyze_verify(tmp_path, data):
    d = run("v100x4-converged-nopm", data)
    smi = tmp_path / NVIDIA_SMI.lstrip("/")  # verify checks that ExecStart's binary exists
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    (units / GPU_POWER_UNIT).write_text(gpu_power_unit(d, prefix=str(tmp_path)))
    (units / "qwen27b.service").write_text("[Service]\nExecStart=/bin/true\n")  # what Before= names
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "notice"}
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(units / GPU_POWER_UNIT)],
                            capture_output=True, text=True, env=env, cwd=units)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_bus_slots_match_the_kernels_and_nvidia_smis_addresses():
    assert gpuwear.bus_slot("00000000:AF:00.0") == gpuwear.bus_slot("0000:af:00") == "af:00"
