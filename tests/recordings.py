"""Facts of recorded machines, parsed by the real fact classes (no pyinfra run needed)."""

from __future__ import annotations

from pathlib import Path

from qwen27b.controller import facts as F
from qwen27b.plan.gate import HostFacts

HOSTS_DIR = Path(__file__).parent / "fixtures" / "hosts"
NOCMD = "##PYINFRA_NOCMD##"


def _read(host: str, fact_cls):
    path = HOSTS_DIR / host / fact_cls.recorded_as
    if not path.exists():
        return fact_cls.default()
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines == [NOCMD] or not [line for line in lines if line.strip()]:
        return fact_cls.default()
    return fact_cls().process(lines)


def recorded_facts(host: str, **replace) -> HostFacts:
    """HostFacts for a recorded host, with optional fields replaced (a variation of a real box)."""
    values = dict(
        os=_read(host, F.OsRelease),
        kernel=_read(host, F.KernelRelease),
        gpus=_read(host, F.NvidiaGpus),
        pci_gpus=_read(host, F.NvidiaPciDevices),
        kernel_module=_read(host, F.NvidiaKernelModule),
        nouveau_loaded=_read(host, F.NouveauLoaded),
        secure_boot=_read(host, F.SecureBoot),
        disk=_read(host, F.DiskFree),
        memory=_read(host, F.MemoryInfo),
        pythons=_read(host, F.PythonVersions),
        xids=_read(host, F.XidErrors),
        packages=_read(host, F.NvidiaCudaPackages),
        held=_read(host, F.HeldPackages),
        kernel_headers=_read(host, F.KernelHeaders),
        models_on_disk=_read(host, F.ModelsOnDisk),
        topology=_read(host, F.GpuTopology),
        glibc=_read(host, F.GlibcVersion),
        driver_build=_read(host, F.DriverBuild),
        kernels=_read(host, F.InstalledKernels),
        occupants=_read(host, F.Occupants),
    )
    values.update(replace)
    return HostFacts(**values)
