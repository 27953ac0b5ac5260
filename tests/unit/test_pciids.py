"""The Volta PCI id table is what pci.ids says, regenerated from the installed database."""


import pytest

from qwen27b.plan.pciids import PCI_IDS, TABLE, memory_class, render, volta_devices, volta_table
from qwen27b.plan.stack import gpu_spec, load_stack

from setupcheck import skip_or_fail_setup


def test_committed_table_matches_the_installed_pci_ids():
    """./run tests installs Debian's pci.ids package; a database of another version (another
    distribution, a newer release) is not ours to match, so that case skips, saying which."""
    if not PCI_IDS.is_file():
        skip_or_fail_setup(f"{PCI_IDS} missing: apt-get install pci.ids")
    text = PCI_IDS.read_text(encoding="utf-8", errors="replace")
    installed = volta_devices(text)[1].get("version")
    if installed != volta_table()["version"]:
        pytest.skip(f"{PCI_IDS} is version {installed}, the table was generated from {volta_table()['version']}")
    assert TABLE.read_text(encoding="utf-8") == render(text), "regenerate: python -m qwen27b.plan.pciids > qwen27b/plan/pci_volta.yaml"


def test_parser_takes_devices_not_subsystems_nor_other_vendors():
    text = ("#\tVersion: 2099.01.01\n#\tDate:    2099-01-01 00:00:00\n"
            "10de  NVIDIA Corporation\n\t1db5  GV100GL [Tesla V100 SXM2 32GB]\n\t\t10de 1249  GV100GL [Tesla V100 SXM3 32GB]\n"
            "\t1eb8  TU104GL [Tesla T4]\n10df  Emulex\n\t1db6  GV100 lookalike\n")
    devices, meta = volta_devices(text)
    assert devices == {"1db5": "GV100GL [Tesla V100 SXM2 32GB]"} and meta == {"version": "2099.01.01", "date": "2099-01-01 00:00:00"}


def test_every_volta_id_maps_to_a_volta_gpu():
    stack = load_stack()
    devices = volta_table()["devices"]
    assert "1df0" in devices and len(devices) >= 15
    for device, name in devices.items():
        spec = gpu_spec(stack, pci_id=device)
        assert spec is not None and spec["compute_capability"] == "7.0", device
        size = memory_class(name)
        if size == "32GB":
            assert spec["memory_mib"] == 32510, device
        elif size == "16GB":
            assert spec["memory_mib"] == 16160, device
