"""Recorded hosts load into pyinfra @fake hosts, and every fact reads back what was recorded."""

import json
import re

import pytest
from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.server import Arch, LinuxDistribution

from qwen27b.controller import facts as F
from qwen27b.controller.facts import ALL_FACTS, SNAPSHOT_NAMES
from tests.support.recorded import (NOT_RECORDED_FILE, connector_lines, fake_match, fake_responses, not_recorded,
                                    recorded_facts)
from tests.support.paths import TESTS

HOSTS_DIR = TESTS / "fixtures" / "hosts"
FACT_CASES = TESTS / "facts"
NOCMD = "##PYINFRA_NOCMD##"
MODEL_DIR = "/var/lib/qwen27b/models"
PATHS_STATE = "/var/lib/qwen27b"

HOSTS = sorted(p.name for p in HOSTS_DIR.iterdir() if p.is_dir())
RECORDED_NAMES = {SNAPSHOT_NAMES[fact] for fact in ALL_FACTS}


def fact_args(fact):
    return {"path": MODEL_DIR} if getattr(fact, "path_arg", None) else {}


def pyinfra_command(fact, **kwargs) -> str:
    """The command string the @fake connector sees, built the way pyinfra's _get_fact builds it."""
    instance = fact()
    command = instance.command(**kwargs)
    requires = instance.requires_command(**kwargs)
    if requires:
        command = StringCommand(
            "if", "command", "-v", requires, ">/dev/null", "2>&1;", "then", "(", command, ");",
            "else", "echo", f"'{NOCMD}';", "fi",
        )  # fmt: skip
    return command.get_masked_value() if isinstance(command, StringCommand) else command


def matches(key, command: str) -> bool:
    """The @fake connector's rule: re.Pattern keys .search(), str keys are substrings."""
    return bool(key.search(command)) if isinstance(key, re.Pattern) else key in command


def first_response(responses: dict, command: str):
    return next((value for key, value in responses.items() if matches(key, command)), None)


def fake_host(name: str):
    responses = fake_responses(HOSTS_DIR / name)
    data = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0}
    inventory = Inventory(([(f"@fake/{name}", data)], {}))
    state = State(inventory, Config())
    connect_all(state)
    return inventory.get_host(f"@fake/{name}")


def recorded_lines(name: str, fact) -> list[str] | None:
    """The file's lines as a connector hands them over (a CR or an escape stays in its line)."""
    path = HOSTS_DIR / name / SNAPSHOT_NAMES[fact]
    return connector_lines(path.read_bytes().decode("utf-8")) if path.is_file() else None


# --- the host directories ------------------------------------------------------------------------


def test_all_hosts_present():
    assert set(HOSTS) == {
        "v100x4-2204-fresh", "v100x1-2004", "v100x2-16gb", "v100x4-converged", "v100x4-degraded",
        "v100x1-secureboot", "t4x1-2204", "a100x2-2204", "nogpu-2204", "centos7", "debian12-cpu", "h200", "h100", "h100-b",
        "v100x1-open-loaded", "v100x2-open-unloaded", "v100x2-r470", "v100x4-pg500", "v100x4-noheaders",
        "v100x4-converged-8g", "v100x4-copies-converged", "v100x4-copies-drop-b", "v100x4-copies-to-one", "v100x2-pcie", "v100x4-pcie", "v100x8-sxm2-dgx1",
        "mixed-3090-v100x2",
        "v100x2-mixed", "v100x2-r470-held", "v100x4-dkms-failed", "v100x4-newer-kernel",
        "v100x2-old-vllm", "v100x1-pg500", "v100x2-cuda-drivers",
        "v100x2-lab-unit",  # issue 52: the lab's own qwen27b.service
        # issue 27: worn cards
        "v100x4-wear-xid79", "v100x4-wear-warn", "v100x2-pcie-worn", "v100x4-converged-nopm",
        # issue 52 item 4: a small /var, the big disk on /data (and the models dir set there)
        "v100x4-small-var", "v100x4-data-disk",
        # issue 52: the driver after unattended-upgrades
        "v100x2-r580-mismatch", "v100x1-secureboot-mok", "v100x2-ppa-580",
        # issue 52 item 2: nvidia-smi never returns (its bounded read timed out)
        "v100x4-wedged",
    }  # fmt: skip


@pytest.mark.parametrize("name", HOSTS)
def test_host_dir_holds_only_known_files(name):
    host_dir = HOSTS_DIR / name
    readme = (host_dir / "README.md").read_text(encoding="utf-8")
    assert "Stands for" in readme
    allowed = RECORDED_NAMES | {"README.md", "extra.yaml", NOT_RECORDED_FILE}
    for path in host_dir.iterdir():
        if path.is_dir():
            assert (name, path.name) in {("h200", "genuine"), ("h100", "genuine"), ("h100-b", "genuine")}, path
        elif path.suffix != ".py":  # a script that writes extra.yaml may live beside it
            assert path.name in allowed, f"{path}: not a SNAPSHOT_NAMES file name (typo?)"


@pytest.mark.parametrize("name", HOSTS)
def test_fake_responses_loads(name):
    responses = fake_responses(HOSTS_DIR / name)
    recorded = recorded_facts(HOSTS_DIR / name)
    assert recorded, name
    for fact in recorded:
        assert responses[fake_match(fact)] == recorded_lines(name, fact)
    absent = not_recorded(HOSTS_DIR / name)
    for fact in set(ALL_FACTS) - set(recorded):
        assert SNAPSHOT_NAMES[fact] in absent, f"{name}: {fact.__name__} neither recorded nor in {NOT_RECORDED_FILE}"
        assert fake_match(fact) not in responses


@pytest.mark.parametrize("name", HOSTS)
def test_every_fact_is_recorded_or_named_absent_with_a_reason(name):
    """Issue 57: a recorded host answers each fact from its file, or says why it does not."""
    recorded = {SNAPSHOT_NAMES[fact] for fact in recorded_facts(HOSTS_DIR / name)}
    absent = not_recorded(HOSTS_DIR / name)
    assert recorded | set(absent) == RECORDED_NAMES and not recorded & set(absent)
    assert all(len(why) > 10 for why in absent.values())


def test_a_fact_nobody_recorded_fails_the_host_naming_it(tmp_path, caplog):
    """A recorded host once answered every command it had no recording for with empty success: a
    one-GPU H100 without `topo -m` looked like a host without links (issue 57). Now pyinfra's own
    read fails, and what it prints names the fact and the file."""
    (tmp_path / SNAPSHOT_NAMES[F.OsRelease]).write_text("ID=ubuntu\nVERSION_ID=\"24.04\"\n")
    (tmp_path / NOT_RECORDED_FILE).write_text(f"{SNAPSHOT_NAMES[F.XidErrors]} no kernel log on that machine\n")
    responses = fake_responses(tmp_path)
    topo = responses[fake_match(F.GpuTopology)]
    assert topo["success"] is False and "GpuTopology" in topo["stderr"][0] and "nvidia-smi-topo.txt" in topo["stderr"][0]
    assert fake_match(F.XidErrors) not in responses  # named absent: empty success, the fact's default
    data = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0}
    inventory = Inventory(([("@fake/unrecorded", data)], {}))
    state = State(inventory, Config())
    connect_all(state)
    host = inventory.get_host("@fake/unrecorded")
    assert host.get_fact(F.OsRelease)["version_id"] == "24.04"
    assert host.get_fact(F.XidErrors) == []
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # the one host failed
        host.get_fact(F.GpuTopology)
    assert host in state.failed_hosts
    assert "no recording of fact GpuTopology (nvidia-smi-topo.txt)" in caplog.text
    assert "could not load fact: qwen27b.controller.facts.GpuTopology" in caplog.text


@pytest.mark.parametrize("text, why", [
    ("nvidia-smi-topo.tx not read\n", "no fact's snapshot file"),
    ("os-release\n", "say why"),
    ("meminfo was never there\n", "recorded after all"),
])
def test_a_wrong_not_recorded_line_is_refused(tmp_path, text, why):
    (tmp_path / "meminfo").write_text("MemTotal: 1 kB\n")
    (tmp_path / NOT_RECORDED_FILE).write_text(text)
    with pytest.raises(ValueError, match=why):
        fake_responses(tmp_path)


@pytest.mark.parametrize("name", HOSTS)
def test_every_key_answers_its_own_facts_command(name):
    responses = fake_responses(HOSTS_DIR / name)
    for fact in recorded_facts(HOSTS_DIR / name):
        command = pyinfra_command(fact, **fact_args(fact))
        assert first_response(responses, command) == recorded_lines(name, fact), fact.__name__


@pytest.mark.parametrize("fact", ALL_FACTS, ids=lambda fact: fact.__name__)
def test_fake_match_matches_only_its_own_fact(fact):
    for other in ALL_FACTS:
        for wrapped in (True, False):
            command = pyinfra_command(other, **fact_args(other))
            if not wrapped:  # also the bare command, in case requires_command goes away
                command = other().command(**fact_args(other))
            assert matches(fake_match(fact), command) == (other is fact), (fact.__name__, other.__name__)


def test_disk_free_matches_any_path():
    for path in ("/var/lib/qwen27b/models", "/srv/model store/it's here", "relative/dir"):
        assert matches(fake_match(F.DiskFree), pyinfra_command(F.DiskFree, path=path))


def test_nocmd_recordings_are_for_facts_with_requires_command():
    for name in HOSTS:
        for fact in recorded_facts(HOSTS_DIR / name):
            if recorded_lines(name, fact) == [NOCMD]:
                assert fact().requires_command(**fact_args(fact)), (name, fact.__name__)


# --- pyinfra reads them back ---------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTS)
def test_pyinfra_fake_host_reads_back_every_fact(name):
    host = fake_host(name)
    for fact in ALL_FACTS:
        value = host.get_fact(fact, **fact_args(fact))
        lines = recorded_lines(name, fact)
        if lines is None or lines == [NOCMD] or not lines:
            expected = fact.default()  # absent file, missing binary, or empty output
        else:
            expected = fact().process(lines)
        assert value == expected, (name, fact.__name__)
        # pyinfra ran exactly the command our keys were written against.
        assert host.connector.executed_commands[-1] == pyinfra_command(fact, **fact_args(fact))


# What each host stands for, typed from the brief (not from the files), checked through pyinfra.
EXPECTED = {
    "v100x4-2204-fresh": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=0,
                              module=None, nouveau=True, sb="disabled", free_tb=1.5, ram_gib=256,
                              python={"3.10"}, xid=[], held=[], packages=set()),
    # v100x4-2204-fresh's facts (linked) with /var a small volume, and with the big /data measured
    "v100x4-small-var": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=0,
                             module=None, nouveau=True, free_tb=0.025, ram_gib=256),
    "v100x4-data-disk": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=0,
                             module=None, nouveau=True, free_tb=6.878, ram_gib=256),
    "v100x1-2004": dict(os=("ubuntu", "20.04"), kernel="5.4.0-200-generic", pci=["1db6"], smi=0, module=None,
                        nouveau=True, sb="disabled", free_tb=0.4, ram_gib=64, python={"3.8"}, xid=[], held=[],
                        packages=set()),
    "v100x2-16gb": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db1"] * 2, smi=0,
                        module=None, nouveau=True, sb="disabled", free_tb=1.5, ram_gib=128, python={"3.10"},
                        xid=[], held=[], packages=set()),
    "v100x4-converged": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=4,
                             module=("proprietary", "580.95.05"), nouveau=False, sb="disabled", ram_gib=256,
                             python={"3.10", "3.12"}, xid=[], held=["nvidia-driver-580-server"],
                             packages={"nvidia-driver-580-server", "cuda-toolkit-12-8"}),
    "v100x4-degraded": dict(os=("ubuntu", "22.04"), pci=["1db5"] * 4, smi=4, module=("proprietary", "580.95.05"),
                            nouveau=False, xid=[79], held=["nvidia-driver-580-server"],
                            packages={"nvidia-driver-580-server", "cuda-toolkit-12-8"}),
    # smi=1: NvidiaGpus answers the hang as one "gpu-hung" problem entry, no GPU
    "v100x4-wedged": dict(os=("ubuntu", "22.04"), pci=["1db5"] * 4, smi=1, module=("proprietary", "580.95.05"),
                          nouveau=False, xid=[62, 45], held=["nvidia-driver-580-server"]),
    "v100x1-secureboot": dict(os=("ubuntu", "22.04"), pci=["1db6"], smi=0, module=None, sb="enabled",
                              python={"3.10"}, ram_gib=64, free_tb=0.4),
    "t4x1-2204": dict(os=("ubuntu", "22.04"), pci=["1eb8"], smi=1, module=("proprietary", "580.95.05"),
                      nouveau=False, python={"3.10"}),
    "a100x2-2204": dict(os=("ubuntu", "22.04"), pci=["20b2"] * 2, smi=2, nouveau=False, python={"3.10"}),
    "nogpu-2204": dict(os=("ubuntu", "22.04"), pci=[], smi=0, module=None, nouveau=False, python={"3.10"},
                       packages=set(), held=[]),
    "centos7": dict(os=("centos", "7"), kernel="3.10.0-1160.el7.x86_64", pci=[], smi=0, module=None,
                    sb="unsupported", python={"3.6"}, packages=set(), held=[]),
    "debian12-cpu": dict(os=("debian", "12"), pci=[], smi=0, module=None, sb="unsupported", python={"3.11"},
                         packages=set(), held=[]),
    "h100": dict(os=("ubuntu", "24.04"), kernel="6.18.44-fc-v1294-gpu", pci=[], smi=1,
                 module=("open", "580.159.04"), nouveau=False, sb="unsupported", python={"3.12"}, xid=[],
                 held=["libcublas-13-0", "libcublas-dev-13-0", "libcudnn9-cuda-13", "libnccl-dev", "libnccl2"],
                 links=[["X"]]),
    "h100-b": dict(os=("ubuntu", "24.04"), kernel="6.18.44-fc-v1272-gpu", pci=[], smi=1,
                   module=("open", "580.159.04"), nouveau=False, sb="unsupported", python={"3.12"}, xid=[],
                   free_tb=0.0687, ram_gib=126, links=[["X"]]),
    "h200": dict(os=("ubuntu", "24.04"), kernel="6.18.44-fc-v973-gpu", pci=[], smi=1,
                 module=("open", "580.159.04"), nouveau=False, sb="unsupported", python={"3.12"}, xid=[],
                 packages=set(), held=[]),
    "v100x1-open-loaded": dict(os=("ubuntu", "22.04"), pci=["1db6"], smi=0, module=("open", "580.95.05"),
                               nouveau=False, packages={"nvidia-driver-580-open", "nvidia-dkms-580-open"}),
    "v100x2-open-unloaded": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=0, module=None, nouveau=False,
                                 packages={"nvidia-driver-580-open", "nvidia-kernel-source-580-open"}),
    "v100x2-r470": dict(os=("ubuntu", "20.04"), pci=["1db6"] * 2, smi=1, module=("proprietary", "470.256.02"),
                        packages={"nvidia-driver-470"}),
    # issue 24: one 16 GB and one 32 GB card (v100x2-16gb's facts otherwise); R470 with its branch held
    "v100x2-mixed": dict(os=("ubuntu", "22.04"), pci=["1db1", "1db5"], smi=0, module=None, nouveau=True),
    "v100x2-r470-held": dict(os=("ubuntu", "20.04"), pci=["1db6"] * 2, smi=1, module=("proprietary", "470.256.02"),
                             packages={"nvidia-driver-470"}, held=["nvidia-dkms-470", "nvidia-driver-470"]),
    "v100x4-pg500": dict(os=("ubuntu", "22.04"), pci=["1df0"] * 4, smi=0, module=None, nouveau=True),
    "v100x4-converged-8g": dict(os=("ubuntu", "22.04"), pci=["1db5"] * 4, smi=4, module=("proprietary", "580.95.05")),
    "v100x4-noheaders": dict(os=("ubuntu", "22.04"), kernel="5.15.0-60-generic", pci=["1db5"] * 4, smi=0),
    # issue 24: a driver build that failed (half-configured R580, dkms 'added'); a newer kernel not booted
    "v100x4-dkms-failed": dict(os=("ubuntu", "22.04"), kernel="6.8.0-45-generic", pci=["1db5"] * 4, smi=0, module=None,
                               packages={"nvidia-utils-580-server"}),
    "v100x2-old-vllm": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=2, module=("proprietary", "580.95.05")),
    "v100x2-lab-unit": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=2, module=("proprietary", "580.95.05"),
                            lab_units=["qwen27b.service"]),
    "v100x2-cuda-drivers": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=2, module=("proprietary", "570.195.03"),
                                packages={"cuda-drivers", "nvidia-driver-570", "cuda-toolkit-12-8"}, held=[]),
    "v100x1-pg500": dict(os=("ubuntu", "22.04"), pci=["1df0"], smi=0, module=None, nouveau=True),
    # issue 27: worn cards (v100x4-converged's or v100x2-pcie's facts, their wear and Xids edited)
    "v100x4-wear-xid79": dict(os=("ubuntu", "22.04"), pci=["1db5"] * 4, smi=4, xid=[79, 79]),
    "v100x4-wear-warn": dict(os=("ubuntu", "22.04"), pci=["1db5"] * 4, smi=4, xid=[48]),
    "v100x2-pcie-worn": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=2, xid=[48, 63, 79, 79]),
    "v100x4-converged-nopm": dict(os=("ubuntu", "22.04"), pci=["1db5"] * 4, smi=4, xid=[]),
    "v100x4-newer-kernel": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=0,
                                module=None, packages=set()),
    # v100x4-converged's facts (links to them), converged as two copies (qwen27b_instances)
    "v100x4-copies-converged": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=4,
                                    module=("proprietary", "580.95.05"), nouveau=False, held=["nvidia-driver-580-server"]),
    "v100x4-copies-drop-b": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=4,
                                 module=("proprietary", "580.95.05"), nouveau=False, held=["nvidia-driver-580-server"]),
    "v100x4-copies-to-one": dict(os=("ubuntu", "22.04"), kernel="5.15.0-125-generic", pci=["1db5"] * 4, smi=4,
                                 module=("proprietary", "580.95.05"), nouveau=False, held=["nvidia-driver-580-server"]),
    # v100x4-converged's software with other GPUs and links (qwen27b/plan/topology.py's golden hosts)
    "v100x2-pcie": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=2, module=("proprietary", "580.95.05"),
                        links=[["X", "NODE"], ["NODE", "X"]]),
    # issue 52 item 3: v100x2-pcie after an in-place R580 upgrade (unheld), 580.95.05 still loaded: one problem entry
    "v100x2-r580-mismatch": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=1, module=("proprietary", "580.95.05"),
                                 held=[], packages={"nvidia-driver-580-server"}),
    # issue 52 item 5: v100x2-pcie with the graphics-drivers PPA's non-server R580, unheld
    "v100x2-ppa-580": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 2, smi=2, module=("proprietary", "580.95.05"),
                           held=[], packages={"nvidia-driver-580"}),
    # issue 52 item 8: v100x1-secureboot with its MOK key imported, waiting for enrolment
    "v100x1-secureboot-mok": dict(os=("ubuntu", "22.04"), pci=["1db6"], smi=0, module=None, nouveau=True, sb="enabled"),
    "v100x4-pcie": dict(os=("ubuntu", "22.04"), pci=["1db6"] * 4, smi=4, module=("proprietary", "580.95.05")),
    "v100x8-sxm2-dgx1": dict(os=("ubuntu", "22.04"), pci=["1db1"] * 8, smi=8, module=("proprietary", "580.95.05")),
    "mixed-3090-v100x2": dict(os=("ubuntu", "22.04"), pci=["2204", "1db5", "1db5"], smi=3,
                              links=[["X", "NODE", "NODE"], ["NODE", "X", "NV6"], ["NODE", "NV6", "X"]]),
}


@pytest.mark.parametrize("name", HOSTS)
def test_host_is_what_its_readme_says(name):
    want = EXPECTED[name]
    host = fake_host(name)
    os_release = host.get_fact(F.OsRelease)
    assert (os_release["id"], os_release["version_id"]) == want["os"]
    if "kernel" in want:
        assert host.get_fact(F.KernelRelease) == want["kernel"]
    assert [d["device_id"] for d in host.get_fact(F.NvidiaPciDevices)] == want["pci"]
    gpus = host.get_fact(F.NvidiaGpus)
    assert len(gpus) == want["smi"]
    if "module" in want:
        module = host.get_fact(F.NvidiaKernelModule)
        assert (module["flavor"], module["version"]) == (want["module"] or (None, None))
        assert module["loaded"] is (want["module"] is not None)
    if "nouveau" in want:
        assert host.get_fact(F.NouveauLoaded) is want["nouveau"]
    if "sb" in want:
        assert host.get_fact(F.SecureBoot) == want["sb"]
    if "free_tb" in want:
        free = host.get_fact(F.DiskFree, path=MODEL_DIR)["free_bytes"]
        assert abs(free / 1e12 - want["free_tb"]) < 0.01
    if "ram_gib" in want:
        total = host.get_fact(F.MemoryInfo)["total_bytes"] / 2**30
        assert want["ram_gib"] * 0.95 < total <= want["ram_gib"]
    if "python" in want:
        assert set(host.get_fact(F.PythonVersions)) == want["python"]
    if "xid" in want:
        assert [e["xid"] for e in host.get_fact(F.XidErrors)] == want["xid"]
    if "held" in want:
        assert host.get_fact(F.HeldPackages) == want["held"]
    if "packages" in want:
        packages = host.get_fact(F.NvidiaCudaPackages)
        assert want["packages"] <= set(packages) and (want["packages"] or not packages)
    if "links" in want:
        assert host.get_fact(F.GpuTopology)["links"] == want["links"]
    if "lab_units" in want:  # issue 52: unit files on our names that qwen27b did not render
        units = host.get_fact(F.UnitFiles, path=PATHS_STATE)["units"]
        assert [u["name"] for u in units if not u["first"].startswith("# Rendered by qwen27b")] == want["lab_units"]


def test_degraded_host_differs_from_converged_only_in_gpu2_link_and_xid():
    converged, degraded = fake_host("v100x4-converged"), fake_host("v100x4-degraded")
    before, after = converged.get_fact(F.NvidiaGpus), degraded.get_fact(F.NvidiaGpus)
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert changed == [2]
    assert (after[2]["pcie_gen_current"], after[2]["pcie_width_current"]) == (1, 8)
    assert (after[2]["pcie_gen_max"], after[2]["pcie_width_max"]) == (3, 16)
    assert after[2]["bus_id"].lower().endswith("86:00.0")
    assert [e["pci"] for e in degraded.get_fact(F.XidErrors)] == ["0000:86:00"]


def test_lspci_and_nvidia_smi_agree_on_slots():
    for name in HOSTS:
        host = fake_host(name)
        gpus, pci = host.get_fact(F.NvidiaGpus), host.get_fact(F.NvidiaPciDevices)
        gpus = [g for g in gpus if "problem" not in g]  # e.g. R470's "not a valid field" line
        if gpus and pci:
            # nvidia-smi: 00000000:3B:00.0 (8-digit domain, upper case); lspci -D: 0000:3b:00.0
            assert [g["bus_id"][4:].lower() for g in gpus] == [d["slot"] for d in pci], name


def test_h200_fact_files_come_from_the_genuine_recording():
    genuine = HOSTS_DIR / "h200" / "genuine"
    host_txt = (genuine / "host.txt").read_text(encoding="utf-8").splitlines()
    assert recorded_lines("h200", F.NvidiaKernelModule) == host_txt[:2]
    assert recorded_lines("h200", F.KernelRelease) == host_txt[-1:]
    assert all(line in host_txt for line in recorded_lines("h200", F.OsRelease))
    # Each derived value is verbatim in the genuine CSV row (header and units aside).
    genuine_row = (genuine / "query-gpu.csv").read_text(encoding="utf-8").splitlines()[1].split(", ")
    for value in recorded_lines("h200", F.NvidiaGpus)[0].split(", "):
        assert value in genuine_row or f"{value} MiB" in genuine_row, value


# Raw recordings of real machines: every fact command run on the host (`/bin/sh -c`, no TTY), with
# its exit code, stdout and stderr, and what the fact's process() made of it there.
GENUINE = sorted(HOSTS_DIR.glob("*/genuine/facts.json"))


def test_a_genuine_recording_is_there():
    assert {"h100", "h100-b"} <= {path.parent.parent.name for path in GENUINE}


@pytest.mark.parametrize("recording", GENUINE, ids=[path.parent.parent.name for path in GENUINE])
def test_every_fact_of_a_genuine_recording_parses_with_its_own_process(recording):
    """Issue 57: the H100's `topo -m` underlined its header with escape codes even into a pipe, and its
    GpuTopology failed where every hand-copied fixture had parsed. Every fact a real machine answered
    parses now, and what parsed there parses to the same value here."""
    raw = json.loads(recording.read_text(encoding="utf-8"))
    fixed = {fact.__name__ for fact in ALL_FACTS if not getattr(fact, "path_arg", None)}
    # a fact added after the machine was recorded is named in its not-recorded.txt (MokRequests, issue 52)
    newer = {fact.__name__ for fact in ALL_FACTS if SNAPSHOT_NAMES[fact] in not_recorded(recording.parent.parent)}
    assert fixed - newer <= set(raw), f"facts the recording lacks: {sorted(fixed - newer - set(raw))}"
    for name, answer in raw.items():
        fact = getattr(F, name)
        lines = connector_lines(answer["stdout"])
        value = fact().process(lines) if lines else fact.default()  # pyinfra's read: no output, the default
        if answer.get("ok"):  # parsed on the host too (h100-b's host had no qwen27b to parse with)
            assert repr(value) == answer["parsed"], name


def test_the_h100s_one_gpu_topology_is_read():
    """One GPU: the header's next columns are CPU and NUMA affinity, the row is X alone: no links."""
    host = fake_host("h100")
    assert host.get_fact(F.GpuTopology) == {"gpus": [0], "links": [["X"]], "p2p_read": [["X"]]}


@pytest.mark.parametrize("name", ["h100", "h100-b"])
def test_genuine_hosts_fact_files_are_the_recorded_bytes(name):
    """Each fact file is the host's stdout for that command, byte for byte (from_genuine.py wrote them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("from_genuine", HOSTS_DIR / "from_genuine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = module.fact_files(name)
    assert len(files) == len(ALL_FACTS) - len(not_recorded(HOSTS_DIR / name))
    for file_name, text in files.items():
        assert (HOSTS_DIR / name / file_name).read_bytes() == text.encode("utf-8"), file_name
    assert "\x1b[4m" in files[SNAPSHOT_NAMES[F.GpuTopology]]  # the escapes stayed


# --- pyinfra's own facts from extra.yaml ---------------------------------------------------------


def _answers_builtin_facts(name):
    extra = HOSTS_DIR / name / "extra.yaml"
    return extra.is_file() and "ls -pdL *-release" in extra.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", [n for n in HOSTS if _answers_builtin_facts(n)])
def test_extra_yaml_answers_pyinfra_builtin_facts(name):
    host = fake_host(name)
    assert host.get_fact(Arch) == "x86_64"
    distro = host.get_fact(LinuxDistribution)
    os_release = host.get_fact(F.OsRelease)
    assert distro["release_meta"]["ID"] == os_release["id"]
    assert str(distro["major"]) == os_release["version_id"].split(".")[0]


# --- fake_responses on made-up directories -------------------------------------------------------


def test_missing_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        fake_responses(tmp_path / "nope")


def test_nocmd_empty_absent_and_extra(tmp_path):
    (tmp_path / "README.md").write_text("# not a recording\n")
    (tmp_path / SNAPSHOT_NAMES[F.NvidiaGpus]).write_text(NOCMD + "\n")
    (tmp_path / SNAPSHOT_NAMES[F.XidErrors]).write_text("")
    (tmp_path / "extra.yaml").write_text(
        "- match: '^systemctl is-active qwen27b$'\n"
        "  regex: true\n"
        "  stdout: [inactive]\n"
        "  success: false\n"
        "- match: uname -m\n"
        "  stdout: aarch64\n"
    )
    responses = fake_responses(tmp_path)
    keys = [key for key, value in responses.items() if not (isinstance(value, dict) and "stderr" in value)]
    assert keys[:2] == [fake_match(F.NvidiaGpus), fake_match(F.XidErrors)]  # facts first, then extra
    assert responses[fake_match(F.NvidiaGpus)] == [NOCMD]
    assert responses[fake_match(F.XidErrors)] == []
    assert isinstance(keys[2], re.Pattern) and keys[2].pattern == "^systemctl is-active qwen27b$"
    assert responses[keys[2]] == {"stdout": ["inactive"], "success": False}
    assert responses["uname -m"] == {"stdout": ["aarch64"], "success": True}
    assert len(responses) == len(ALL_FACTS) + 2  # every other fact: a failing answer naming it


def test_bad_extra_yaml_is_refused(tmp_path):
    (tmp_path / "extra.yaml").write_text("match: uname -m\n")
    with pytest.raises(ValueError, match="list"):
        fake_responses(tmp_path)
    (tmp_path / "extra.yaml").write_text("- stdout: [x]\n")
    with pytest.raises(ValueError, match="entry 1"):
        fake_responses(tmp_path)


# --- JSON fact cases named after a host carry that host's recording ------------------------------


def test_host_named_fact_cases_match_the_recordings():
    checked = 0
    for case in FACT_CASES.glob("*/*.json"):
        if case.stem not in HOSTS:
            continue
        fact = getattr(F, case.parent.name)
        data = json.loads(case.read_text(encoding="utf-8"))
        assert data["output"] == recorded_lines(case.stem, fact), case
        checked += 1
    assert checked >= len(ALL_FACTS)


def test_every_fact_has_one_snapshot_name_and_no_test_hook():
    """Doctor's snapshot and a recorded host keep each fact under its SNAPSHOT_NAMES file; how a
    @fake host answers a command is tests/support/recorded.py's (fake_match), not the fact class's."""
    from qwen27b.controller import host_facts as H
    from tests.support.recorded import FAKE_MATCH

    assert set(SNAPSHOT_NAMES) == set(ALL_FACTS)
    assert len(set(SNAPSHOT_NAMES.values())) == len(SNAPSHOT_NAMES)
    classes = [c for module in (F, H) for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__]
    assert [c.__name__ for c in classes if {"fake_match", "recorded_as"} & set(dir(c))] == []
    assert set(FAKE_MATCH) <= set(classes)
