"""The compatibility gate: host facts + stack + host data -> a Decision, or a RefusedHost.

Pure: it runs on facts already read, before any command that changes the host. A refusal
names the host, the cause and the fix; warnings print but do not stop the deploy.

decide() and the checks only it makes are here; its parts are cut at their seams (issue 50
item 3): gatetypes (what it hands on), driverplan (the driver), installs (the install rows,
binary needs, fetches), specchoice (speculation, the dropped draft), wearchoice (worn GPUs, power).
"""

from __future__ import annotations

from dataclasses import replace

from qwen27b.onhost.contract import xid_meaning
from qwen27b.plan.gpustate import BOARD_FIX, SEED_XID79_ADVICE, gpu_troubles
from qwen27b.plan.gpusizes import unequal_sizes
from qwen27b.plan import filepins, gpuwear
from qwen27b.plan.driverbuild import boot_kernels
from qwen27b.plan.driverplan import SECURE_BOOT_FIX, _boot_headers, _driver_plan, _failed_build, _with_headers
from qwen27b.plan.foreignunit import foreign_units
from qwen27b.plan.occupants import Bound, occupied
from qwen27b.plan.checkpoint import CheckpointError, ModelShape, load_shape
from qwen27b.plan.settings import NODE_EXPORTER_PORT, NODE_EXPORTER_UNIT, Settings
from qwen27b.plan.fanout import SEED_PORT
from qwen27b.plan.modelsdir import DISK_FIX, models_reason
from qwen27b.plan.installs import _choices, binary_needs_check, python_row, unpinned
from qwen27b.plan.specchoice import _agent_parsers, _plan_or_drop_draft, _speculation
from qwen27b.plan.wearchoice import _leave_out_worn, _power_choices
from qwen27b.plan.gatetypes import Decision, DriverPlan, HostFacts, RefusedHost
from qwen27b.onhost.contract import HEALTH_HTTP_SOCKET, SEED_UNIT
from qwen27b.plan import catalog, engine
from qwen27b.plan.planner import GiB, Gpu, PlanRefused, ServeInputs, ServePlan, _divides
from qwen27b.plan.stack import (NoModelScopeId, ResolvedStack, StackError, cc_tuple, checkpoint_metadata_dir, gpu_spec,
                    os_support, profile_for_compute_capability, resolve_stack, revision_dir_name)


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


def _nvidia_smi_problems(host: str, facts: HostFacts) -> None:
    """nvidia-smi failed: the GPU facts cannot be trusted, so nothing is planned on them (gpustate's
    reading, which doctor shares)."""
    for trouble in gpu_troubles(facts):
        if trouble.blocks:
            raise RefusedHost(host, trouble.cause, trouble.fix)


def host_gpus(host: str, facts: HostFacts, stack: dict) -> list[Gpu]:
    """GPUs from nvidia-smi when the driver answers, else from lspci + the stack's GPU table."""
    if facts.gpus:
        return [Gpu(g["index"], g["name"], int(g["memory_mib"]), g["compute_capability"]) for g in facts.gpus]
    gpus = []
    for index, dev in enumerate(facts.pci_gpus):
        spec = gpu_spec(stack, pci_id=dev["device_id"])
        if spec is None:
            raise RefusedHost(host, f"unknown NVIDIA GPU 10de:{dev['device_id']} ({dev.get('description', '')}) at {dev['slot']}",
                              "add it to the gpus table in qwen27b/plan/stack.yaml (PCI id, memory, compute capability)")
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
                              "add a profile for it in qwen27b/plan/stack.yaml")
        return auto
    bounds = stack["profiles"].get(settings.profile, {}).get("compute_capability")
    if bounds and not cc_tuple(bounds["min"]) <= cc_tuple(cc) <= cc_tuple(bounds["max"]):
        hint = f"remove qwen27b_profile (the {auto} profile fits this GPU)" if auto else "remove qwen27b_profile"
        raise RefusedHost(host, f"qwen27b_profile '{settings.profile}' is for compute capability "
                          f"{bounds['min']}-{bounds['max']}, this host's {gpus[0].name} is {cc}", hint)
    return settings.profile


def _catalog_entry(host: str, stack: dict, profile_name: str, settings: Settings, gpus: list[Gpu]):
    """(catalog.Chosen, the stack with that entry's profile): qwen27b_engine_profile or the default."""
    gpu = gpus[0] if gpus else None
    try:
        chosen = catalog.choose(stack, profile_name, settings.engine_profile, gpu and gpu.name,
                                gpu and gpu.compute_capability, settings.model)
        return chosen, catalog.apply(stack, chosen.name)
    except catalog.CatalogError as error:
        raise RefusedHost(host, error.problem, error.fix) from None


def _generation_rules(host: str, rs: ResolvedStack, gpus: list[Gpu], facts: HostFacts) -> None:
    """The V100 traps, as data from the stack: -open driver, CUDA 13, upstream vLLM/NVFP4 on sm_70."""
    p = rs.profile
    if not gpus:
        return
    cc = cc_tuple(gpus[0].compute_capability)
    drv = p["driver"]
    if not drv["open_modules_supported"] and "-open" in drv["package"]:
        # an -open module found on the host is replaced by _driver_plan; this is the stack asking for one
        raise RefusedHost(host, f"driver package {drv['package']} on {gpus[0].name}: {rs.source_text('open-gsp')}",
                          f"use the proprietary {drv['package'].replace('-open', '')}")
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


def _mixed_fp8_rule(host: str, rs: ResolvedStack, gpus: list[Gpu], target: ModelShape, settings: Settings) -> None:
    """A checkpoint with FP8 layers beside NVFP4 (ModelOpt mixed) on sm_70 needs a build with Volta FP8
    kernels (vllm_builds[].volta_fp8_kernels): stock 1Cat gates those layers at capability 89."""
    mixed = rs.model.get("mixed_fp8") or str(target.quant_algo or "").upper() == "MIXED_PRECISION"
    if not (mixed and gpus and cc_tuple(gpus[0].compute_capability) < (7, 5)) or rs.build.get("volta_fp8_kernels"):
        return
    chosen = f"qwen27b_model {settings.model}" if settings.model else f"the {rs.profile_name} profile's model"
    raise RefusedHost(host, f"{rs.model['id']} ({chosen}) is a mixed NVFP4+FP8 checkpoint and vLLM build "
                      f"'{rs.profile['vllm']['build']}' {rs.profile['vllm']['version']} has no Volta kernels for its FP8 "
                      f"layers ({gpus[0].name}, compute capability {gpus[0].compute_capability}): "
                      f"{rs.source_text('1cat-modelopt-min89')}",
                      "remove qwen27b_model (the sm70 default is the full-NVFP4 checkpoint V100 owners run), or set "
                      "qwen27b_model to another checkpoint of the stack's models table")


def _warnings(facts: HostFacts, rs: ResolvedStack, settings: Settings, os_row: dict,
              driver: DriverPlan | None = None, draft_used: bool = True, stack_wear: dict | None = None) -> list[str]:
    out = []
    boot = boot_kernels(facts.kernels, facts.kernel)
    if driver is not None and driver.action == "keep" and boot is not None and boot.headers:
        out.append(f"{boot.reason}, without {', '.join(boot.headers)}: DKMS cannot build the kept driver's module "
                   f"for it, so the next reboot comes up without a driver; install {' '.join(boot.headers)} first")
    if driver is not None and driver.action == "keep" and facts.kernel and driver.headers is None:
        out.append(f"linux-headers-{facts.kernel} is in no configured apt archive: the kept driver runs, but a DKMS "
                   "rebuild (a new kernel, a driver update) would fail on this kernel")
    far = {w.index for w in gpuwear.assess(facts, stack_wear, lambda ids: "") if "PCIe link" in w.cause} if stack_wear else set()
    for g in facts.gpus:
        if g["index"] in far:
            continue  # gpuwear's finding says it, with the fix
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
    by_xid: dict[int, dict[str, int]] = {}
    for x in facts.xids:
        where = gpuwear.gpu_name(facts, x.get("pci"))
        by_xid.setdefault(x["xid"], {})[where] = by_xid.get(x["xid"], {}).get(where, 0) + 1
    for xid, on in sorted(by_xid.items()):
        meaning = xid_meaning(xid)
        line = (f"Xid {xid} ({meaning}) seen {sum(on.values())}x in the kernel log in the last 7 days, on "
                + ", ".join(f"{where} {n}x" for where, n in on.items()))
        if xid == 79:
            line += f". {SEED_XID79_ADVICE}"
        out.append(line)
    if facts.nouveau_loaded and rs.profile.get("driver"):
        out.append("nouveau is loaded: the nvidia role blacklists it and rebuilds the initramfs ("
                   + ("it unloads at the console reboot the MOK key enrolment needs)" if driver is not None
                      and driver.console_reboot else "a reboot follows)"))
    for what, entry in (("model", rs.model), ("draft", rs.draft if draft_used else None)):
        if entry and entry.get("revision") == "main":
            out.append(f"{what} {entry['id']} follows the moving branch 'main': pin a commit once validated "
                       f"(qwen27b_stack_overrides {{'{what}_revision': '<commit>'}})")
        if entry:
            out.extend(filepins.plan_warnings(what, entry, filepins.listed_files(checkpoint_metadata_dir(entry))))
    vllm = rs.profile["vllm"]
    if vllm.get("url") and not vllm.get("sha256"):
        out.append(f"{vllm['filename']} has no sha256 in the stack file: the first download will be recorded, "
                   "not verified; pin the hash (stack key vllm.sha256)")
    cuda = rs.profile.get("cuda") or {}
    if cuda.get("needed_by_vllm") and not os_row.get("cuda_keyring_sha256"):
        out.append(f"{cuda['keyring_deb']} for {os_row['cuda_repo']} has no sha256 in the stack file: it is downloaded "
                   "unverified; pin it (stack key os_support[].cuda_keyring_sha256)")
    return out


def _larger_gpus_alone(inp: ServeInputs, settings: Settings) -> str | None:
    """Mixed cards (32 GB + 16 GB V100s): a TP group is sized by its smallest GPU, so the larger cards
    alone may fit where all of them together do not. Then the fix names them as qwen27b_gpu_indices."""
    sizes = {g.memory_mib for g in inp.gpus}
    if len(sizes) < 2 or "--tensor-parallel-size" in (inp.pins or {}):
        return None
    larger = [g for g in inp.gpus if g.memory_mib == max(sizes)]
    try:
        plan = _plan_or_drop_draft(replace(inp, gpus=larger), settings)
    except PlanRefused:
        return None
    return (f"serve on the {len(larger)} GPU(s) with {max(sizes)} MiB alone (they fit: TP "
            f"{plan.value('--tensor-parallel-size')}, --max-model-len {plan.value('--max-model-len')}): "
            f"qwen27b_gpu_indices: {[g.index for g in larger]}")


def _unknown_memory(inp: ServeInputs, facts: HostFacts, stack: dict, driver: DriverPlan | None,
                    refused: PlanRefused, settings: Settings) -> tuple[ServePlan, str] | None:
    """A Volta board whose PCI name says no memory size (Tesla PG500-216) is counted at the smallest
    V100 until a driver answers: refused for memory there, the driver that would show its real size
    is never installed. Then this run installs the driver only; the serving is shown at the largest
    V100 size, provisional, and planned on nvidia-smi's memory by the next deploy."""
    if facts.gpus or driver is None or driver.action == "keep" or not inp.gpus:
        return None
    specs = [gpu_spec(stack, pci_id=facts.pci_gpus[g.index]["device_id"]) for g in inp.gpus
             if g.index < len(facts.pci_gpus)]
    if len(specs) != len(inp.gpus) or any(s is None or s.get("memory_known", True) for s in specs):
        return None
    largest = max(stack["volta_pci"]["reported_memory_mib"].values())
    try:
        plan = _plan_or_drop_draft(replace(inp, gpus=[replace(g, memory_mib=largest) for g in inp.gpus]), settings)
    except PlanRefused:
        return None
    return plan, (f"the memory of {inp.gpus[0].name} is unknown until the driver answers (its PCI name says no size; "
                  f"counted at {inp.gpus[0].memory_mib} MiB: {refused.cause}): this run installs the driver and "
                  f"reboots only; the serving shown is provisional, at {largest} MiB per GPU; re-run the deploy "
                  f"after the reboot to plan it on the memory nvidia-smi reports {_volta_cite(stack)}")


def _volta_cite(stack: dict) -> str:
    return "[" + ", ".join(stack["volta_pci"]["source"]) + "]"


def _check_disk(host: str, facts: HostFacts, rs: ResolvedStack, settings: Settings, wanted: list) -> str | None:
    """Room for what is not on disk yet, plus headroom: a verified revision needs nothing, a partial
    download only its missing bytes (ModelsOnDisk), so a converged host is never refused for room
    it does not need."""
    missing, have = 0, []
    for entry, shape in wanted:
        on_disk = facts.models_on_disk.get(revision_dir_name(entry))
        if on_disk and on_disk["verified"]:
            have.append(f"{entry['id']} verified")
            continue
        present = on_disk["bytes"] if on_disk else 0
        missing += max(0, shape.weight_bytes - present)
        if present:
            have.append(f"{entry['id']} {present / GiB:.1f} GiB partial")
    need = missing + settings.min_free_disk_gib * GiB
    free = facts.disk["free_bytes"]
    if free < need and not missing:
        return (f"only {free / GiB:.1f} GiB free on {facts.disk.get('mount')}: nothing to fetch ({', '.join(have)}), "
                f"but vLLM's caches under {rs.layout.cache} and the logs grow there; keep "
                f"{settings.min_free_disk_gib} GiB free (qwen27b_min_free_disk_gib)")
    if free < need:
        raise RefusedHost(host, f"too little disk on {facts.disk.get('mount')} for {rs.layout.models}: {free / GiB:.1f} GiB "
                          f"free, {need / GiB:.1f} GiB needed ({missing / GiB:.1f} GiB of weights still to fetch + "
                          f"{settings.min_free_disk_gib} GiB headroom"
                          + (f"; already on disk: {', '.join(have)}" if have else "") + ")",
                          f"free space, {DISK_FIX}, or lower qwen27b_min_free_disk_gib")
    return None


def _cite(ids) -> str:
    ids = [ids] if isinstance(ids, str) else list(ids)
    return f"[{', '.join(ids)}]"


def bound_ports(settings: Settings, bind: str) -> list[Bound]:
    """The ports the deploy binds besides vLLM's, for the occupants check: the health endpoint's
    socket on the bind address; node_exporter's on every address; the fan-out seed's on the lab address."""
    out = [Bound(settings.health_port, bind, f"the health endpoint ({HEALTH_HTTP_SOCKET})",
                 "move the endpoint with qwen27b_health_port", frozenset({HEALTH_HTTP_SOCKET}))]
    if settings.node_exporter:
        out.append(Bound(NODE_EXPORTER_PORT, "0.0.0.0", f"node_exporter ({NODE_EXPORTER_UNIT})",
                         "leave qwen27b_node_exporter out", frozenset({NODE_EXPORTER_UNIT})))
    if settings.weights_fanout != "none":
        out.append(Bound(SEED_PORT, bind, f"the weights fan-out's seed server ({SEED_UNIT})",
                         "set qwen27b_weights_fanout: none (every host fetches from the mirror)", frozenset({SEED_UNIT})))
    return out


def decide(host: str, facts: HostFacts, stack: dict, settings: Settings, *, bind_address: str | None = None,
           address_reason: str = "the host's lab address (ssh_hostname), not every interface",
           pipeline=None) -> Decision:
    """The whole gate for one host. Raises RefusedHost; never touches the host. `bind_address`: where
    the controller reaches the host (`address_reason` says how it is known), the bind address unless
    qwen27b_bind_address is set. `pipeline` (multinode.Pipeline): the host is one stage of a serving
    group, planned for its share of layers. One service: serving.decide sends a host with copies to
    instances.py, which runs this once per copy."""
    cpu = settings.profile == "cpu-smoke"
    os_row = _os_check(host, facts, stack, cpu)
    if not cpu:
        _nvidia_smi_problems(host, facts)
    all_gpus = [] if cpu else host_gpus(host, facts, stack)
    gpus = _select_gpus(host, all_gpus, settings)
    wear = [] if cpu else gpuwear.assess(facts, stack["gpu_wear"], _cite)
    gpus = _leave_out_worn(host, gpus, wear, settings)
    left_out = [w for w in wear if w.leave_out]
    _check_tp(host, gpus, settings)
    profile_name = _choose_profile(host, gpus, settings, stack)
    entry, stack = _catalog_entry(host, stack, profile_name, settings, gpus)
    try:
        rs = resolve_stack(stack, profile_name, settings.stack_overrides, model=settings.model,
                           model_source=settings.model_source, models_dir=settings.models_dir)
    except NoModelScopeId as error:
        raise RefusedHost(host, f"qwen27b_model_source: {error}",
                          "use qwen27b_model_source hub (with qwen27b_hf_endpoint for a mirror), mirror or controller, "
                          "or add the checkpoint's ModelScope id to the stack") from None
    except StackError as error:
        raise RefusedHost(host, f"qwen27b_stack_overrides: {error}", "use keys that exist in qwen27b/plan/stack.yaml") from None
    # From here each check is independent: collect every refusal, so one run names them all.
    refusals: list[RefusedHost] = []

    def check(fn, *args):
        try:
            return fn(*args)
        except RefusedHost as refused:
            refusals.append(refused)
            return None

    check(_generation_rules, host, rs, gpus, facts)
    required, by_default = filepins.hash_policy(settings.require_hashes, rs.profile)
    if required:
        refusals.extend(RefusedHost(host, cause, fix) for cause, fix in unpinned(rs, os_row, settings, by_default))
    driver = check(lambda: _boot_headers(_with_headers(host, _driver_plan(host, facts, rs, settings, gpus), facts), facts))
    if gpus:
        check(_failed_build, host, facts, rs)
    if facts.secure_boot == "enabled" and rs.profile.get("driver") and not settings.mok_key_path \
            and not (driver is not None and driver.action == "keep"):
        refusals.append(RefusedHost(host, "Secure Boot is on: the NVIDIA kernel module DKMS builds must be signed "
                                    "with an enrolled MOK key, or it will not load", SECURE_BOOT_FIX))

    try:
        target = load_shape(checkpoint_metadata_dir(rs.model))
    except CheckpointError as error:
        raise RefusedHost.every(host, refusals + [RefusedHost(host, f"checkpoint metadata: {error}",
                                                              "restore the checkpoint's config.json / index")]) from None
    check(_mixed_fp8_rule, host, rs, gpus, target, settings)
    spec = check(_speculation, host, rs, gpus, target, settings)
    agent = check(_agent_parsers, host, rs, settings)
    try:
        draft = load_shape(checkpoint_metadata_dir(rs.draft)) if spec is not None and spec.method == "dflash2" else None
    except CheckpointError as error:
        raise RefusedHost.every(host, refusals + [RefusedHost(host, f"draft checkpoint metadata: {error}",
                                                              "restore the draft's config.json / index")]) from None

    check(_check_tp, host, gpus, settings, target)
    if draft is not None and draft.quant_method:
        refusals.append(RefusedHost(host, f"the DFlash2 draft {rs.draft['id']} is quantized ({draft.quant_method}): "
                                    f"{rs.source_text('dflash-dense-head')}", "use the fp16/bf16 draft checkpoint"))
    model_path = rs.layout.current_model
    draft_path = rs.layout.draft_link if draft else None
    ram = facts.memory.get("available_bytes") if facts.memory else None
    pins = dict(settings.serve_flags or {})
    if settings.tensor_parallel_size:
        pins.setdefault("--tensor-parallel-size", settings.tensor_parallel_size)
    if settings.bind_address:
        bind, bind_reason = settings.bind_address, "qwen27b_bind_address"
    elif bind_address:
        bind, bind_reason = bind_address, address_reason
    else:
        bind, bind_reason = "127.0.0.1", "no lab address in host data: loopback only; set qwen27b_bind_address to serve the lab"
    refusals.extend(RefusedHost(host, cause, fix) for cause, fix in occupied(
        facts.occupants, settings.port, bind, gpus, {g["index"]: g.get("bus_id") for g in facts.gpus},
        also=bound_ports(settings, bind)))
    unit_refusals, take_over = foreign_units(facts.unit_files, settings.take_over_unit)
    refusals.extend(RefusedHost(host, cause, fix) for cause, fix in unit_refusals)
    serve_inputs = ServeInputs(
        stack=rs, gpus=gpus, target=target, draft=draft, model_path=model_path, draft_path=draft_path,
        served_name=settings.served_model_name or rs.model["served_name"],
        bind_address=bind, bind_reason=bind_reason, port=settings.port,
        speculative=spec is not None and spec.on, prefix_caching=settings.prefix_caching,
        pins=pins, ram_bytes=ram, route_guard=bool(settings.api_key_file), topology=facts.topology,
        spec=spec or engine.OFF, agent=agent)
    driver_first, serve = None, None
    try:
        serve = pipeline.plan(serve_inputs) if pipeline is not None else _plan_or_drop_draft(serve_inputs, settings)
    except PlanRefused as refused:
        driver_first = None if pipeline is not None else _unknown_memory(serve_inputs, facts, stack, driver, refused, settings)
        if driver_first is not None:
            serve = driver_first[0]
        else:
            larger = None if pipeline is not None else _larger_gpus_alone(serve_inputs, settings)
            fix = f"{larger}; or {refused.fix}" if larger else refused.fix
            if left_out:  # the worn GPUs' fix is what brings the room back
                refusals.append(RefusedHost(host, "; ".join(f"{w.gpu} should not serve: {w.cause}" for w in left_out)
                                            + f"; the {len(gpus)} GPU(s) left cannot serve: {refused.cause}",
                                            "; ".join(w.fix for w in left_out) + f"; or {fix}"))
            else:
                refusals.append(RefusedHost(host, refused.cause, fix))

    if serve is not None and serve.spec.method != "dflash2":  # the draft did not fit: nothing to fetch for it
        draft, draft_path = None, None
    glibc_warning = check(binary_needs_check, host, facts.glibc, rs)
    disk_warning = f"free disk at {rs.layout.models} not read: the download is not checked against the room for it"
    if facts.disk is not None and facts.disk.get("free_bytes") is not None:
        disk_warning = check(_check_disk, host, facts, rs, settings,
                             [(rs.model, target)] + ([(rs.draft, draft)] if draft else []))
    power = None
    if not cpu and rs.profile.get("driver"):
        power, power_refusals = gpuwear.power_plan(facts, all_gpus, settings.power_limit_w, settings.ecc,
                                                   _cite(stack["gpu_wear"]["power"]["source"]))
        refusals.extend(RefusedHost(host, cause, fix) for cause, fix in power_refusals)
    if refusals:
        raise RefusedHost.every(host, refusals)
    if serve is not None and models_reason(stack["paths"], settings.models_dir):
        serve.notes.append(models_reason(stack["paths"], settings.models_dir))
    return Decision(host=host, stack=rs, settings=settings, gpus=gpus, serve=serve,
                    choices=_choices(facts, rs, settings, driver, serve.spec) + _power_choices(facts, power),
                    warnings=([driver_first[1]] if driver_first else []) + [w.line() for w in wear]
                    + [w for w in (unequal_sizes(gpus),) if w]
                    + _warnings(facts, rs, settings, os_row, driver, draft is not None, None if cpu else stack["gpu_wear"])
                    + [w for w in (disk_warning, glibc_warning, python_row(facts, rs, settings)[1]) if w] + take_over,
                    model_path=model_path, draft_path=draft_path, facts=facts, os_row=os_row, driver=driver,
                    driver_first=driver_first is not None, power=power, entry=entry)
