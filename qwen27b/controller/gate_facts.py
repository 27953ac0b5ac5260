"""The facts the gate reads, in one table, and the one builder of HostFacts from them: the
preflight (pyinfra's get_fact), doctor (a snapshot's outputs) and the recorded test hosts read the
same facts into the same fields, each through its own `read`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from qwen27b.controller import facts as F
from qwen27b.plan.gate import HostFacts

# HostFacts field -> the fact that answers it (a fact with `path_arg` reads that stack path)
GATE_FACTS: tuple[tuple[str, type], ...] = (
    ("os", F.OsRelease),
    ("kernel", F.KernelRelease),
    ("gpus", F.NvidiaGpus),
    ("pci_gpus", F.NvidiaPciDevices),
    ("kernel_module", F.NvidiaKernelModule),
    ("nouveau_loaded", F.NouveauLoaded),
    ("secure_boot", F.SecureBoot),
    ("disk", F.DiskFree),
    ("memory", F.MemoryInfo),
    ("pythons", F.PythonVersions),
    ("xids", F.XidErrors),
    ("packages", F.NvidiaCudaPackages),
    ("held", F.HeldPackages),
    ("kernel_headers", F.KernelHeaders),
    ("models_on_disk", F.ModelsOnDisk),
    ("topology", F.GpuTopology),
    ("glibc", F.GlibcVersion),
    ("libstdcxx", F.LibstdcxxVersion),
    ("driver_build", F.DriverBuild),
    ("kernels", F.InstalledKernels),
    ("occupants", F.Occupants),
    ("wear", F.GpuWear),
    ("mok_requests", F.MokRequests),
    ("driver_source", F.DriverSource),
    ("unit_files", F.UnitFiles),
)


def _empty(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def build_host_facts(read: Callable[[type], Any], **given: Any) -> HostFacts:
    """HostFacts from `read(fact class)` -> its parsed answer (the class's default when it has none).
    A field with a default takes it for a falsy answer (no GPUs read: [], no mokutil: "unsupported").
    `given` fields replace what was read (a test's variation of a recorded box)."""
    empties = {f.name: _empty(f) for f in dataclasses.fields(HostFacts)}
    values = {}
    for name, cls in GATE_FACTS:
        value = read(cls)
        values[name] = value if empties[name] is None else (value or empties[name])
    return HostFacts(**(values | given))


def fact_arguments(cls: type, paths: dict) -> dict:
    """The keyword arguments pyinfra's get_fact takes for `cls`: the stack path it reads, if any."""
    name = getattr(cls, "path_arg", None)
    return {"path": paths[name]} if name else {}
