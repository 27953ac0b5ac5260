"""What the gate hands on: RefusedHost (a host not to touch), HostFacts (the facts it reads), Choice
(one install row), DriverPlan and Decision (the plan for one host). A module of its own so the gate's
parts (driverplan, installs, specchoice) and the gate itself share them without an import circle."""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen27b.plan.settings import Settings
from qwen27b.plan.planner import Gpu, ServePlan
from qwen27b.plan.stack import ResolvedStack


class RefusedHost(Exception):
    """This host must not be touched; str() names host, cause and fix. `problems` lists every
    (cause, fix) the gate found (the first is `cause`/`fix`): one run shows the admin all of them."""

    def __init__(self, host: str, cause: str, fix: str, problems: list[tuple[str, str]] | None = None):
        self.host, self.cause, self.fix = host, cause, fix
        self.problems = problems or [(cause, fix)]
        if len(self.problems) == 1:
            super().__init__(f"{host}: refused: {cause}. Fix: {fix}")
        else:
            super().__init__(f"{host}: refused: " + " ".join(f"({n}) {c}. Fix: {f}." for n, (c, f)
                                                             in enumerate(self.problems, 1)))

    @classmethod
    def every(cls, host: str, refusals: list["RefusedHost"]) -> "RefusedHost":
        problems = [p for r in refusals for p in r.problems]
        return cls(host, problems[0][0], problems[0][1], problems)


@dataclass(frozen=True)
class HostFacts:
    """The facts the gate reads, as the fact classes in qwen27b.controller.facts return them."""

    os: dict
    kernel: str | None = None
    gpus: list = field(default_factory=list)  # NvidiaGpus
    pci_gpus: list = field(default_factory=list)  # NvidiaPciDevices
    kernel_module: dict = field(default_factory=dict)  # NvidiaKernelModule
    nouveau_loaded: bool = False
    secure_boot: str = "unsupported"
    disk: dict | None = None  # DiskFree(models path)
    memory: dict | None = None  # MemoryInfo
    pythons: dict = field(default_factory=dict)
    xids: list = field(default_factory=list)
    packages: dict = field(default_factory=dict)  # NvidiaCudaPackages
    held: list = field(default_factory=list)
    kernel_headers: dict | None = None  # KernelHeaders; None: not read
    models_on_disk: dict = field(default_factory=dict)  # ModelsOnDisk(models path)
    gpu_problems: list = field(default_factory=list)  # NvidiaGpus' "problem" entries, split off gpus
    topology: dict | None = None  # GpuTopology; None: not read (no driver yet)
    glibc: str | None = None  # GlibcVersion ("2.35"); None: not read
    libstdcxx: str | None = None  # LibstdcxxVersion, the highest GLIBCXX_ ("3.4.30"); None: not read
    driver_build: dict | None = None  # DriverBuild (plan/driverbuild.py); None: not read
    kernels: dict | None = None  # InstalledKernels; None: not read
    occupants: dict | None = None  # Occupants (plan/occupants.py): listeners, GPU processes; None: not read
    wear: dict | None = None  # GpuWear (plan/gpuwear.py): ECC, retired pages, power range; None: not read
    mok_requests: list | None = None  # MokRequests (plan/mokstate.py): keys waiting for enrolment; None: not read
    driver_source: dict | None = None  # DriverSource (plan/driversource.py): apt policy, pins, origins; None: not read
    unit_files: dict | None = None  # UnitFiles (plan/foreignunit.py): qwen27b* unit files, ours or not; None: not read

    def __post_init__(self):
        # NvidiaGpus lists nvidia-smi's failure lines beside the GPUs; keep `gpus` GPUs only.
        problems = [g for g in self.gpus if "problem" in g]
        if problems:
            object.__setattr__(self, "gpus", [g for g in self.gpus if "problem" not in g])
            object.__setattr__(self, "gpu_problems", list(self.gpu_problems) + problems)


@dataclass(frozen=True)
class Choice:
    """One install decision, shown in the plan with why."""

    what: str
    value: str
    reason: str
    action: str  # "install", "keep", "skip", "pending"


@dataclass(frozen=True)
class DriverPlan:
    """What happens to the NVIDIA driver, and why: keep the loaded one, or install `package`
    (purging `remove` in the same apt transaction) and reboot once."""

    action: str  # "keep" | "install" | "replace"
    package: str  # the stack's package (installed or not)
    reason: str
    remove: tuple[str, ...] = ()  # installed packages apt must purge for `package` to load
    hold: tuple[str, ...] = ()  # the driver packages to apt-mark hold (none for a .run install)
    from_apt: bool = True  # False: a loaded driver no package owns (.run installer, vendor image)
    headers: str | None = None  # linux-headers-<kernel> to install, None when it need not or cannot be

    kept: str | None = None  # for "keep": what is kept, as the plan shows it
    release_holds: tuple[str, ...] = ()  # held packages (apt-mark showhold) the replacement purges
    boot_headers: tuple[str, ...] = ()  # linux-headers of the kernel the reboot boots (driverbuild.boot_kernels)
    console_reboot: str | None = None  # the reboot is for a MOK key enrolment: the note to reboot at the console

    @property
    def header_packages(self) -> tuple[str, ...]:
        """Every linux-headers package installed before the driver: DKMS builds for each kernel with headers."""
        return ((self.headers,) if self.headers else ()) + self.boot_headers

    @property
    def reboot(self) -> bool:
        return self.action != "keep"


@dataclass
class Decision:
    host: str
    stack: ResolvedStack
    settings: Settings
    gpus: list[Gpu]
    serve: ServePlan
    choices: list[Choice]
    warnings: list[str]
    model_path: str
    draft_path: str | None
    facts: HostFacts
    os_row: dict  # the stack's os_support row (CUDA repo path, notes)
    driver: DriverPlan | None = None  # None: the profile uses no GPU driver
    group: object | None = None  # multinode.NodeGroup: this host is one stage of a serving group
    copies: tuple = ()  # ((copykeys.Instance, Decision), ...): several copies on this machine (qwen27b_instances)
    driver_first: bool = False  # GPU memory unknown until the driver answers: this run installs the driver only
    power: object | None = None  # gpuwear.PowerPlan: what qwen27b-gpu-power.service sets at boot; None: no driver
    entry: object | None = None  # catalog.Chosen: the engine profile catalog's entry planned and why

    @property
    def profile(self) -> str:
        return self.stack.profile_name

    def choice(self, what: str) -> Choice:
        return next(c for c in self.choices if c.what == what)
