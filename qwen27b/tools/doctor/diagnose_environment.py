"""Step 3, the environment: Xids, the driver (open vs proprietary on Volta, lost GPUs), CUDA
(driver vs torch's runtime), torch and the vLLM build in the release venv, Docker's GPU access.

Each check is its own function run through `guarded`: an output no check was written for (a
field nvidia-smi prints as N/A, a truncated probe) gives that check a verdict, never a traceback
that would end the report for every host. What the GPUs' trouble is comes from
qwen27b.plan.gpustate, the reading the deploy's gate refuses on."""

from __future__ import annotations

import re

from qwen27b.onhost.contract import XID_FATAL, xid_meaning
from qwen27b.plan.gpufacts_parse import gpu_problem_line
from qwen27b.plan.gpustate import LOST, MISSING, SEED_XID79_ADVICE, GpuTrouble, gpu_troubles
from qwen27b.plan.stack import cc_tuple

from .context import Ctx, guarded, journal_checks, unjudged
from .model import FAIL, OK, SKIP, WARN, Check
from .parse import version_in

_NOT_A_VALUE = ("N/A", "[N/A]", "Not Supported", "[Not Supported]")


def _nvidia_smi(ctx: Ctx) -> dict:
    """nvidia-smi's table: driver and CUDA version (None when it prints N/A: 'CUDA Version: N/A' when
    libcuda cannot load), the first failure line, and its failure lines as gpufacts "problem" entries."""
    text = ctx.snap.text("nvidia-smi.txt") or ""
    out = {"present": bool(text) and "##PYINFRA_NOCMD##" not in text, "driver": None, "cuda": None,
           "cuda_na": False, "error": None, "problems": []}
    match = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", text)
    if match:
        out["driver"] = None if match[1] in _NOT_A_VALUE else match[1]
        out["cuda_na"] = match[2] in _NOT_A_VALUE
        out["cuda"] = None if out["cuda_na"] else match[2]
    for bad in ("couldn't communicate with the NVIDIA driver", "Unable to determine the device handle", "GPU is lost",
                "No devices were found", "Failed to initialize NVML"):
        if bad in text:
            out["error"] = next(line.strip() for line in text.splitlines() if bad in line)
    out["problems"] = [p for p in map(gpu_problem_line, (line.strip() for line in text.splitlines())) if p]
    return out


def _major_minor(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


def step3(ctx: Ctx) -> list[Check]:
    if ctx.snap.error:
        return [Check(3, "environment", SKIP, "host not read")]
    try:
        smi = _nvidia_smi(ctx)
        troubles = [] if ctx.cpu else gpu_troubles(ctx.facts, smi["problems"])
    except Exception as error:  # the output itself is the finding, the rest of step 3 still runs
        return [unjudged(3, "nvidia-smi", error)] + guarded(3, "release venv", _venv_checks, ctx) \
            + guarded(3, "docker GPU access", _docker_check, ctx)
    checks: list[Check] = []
    checks += guarded(3, "Xid errors", _xid_check, ctx, smi, troubles)
    checks += guarded(3, "driver", _driver_checks, ctx, smi, troubles)
    checks += guarded(3, "CUDA", _cuda_check, ctx, smi)
    checks += guarded(3, "release venv", _venv_checks, ctx)
    checks += guarded(3, "docker GPU access", _docker_check, ctx)
    return checks + journal_checks(ctx, 3)


def _xid_check(ctx: Ctx, smi: dict, troubles: list[GpuTrouble]) -> Check:
    """Xids first: a GPU that fell off the bus explains everything after it."""
    view = ctx.view
    failing_now = view.failing is not None and not view.recovered
    xids = list(ctx.xids)  # a copy's: those on its own GPUs
    if not xids:
        return Check(3, "Xid errors", OK if not ctx.cpu else SKIP,
                     "none in the kernel log of the last 7 days" if not ctx.cpu else "CPU smoke profile")
    by: dict[int, list] = {}
    for x in xids:
        by.setdefault(x["xid"], []).append(x)
    worst = sorted(by, key=lambda n: (n not in XID_FATAL, n != 79))[0]
    last = by[worst][-1]
    gpu_lost = any(t.kind in (LOST, MISSING) for t in troubles)
    fatal = worst in XID_FATAL and (failing_now or gpu_lost or not ctx.serving)
    summary = ", ".join(f"Xid {n} x{len(v)}" for n, v in sorted(by.items()))
    fix = SEED_XID79_ADVICE if worst == 79 else "reboot at the next window; if it repeats, replace the card"
    return Check(3, "Xid errors", FAIL if fatal else WARN,
                 f"{summary}; last Xid {worst} ({xid_meaning(worst)}) at {last.get('time') or '?'} on {last.get('pci')}",
                 fix)


def _driver_checks(ctx: Ctx, smi: dict, troubles: list[GpuTrouble]) -> list[Check]:
    if ctx.cpu:
        return [Check(3, "driver", SKIP, "CPU smoke profile: no GPU driver")]
    facts, rs = ctx.facts, ctx.rs
    module = facts.kernel_module
    drv = rs.profile.get("driver") if rs else None
    volta = ctx.cc is not None and cc_tuple(ctx.cc) < (7, 5)
    blocking = [t for t in troubles if t.blocks and t.kind not in (LOST, MISSING)]
    if not module.get("loaded"):
        checks = [Check(3, "driver", FAIL, "no NVIDIA kernel module loaded (/proc/driver/nvidia/version missing)"
                        + (f"; nvidia-smi: {smi['error']}" if smi["error"] else ""),
                        "run the deploy (nvidia role) and reboot; check `dmesg | grep -i nvidia` (secure boot, "
                        "nouveau, a kernel without headers)")]
    elif module.get("flavor") == "open" and volta:
        checks = [Check(3, "driver", FAIL, f"open kernel module {module.get('version')} on compute capability "
                        f"{ctx.cc}: it needs GSP (Turing+), Volta is not supported",
                        "purge nvidia-*-open and install the proprietary nvidia-driver-580-server (re-run the deploy)")]
    elif blocking:  # the driver answers nothing: the GPUs themselves are not judged (the gate's reading)
        checks = [Check(3, "driver", FAIL, blocking[0].cause, blocking[0].fix)]
    elif smi["error"]:
        checks = [Check(3, "driver", FAIL, f"nvidia-smi: {smi['error']}",
                        "reboot; if a GPU stays lost check its seating, power and Above-4G decoding (see the Xid check)")]
    else:
        version = module.get("version") or "?"
        branch_ok = drv is None or version.split(".")[0] == str(drv.get("branch"))
        evidence = f"{module.get('flavor')} kernel module {version}, nvidia-smi sees {len(ctx.gpus)} GPU(s)"
        checks = [Check(3, "driver", OK if branch_ok else WARN,
                        evidence + ("" if branch_ok else f"; the stack's branch is R{drv.get('branch')}"),
                        "" if branch_ok else f"install {drv.get('package')} (re-run the deploy)")]
    for trouble in troubles:
        if trouble.kind in (LOST, MISSING):
            checks.append(Check(3, "GPUs visible", FAIL, trouble.cause, trouble.fix))
            break
    return checks


def _cuda_check(ctx: Ctx, smi: dict) -> Check:
    """The driver's CUDA version against torch's runtime; 'CUDA Version: N/A' is libcuda failing to load."""
    if ctx.cpu:
        return Check(3, "CUDA", SKIP, "CPU smoke profile")
    probe, rs, facts = ctx.probe or {}, ctx.rs, ctx.facts
    torch_cuda = probe.get("torch_cuda")
    toolkits = sorted(p for p in facts.packages if re.match(r"cuda-toolkit-\d+-\d+$", p))
    cuda = rs.profile.get("cuda") if rs else None
    bad_toolkit = [t for t in toolkits if cuda and int(t.split("-")[2]) > cuda["max_major"]]
    driver_cuda, runtime = _major_minor(smi["cuda"]), _major_minor(torch_cuda)
    if smi["cuda_na"] and smi["driver"]:
        return Check(3, "CUDA", FAIL, f"nvidia-smi shows driver {smi['driver']} but 'CUDA Version: N/A': the driver's "
                     "CUDA library (libcuda.so, package libnvidia-compute-<branch>) is missing or of another version "
                     "than the loaded kernel module, so no CUDA program can start",
                     "re-run the deploy (nvidia role) to install the driver's user-space libraries of the module's "
                     "version, or reboot if the driver was just upgraded; `nvidia-smi` must then show a CUDA version")
    if driver_cuda and runtime and runtime > driver_cuda:
        return Check(3, "CUDA", FAIL, f"torch uses CUDA {torch_cuda}, the driver supports up to {smi['cuda']}",
                     "install the stack's driver (R580 supports CUDA 12.8/13.0), or torch built for an older CUDA")
    if bad_toolkit:
        return Check(3, "CUDA", WARN, f"{', '.join(bad_toolkit)} installed: CUDA {cuda['max_major'] + 1}+ has no "
                     f"Volta support (the wheel ships its own runtime, but builds would fail)",
                     f"apt-get purge {' '.join(bad_toolkit)}; keep {cuda['package']}")
    return Check(3, "CUDA", OK if torch_cuda or smi["cuda"] else SKIP,
                 f"driver supports CUDA {smi['cuda'] or '?'}, torch runtime {torch_cuda or '?'}"
                 + (f", toolkits: {', '.join(toolkits)}" if toolkits else ", no toolkit installed"))


def _venv_checks(ctx: Ctx) -> list[Check]:
    """torch and the vLLM build, from the release venv."""
    checks: list[Check] = []
    probe, rs = ctx.probe or {}, ctx.rs
    if ctx.snap.text("venv-probe.json") is None:
        checks.append(Check(3, "release venv", SKIP, "not probed"))
    elif ctx.probe is None:
        checks.append(Check(3, "release venv", FAIL, f"{ctx.stack['paths']['current_release']}/venv/bin/python did not "
                            f"answer: {(ctx.snap.text('venv-probe.json') or '').strip().splitlines()[-1:] or ['no output']}",
                            "re-run the deploy (toolchain and vllm roles rebuild the release venv)"))
    else:
        if probe.get("torch_error"):
            checks.append(Check(3, "torch", FAIL, f"import torch failed: {probe['torch_error'][:200]}",
                                "re-run the deploy (vllm role) to reinstall torch into the release venv"))
        else:
            tv = probe.get("torch")
            spec = (rs.profile.get("torch") or {}).get("requirement") if rs else None
            arch = (rs.profile.get("torch") or {}).get("required_arch") if rs else None
            arch_list = probe.get("arch_list") or []
            evidence = f"torch {tv}" + (f" (CUDA {probe.get('torch_cuda')}, arch {' '.join(arch_list)})" if probe.get("torch_cuda") else "")
            if arch and arch not in arch_list:
                checks.append(Check(3, "torch", FAIL, f"{evidence}: {arch} missing from torch.cuda.get_arch_list()",
                                    f"install torch from {rs.profile['torch'].get('index_url')} matching "
                                    f"'{spec}' (cu128 2.8-2.10 carry sm_70): re-run the deploy"))
            elif not ctx.cpu and probe.get("cuda_available") is False:
                checks.append(Check(3, "torch", FAIL, f"{evidence}: torch.cuda.is_available() is False",
                                    "the driver or the GPUs are not usable: see the driver check"))
            elif spec and not version_in(tv, spec):
                checks.append(Check(3, "torch", WARN, f"{evidence}, the stack wants '{spec}'", "re-run the deploy"))
            else:
                checks.append(Check(3, "torch", OK, evidence + (f", satisfies '{spec}'" if spec else "")))
        dist, version = ctx.installed()
        vllm = rs.profile["vllm"] if rs else None
        missing = [m for m in (vllm or {}).get("smoke_imports", []) if probe.get("specs", {}).get(m) is False]
        if dist is None:
            checks.append(Check(3, "vLLM build", FAIL, "no vLLM distribution in the release venv",
                                "re-run the deploy (vllm role)"))
        elif vllm and dist == "vllm" and vllm["dist"] != "vllm" and ctx.cc and cc_tuple(ctx.cc) < (7, 5):
            checks.append(Check(3, "vLLM build", FAIL, f"upstream vllm {version} on compute capability {ctx.cc}: "
                                f"{ctx.rs.source_text(['vllm-39878', 'vllm-nvfp4-min75'])}",
                                f"install the sm70 profile's {vllm['dist']} {vllm['version']} (remove the vllm override, "
                                "re-run the deploy)"))
        elif missing:
            checks.append(Check(3, "vLLM build", FAIL, f"{dist} {version}: module(s) {', '.join(missing)} not importable",
                                "re-run the deploy (vllm role)"))
        elif vllm and (dist != vllm["dist"] or version != vllm["version"]):
            checks.append(Check(3, "vLLM build", WARN, f"{dist} {version} installed, the stack pins {vllm['dist']} {vllm['version']}",
                                "re-run the deploy to install the stack's build"))
        else:
            checks.append(Check(3, "vLLM build", OK, f"{dist} {version}" + (f" (Python {probe.get('python')})")))
    return checks


def _docker_check(ctx: Ctx) -> list[Check]:
    """Docker's GPU access (the seed's "does Docker have GPU rights")."""
    checks: list[Check] = []
    docker = ctx.snap.text("docker.txt")
    if docker is None or "docker absent" in docker:
        checks.append(Check(3, "docker GPU access", SKIP, "docker not installed (the service runs vLLM without it)"))
    elif ctx.cpu:
        checks.append(Check(3, "docker GPU access", SKIP, "docker present; CPU smoke profile needs no GPU in containers"))
    else:
        has = "nvidia" in docker.lower()
        checks.append(Check(3, "docker GPU access", OK if has else WARN,
                            "nvidia runtime / CDI spec present" if has else "docker present without the nvidia runtime or a CDI spec",
                            "" if has else "install nvidia-container-toolkit and run `nvidia-ctk runtime configure --runtime=docker` "
                            "(only needed to run vLLM in containers)"))
    return checks
