"""The compatibility gate: host facts + stack + host data -> a Decision, or a RefusedHost.

Pure: it runs on facts already read, before any command that changes the host. A refusal
names the host, the cause and the fix; warnings print but do not stop the deploy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checkpoint import CheckpointError, ModelShape, load_shape
from .hostdata import Settings
from .planner import GiB, Gpu, PlanRefused, ServeInputs, ServePlan, _divides, plan_serve
from .stack import (ResolvedStack, StackError, cc_tuple, checkpoint_metadata_dir, gpu_spec,
                    os_support, profile_for_compute_capability, resolve_stack)

SEED_XID79_ADVICE = (
    "Xid 79 means a GPU fell off the PCIe bus. The seed's advice for V100s in workstation boards "
    "(e.g. X99): enable Above 4G Decoding and set the PCIe link speed in the BIOS, check the slot "
    "seating and that the board/PSU delivers enough PCIe power, and keep the driver matched to the kernel"
)
XID_MEANING = {
    48: "double-bit ECC error",
    63: "ECC page retirement / row remap event",
    64: "ECC page retirement / row remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


class RefusedHost(Exception):
    """This host must not be touched; str() names host, cause and fix."""

    def __init__(self, host: str, cause: str, fix: str):
        self.host, self.cause, self.fix = host, cause, fix
        super().__init__(f"{host}: refused: {cause}. Fix: {fix}")


@dataclass(frozen=True)
class HostFacts:
    """The facts the gate reads, as the fact classes in qwen27b.facts return them."""

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
    gpu_problems: list = field(default_factory=list)  # NvidiaGpus' "problem" entries, split off gpus

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

    @property
    def profile(self) -> str:
        return self.stack.profile_name

    def choice(self, what: str) -> Choice:
        return next(c for c in self.choices if c.what == what)


def _os_check(host: str, facts: HostFacts, stack: dict, cpu: bool) -> dict:
    os_id, version = facts.os.get("id"), facts.os.get("version_id")
    row = os_support(stack, os_id, version)
    supported = ", ".join(f"{r['id'].capitalize()} {r['version_id']}" + (" (CPU smoke only)" if r.get("cpu_only") else "")
                          for r in stack["os_support"])
    name = facts.os.get("pretty_name") or f"{os_id} {version}"
    if row is None:
        raise RefusedHost(host, f"unsupported OS {name}", f"reinstall with one of: {supported}")
    if row.get("cpu_only") and not cpu:
        raise RefusedHost(host, f"{name} is supported for the CPU smoke profile only",
                          "use Ubuntu 20.04/22.04/24.04 for GPUs, or set qwen27b_profile='cpu-smoke'")
    return row


BOARD_FIX = ("check the board: reseat the card and its power cables, try another slot, update the BIOS; "
             "if it persists, RMA the card")


def _nvidia_smi_problems(host: str, facts: HostFacts) -> None:
    """nvidia-smi failed: the GPU facts cannot be trusted, so nothing is planned on them."""
    for p in facts.gpu_problems:
        if p["problem"] == "driver-library-mismatch":
            loaded = facts.kernel_module.get("version")
            raise RefusedHost(host, f"nvidia-smi: {p['message']}: the NVIDIA driver was upgraded without a reboot"
                              + (f" (kernel module {loaded} still loaded)" if loaded else "")
                              + ", so no GPU can be used", "reboot to load the new driver, then re-run the deploy (a deploy "
                              "with qwen27b_skip_reboot leaves the host like this until it is rebooted)")
        if p["problem"] == "nvml-init":
            raise RefusedHost(host, f"nvidia-smi: {p['message']}",
                              "check `dmesg | grep -i nvrm` and that the loaded nvidia module matches the installed "
                              "driver; reinstall the driver or reboot, then re-run the deploy")
    lost = [p for p in facts.gpu_problems if p["problem"] == "device-handle"]
    if lost:
        xid79 = any(x["xid"] == 79 for x in facts.xids)
        raise RefusedHost(host, f"nvidia-smi cannot reach {len(lost)} GPU(s): " + "; ".join(p["message"] for p in lost)
                          + (" (Xid 79 in the kernel log: fallen off the bus)" if xid79 else ""),
                          "a reboot may bring it back for a while; " + BOARD_FIX
                          + (f". {SEED_XID79_ADVICE}" if xid79 else ""))


def host_gpus(host: str, facts: HostFacts, stack: dict) -> list[Gpu]:
    """GPUs from nvidia-smi when the driver answers, else from lspci + the stack's GPU table."""
    if facts.gpus:
        return [Gpu(g["index"], g["name"], int(g["memory_mib"]), g["compute_capability"]) for g in facts.gpus]
    gpus = []
    for index, dev in enumerate(facts.pci_gpus):
        spec = gpu_spec(stack, pci_id=dev["device_id"])
        if spec is None:
            raise RefusedHost(host, f"unknown NVIDIA GPU 10de:{dev['device_id']} ({dev.get('description', '')}) at {dev['slot']}",
                              "add it to the gpus table in qwen27b/stack.yaml (PCI id, memory, compute capability)")
        gpus.append(Gpu(index, spec["names"][0], spec["memory_mib"], spec["compute_capability"]))
    return gpus


def _select_gpus(host: str, gpus: list[Gpu], settings: Settings) -> list[Gpu]:
    if settings.gpu_indices is None:
        return gpus
    present = {g.index for g in gpus}
    missing = [i for i in settings.gpu_indices if i not in present]
    if missing:
        raise RefusedHost(host, f"qwen27b_gpu_indices lists GPU(s) {missing} but the host has {sorted(present)}",
                          "list only GPUs the host has")
    return [g for g in gpus if g.index in settings.gpu_indices]


def _check_tp(host: str, gpus: list[Gpu], settings: Settings, target: ModelShape | None = None) -> None:
    """A TP size from host data must fit the GPUs this host has, and (once read) the model's heads;
    hostdata already checked it is a positive int."""
    pinned = settings.tensor_parallel_size or (settings.serve_flags or {}).get("--tensor-parallel-size")
    if not gpus or pinned is None:
        return
    tp, n = int(pinned), len(gpus)
    key = "qwen27b_tensor_parallel_size" if settings.tensor_parallel_size else "qwen27b_serve_flags --tensor-parallel-size"
    scope = "in qwen27b_gpu_indices" if settings.gpu_indices is not None else "on this host"
    if tp > n:
        raise RefusedHost(host, f"{key} {tp} is more than the {n} GPU(s) {scope}",
                          f"use a TP size of at most {n}, or leave it out (the planner picks one)")
    if n % tp:
        fits = " or ".join(str(d) for d in range(1, n + 1) if n % d == 0)
        raise RefusedHost(host, f"{key} {tp} does not divide the {n} GPUs {scope} (vLLM would leave GPUs idle)",
                          f"use a TP size of {fits}, or select a multiple of {tp} GPUs with qwen27b_gpu_indices")
    if target is not None and not _divides(tp, target):
        fits = " or ".join(str(d) for d in range(1, n + 1) if n % d == 0 and _divides(d, target))
        raise RefusedHost(host, f"{key} {tp} does not divide the model's {target.num_attention_heads} attention / "
                          f"{target.num_kv_heads} KV heads", f"use a TP size of {fits}, or leave it out")


def _choose_profile(host: str, gpus: list[Gpu], settings: Settings, stack: dict) -> str:
    if settings.profile == "cpu-smoke":
        return "cpu-smoke"
    if not gpus:
        raise RefusedHost(host, "no NVIDIA GPU found (nvidia-smi and lspci -d 10de: list none)",
                          "check the card is seated, powered and shown by lspci; or set qwen27b_profile='cpu-smoke' to "
                          "check the pipeline without GPUs")
    ccs = sorted({g.compute_capability for g in gpus}, key=cc_tuple)
    if len(ccs) > 1:
        raise RefusedHost(host, f"GPUs of different generations ({', '.join(ccs)}) in one TP group",
                          "select one generation with qwen27b_gpu_indices")
    cc = ccs[0]
    auto = profile_for_compute_capability(stack, cc)
    if settings.profile is None:
        if auto is None:
            raise RefusedHost(host, f"no validated stack for compute capability {cc} ({gpus[0].name})",
                              "add a profile for it in qwen27b/stack.yaml")
        return auto
    bounds = stack["profiles"].get(settings.profile, {}).get("compute_capability")
    if bounds and not cc_tuple(bounds["min"]) <= cc_tuple(cc) <= cc_tuple(bounds["max"]):
        hint = f"remove qwen27b_profile (the {auto} profile fits this GPU)" if auto else "remove qwen27b_profile"
        raise RefusedHost(host, f"qwen27b_profile '{settings.profile}' is for compute capability "
                          f"{bounds['min']}-{bounds['max']}, this host's {gpus[0].name} is {cc}", hint)
    return settings.profile


def _generation_rules(host: str, rs: ResolvedStack, gpus: list[Gpu], facts: HostFacts) -> None:
    """The V100 traps, as data from the stack: -open driver, CUDA 13, upstream vLLM/NVFP4 on sm_70."""
    p = rs.profile
    if not gpus:
        return
    cc = cc_tuple(gpus[0].compute_capability)
    drv = p["driver"]
    open_requested = "-open" in drv["package"]
    open_loaded = facts.kernel_module.get("flavor") == "open"
    if not drv["open_modules_supported"] and (open_requested or open_loaded):
        what = f"driver package {drv['package']}" if open_requested else "the loaded open NVIDIA kernel module"
        raise RefusedHost(host, f"{what} on {gpus[0].name}: {rs.source_text('open-gsp')}",
                          f"use the proprietary {drv['package'].replace('-open', '')}"
                          + ("; purge the nvidia-*-open packages first" if open_loaded else ""))
    cuda = p["cuda"]
    if cuda and int(str(cuda["toolkit"]).split(".")[0]) > cuda["max_major"]:
        raise RefusedHost(host, f"CUDA {cuda['toolkit']} on {gpus[0].name}: {rs.source_text('cuda13-volta')}",
                          f"use CUDA {cuda['max_major']}.x (stack default 12.8)")
    vllm, build = p["vllm"], rs.build
    if build.get("min_compute_capability") and cc < cc_tuple(build["min_compute_capability"]):
        raise RefusedHost(host, f"vLLM build '{vllm['build']}' {vllm['version']} has no kernels for compute capability "
                          f"{gpus[0].compute_capability}: {rs.source_text(build['source'])}",
                          "use the sm70 profile's 1Cat-vLLM build (remove the vllm override / qwen27b_profile)")
    if (rs.model.get("format") == "nvfp4" and build.get("nvfp4_min_compute_capability")
            and cc < cc_tuple(build["nvfp4_min_compute_capability"])):
        raise RefusedHost(host, f"NVFP4 weights need compute capability {build['nvfp4_min_compute_capability']}+ with build "
                          f"'{vllm['build']}': {rs.source_text('vllm-nvfp4-min75')}",
                          "use the sm70 profile's 1Cat-vLLM build, which dequantizes NVFP4 on V100")


def _warnings(facts: HostFacts, rs: ResolvedStack, settings: Settings, os_row: dict) -> list[str]:
    out = []
    for g in facts.gpus:
        wc, wm = g.get("pcie_width_current"), g.get("pcie_width_max")
        gc, gm = g.get("pcie_gen_current"), g.get("pcie_gen_max")
        if wc and wm and wc < wm:
            out.append(f"GPU {g['index']} PCIe link degraded: x{wc} of x{wm} (gen {gc} of {gm}); reseat the card or "
                       "check the slot/riser; loads and TP all-reduce will be slower")
        elif gc and gm and gc < gm:
            out.append(f"GPU {g['index']} PCIe gen {gc} of {gm} (may be idle power saving; check again under load)")
    if settings.profile != "cpu-smoke":
        def slot(bus_id: str | None) -> str:  # nvidia-smi pads the PCI domain to 8 digits in one place, 4 in another
            return str(bus_id or "").lower().split(":", 1)[-1]
        index = {slot(g.get("bus_id")): g["index"] for g in facts.gpus}
        for p in facts.gpu_problems:
            if p["problem"] == "inforom":
                which = index.get(slot(p["bus_id"]))
                out.append(f"GPU {which if which is not None else '?'} ({p['bus_id']}) infoROM is corrupted: nvidia-smi "
                           "still lists it, but the ECC and page-retirement records it keeps may be lost; "
                           + BOARD_FIX.replace("check the board: ", "check the board / ", 1))
    by_xid: dict[int, int] = {}
    for x in facts.xids:
        by_xid[x["xid"]] = by_xid.get(x["xid"], 0) + 1
    for xid, count in sorted(by_xid.items()):
        meaning = XID_MEANING.get(xid, "see NVIDIA's Xid catalog")
        line = f"Xid {xid} ({meaning}) seen {count}x in the kernel log in the last 7 days"
        if xid == 79:
            line += f". {SEED_XID79_ADVICE}"
        out.append(line)
    if facts.nouveau_loaded and rs.profile.get("driver"):
        out.append("nouveau is loaded: the nvidia role blacklists it and rebuilds the initramfs (a reboot follows)")
    for what, entry in (("model", rs.model), ("draft", rs.draft)):
        if entry and entry.get("revision") == "main":
            out.append(f"{what} {entry['id']} follows the moving branch 'main': pin a commit once validated "
                       f"(qwen27b_stack_overrides {{'{what}_revision': '<commit>'}})")
    vllm = rs.profile["vllm"]
    if vllm.get("url") and not vllm.get("sha256"):
        out.append(f"{vllm['filename']} has no sha256 in the stack file: the first download will be recorded, "
                   "not verified; pin the hash (stack key vllm.sha256)")
    cuda = rs.profile.get("cuda") or {}
    if cuda.get("needed_by_vllm") and not os_row.get("cuda_keyring_sha256"):
        out.append(f"{cuda['keyring_deb']} for {os_row['cuda_repo']} has no sha256 in the stack file: it is downloaded "
                   "unverified; pin it (stack key os_support[].cuda_keyring_sha256)")
    return out


def _choices(facts: HostFacts, rs: ResolvedStack, settings: Settings) -> list[Choice]:
    p, out = rs.profile, []
    drv = p.get("driver")
    if drv:
        installed = facts.packages.get(drv["package"])
        loaded = facts.kernel_module.get("version")
        if installed and loaded:
            out.append(Choice("driver", drv["package"], f"installed {installed}, module {loaded} loaded "
                              + rs.cite(drv["source"]), "keep"))
        else:
            reboot = "reboot pending (qwen27b_skip_reboot)" if settings.skip_reboot else "then reboot"
            out.append(Choice("driver", drv["package"], f"R{drv['branch']}, proprietary kernel module; {reboot} {rs.cite(drv['source'])}", "install"))
    cuda = p.get("cuda")
    if cuda:
        if cuda.get("needed_by_vllm"):
            action = "keep" if cuda["package"] in facts.packages else "install"
            out.append(Choice("cuda", cuda["package"], rs.cite(cuda["source"]), action))
        else:
            out.append(Choice("cuda", f"{cuda['package']} (not installed)",
                              f"the {p['vllm']['build']} vLLM build ships its CUDA {cuda['toolkit']} runtime in its wheels and "
                              f"needs no compiler; a toolkit, if added, must stay <= {cuda['max_major']}.x "
                              f"{rs.cite(cuda['source'])}", "skip"))
    py = p["python"]
    have = facts.pythons.get(py["version"])
    if have:
        out.append(Choice("python", py["version"], f"present at {have}", "keep"))
    elif py.get("route") == "system":
        out.append(Choice("python", py["version"], "the OS's own python3 (CPU smoke profile)", "install"))
    else:
        out.append(Choice("python", py["version"], f"the OS ships {', '.join(sorted(facts.pythons)) or 'none'}; uv's "
                          f"managed Python from the controller cache {rs.cite(py['source'])}", "install"))
    vllm = p["vllm"]
    out.append(Choice("vllm", f"{vllm['dist']}=={vllm['version']}",
                      f"build '{vllm['build']}' into release {rs.stack_hash} {rs.cite(vllm['source'])}", "install"))
    torch = p["torch"]
    if torch.get("index_url") or torch.get("requirement"):
        out.append(Choice("torch", torch.get("requirement") or "from index", f"{torch.get('index_url') or 'wheelhouse'}"
                          + (f", must list {torch['required_arch']}" if torch.get("required_arch") else "")
                          + f" {rs.cite(torch['source'])}", "install"))
    out.append(Choice("model", f"{rs.model['id']}@{rs.model['revision']}", f"format {rs.model['format']}", "install"))
    if rs.draft and settings.speculative:
        out.append(Choice("draft", f"{rs.draft['id']}@{rs.draft['revision']}",
                          f"{rs.draft['speculative']['method']}, {rs.draft['speculative']['num_speculative_tokens']} "
                          f"speculative tokens, kept {rs.draft['format']} {rs.cite('dflash-dense-head')}", "install"))
    return out


def decide(host: str, facts: HostFacts, stack: dict, settings: Settings, *, bind_address: str | None = None) -> Decision:
    """The whole gate for one host. Raises RefusedHost; never touches the host."""
    cpu = settings.profile == "cpu-smoke"
    os_row = _os_check(host, facts, stack, cpu)
    if not cpu:
        _nvidia_smi_problems(host, facts)
    all_gpus = [] if cpu else host_gpus(host, facts, stack)
    gpus = _select_gpus(host, all_gpus, settings)
    _check_tp(host, gpus, settings)
    profile_name = _choose_profile(host, gpus, settings, stack)
    try:
        rs = resolve_stack(stack, profile_name, settings.stack_overrides)
    except StackError as error:
        raise RefusedHost(host, f"qwen27b_stack_overrides: {error}", "use keys that exist in qwen27b/stack.yaml") from None
    _generation_rules(host, rs, gpus, facts)
    if facts.secure_boot == "enabled" and rs.profile.get("driver") and not settings.mok_key_path:
        raise RefusedHost(host, "secure boot is on: the NVIDIA kernel module must be signed with an enrolled MOK key",
                          "set qwen27b_mok_key_path to your MOK key (and enroll it with mokutil), or disable secure boot")

    try:
        target = load_shape(checkpoint_metadata_dir(rs.model))
        draft = load_shape(checkpoint_metadata_dir(rs.draft)) if rs.draft and settings.speculative else None
    except CheckpointError as error:
        raise RefusedHost(host, f"checkpoint metadata: {error}", "restore the checkpoint's config.json / index") from None

    _check_tp(host, gpus, settings, target)
    if draft is not None and draft.quant_method:
        raise RefusedHost(host, f"the DFlash2 draft {rs.draft['id']} is quantized ({draft.quant_method}): "
                          f"{rs.source_text('dflash-dense-head')}", "use the fp16/bf16 draft checkpoint")
    if draft is not None and target.lm_head_quantized:
        raise RefusedHost(host, f"{rs.model['id']} quantizes its lm_head, which the DFlash2 draft shares: "
                          f"{rs.source_text('dflash-dense-head')}",
                          "choose a checkpoint with a dense lm_head ('...NVFP4-BF16-LMHead' style), or set "
                          "qwen27b_speculative=False")
    paths = rs.paths
    model_path = paths["current_model"]
    draft_path = f"{paths['models']}/draft" if draft else None
    ram = facts.memory.get("available_bytes") if facts.memory else None
    pins = dict(settings.serve_flags or {})
    if settings.tensor_parallel_size:
        pins.setdefault("--tensor-parallel-size", settings.tensor_parallel_size)
    if settings.bind_address:
        bind, bind_reason = settings.bind_address, "qwen27b_bind_address"
    elif bind_address:
        bind, bind_reason = bind_address, "the host's lab address (ssh_hostname), not every interface"
    else:
        bind, bind_reason = "127.0.0.1", "no lab address in host data: loopback only; set qwen27b_bind_address to serve the lab"
    try:
        serve = plan_serve(ServeInputs(
            stack=rs, gpus=gpus, target=target, draft=draft, model_path=model_path, draft_path=draft_path,
            served_name=settings.served_model_name or rs.model["served_name"],
            bind_address=bind, bind_reason=bind_reason, port=settings.port,
            speculative=settings.speculative, prefix_caching=settings.prefix_caching,
            pins=pins, ram_bytes=ram, route_guard=bool(settings.api_key_file)))
    except PlanRefused as refused:
        raise RefusedHost(host, refused.cause, refused.fix) from None

    if facts.disk is not None:
        need = target.weight_bytes + (draft.weight_bytes if draft else 0) + settings.min_free_disk_gib * GiB
        if facts.disk["free_bytes"] < need:
            raise RefusedHost(host, f"too little disk on {facts.disk.get('mount')} for {paths['models']}: "
                              f"{facts.disk['free_bytes'] / GiB:.1f} GiB free, {need / GiB:.1f} GiB needed "
                              f"(weights + draft + {settings.min_free_disk_gib} GiB headroom)",
                              "free space, mount a larger disk at the models path, or lower qwen27b_min_free_disk_gib")
    return Decision(host=host, stack=rs, settings=settings, gpus=gpus, serve=serve,
                    choices=_choices(facts, rs, settings), warnings=_warnings(facts, rs, settings, os_row),
                    model_path=model_path, draft_path=draft_path, facts=facts, os_row=os_row)
