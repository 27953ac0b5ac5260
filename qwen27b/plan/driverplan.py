"""The driver plan (issue 50 item 3, cut from gate.py): keep the loaded NVIDIA driver of the stack's
branch, or install/replace it naming every package apt purges, the headers DKMS needs for the running
and the next-booted kernel, and the refusals apt cannot fix (.run installs, a failed build, Secure Boot)."""

from __future__ import annotations

import re
from dataclasses import replace

from qwen27b.plan.driverbuild import boot_kernels, failed_build
from qwen27b.plan.gatetypes import DriverPlan, HostFacts, RefusedHost
from qwen27b.plan.mokstate import console_reboot, enrolment_pending
from qwen27b.plan.driversource import kept_source
from qwen27b.plan.settings import Settings
from qwen27b.plan.planner import Gpu
from qwen27b.plan.stack import ResolvedStack


SECURE_BOOT_FIX = (
    "sign the module with a Machine Owner Key (MOK): "
    "1) reuse the key DKMS made if /var/lib/shim-signed/mok/MOK.der exists, else make one: `sudo mkdir -p "
    "/var/lib/shim-signed/mok && sudo openssl req -new -x509 -newkey rsa:2048 -nodes -days 36500 -subj "
    "'/CN=qwen27b DKMS module signing/' -keyout /var/lib/shim-signed/mok/MOK.priv -outform DER -out "
    "/var/lib/shim-signed/mok/MOK.der && sudo chmod 600 /var/lib/shim-signed/mok/MOK.priv`; "
    "2) `sudo mokutil --import /var/lib/shim-signed/mok/MOK.der` (choose a one-time password); "
    "3) `sudo reboot` and, at the console (BMC/IPMI or a screen: it cannot be done over SSH), in the blue MOK "
    "Manager: Enroll MOK, Continue, Yes, the password, Reboot; "
    "4) check `mokutil --test-key /var/lib/shim-signed/mok/MOK.der` says it is already enrolled; "
    "5) set qwen27b_mok_key_path: /var/lib/shim-signed/mok/MOK.priv (the certificate MOK.der lies beside it) "
    "and re-run. Or disable Secure Boot in the firmware setup"
)


_DRIVER_PACKAGE = re.compile(r"^(?:nvidia-driver-(?P<branch>[0-9]+)(?:-server)?(?:-open)?|cuda-drivers(?:-(?P<cuda_branch>[0-9]+))?)$")


_BRANCH_PACKAGE = re.compile(r"^nvidia-(?:driver|dkms|kernel-source|kernel-common|utils|compute-utils)-(?P<branch>[0-9]+)(?:-server)?(?:-open)?$")


# every package of one driver branch, libraries and X driver included: what apt removes with it
_ANY_BRANCH_PACKAGE = re.compile(r"^(?:lib)?nvidia-[a-z0-9-]*?-(?P<branch>[0-9]{3})(?:-server)?(?:-open)?$"
                                 r"|^xserver-xorg-video-nvidia-(?P<xbranch>[0-9]{3})(?:-server)?$")


# NVIDIA's CUDA repository installs the driver through cuda-drivers; these metapackages depend on it
_CUDA_DRIVERS_DEPENDENTS = re.compile(r"^cuda(?:-runtime)?(?:-[0-9]+-[0-9]+)?$")


_TOOLKIT_PACKAGE = re.compile(r"^cuda-toolkit-([0-9]+)-[0-9]+$")


_OPEN_PACKAGE = re.compile(r"^nvidia-[a-z-]+-[0-9]+(?:-server)?-open$")


UNINSTALL_RUN_FIX = ("remove it with the .run installer's own uninstaller (`sudo nvidia-uninstall`, or `sudo sh "
                     "NVIDIA-Linux-x86_64-<version>.run --uninstall`), reboot, then re-run the deploy: it installs {package}")


def _driver_plan(host: str, facts: HostFacts, rs: ResolvedStack, settings: Settings, gpus: list[Gpu]) -> DriverPlan | None:
    """Keep a loaded driver of the stack's branch whatever installed it; replace anything else, with
    the reason and the exact packages apt must purge; refuse what apt cannot replace (a .run install)."""
    drv = rs.profile.get("driver")
    if not drv or not gpus:
        return None
    package, branch, cite = drv["package"], int(drv["branch"]), rs.cite(drv["source"])
    module, packages = facts.kernel_module, facts.packages
    pending = enrolment_pending(facts) if settings.mok_key_path else None
    loaded = module.get("version")
    loaded_branch = int(loaded.split(".")[0]) if loaded else None
    from_apt = sorted(p for p in packages if _DRIVER_PACKAGE.match(p))
    open_bad = not drv["open_modules_supported"]
    open_installed = sorted(p for p in packages if _OPEN_PACKAGE.match(p)) if open_bad else []
    other_branch = sorted(p for p in packages if (m := _BRANCH_PACKAGE.match(p)) and int(m["branch"]) != branch)
    answering = bool(facts.gpus)
    too_old = any(p["problem"] == "driver-too-old" for p in facts.gpu_problems)
    how = (f"from apt ({', '.join(f'{p} {packages[p]}' for p in from_apt)})" if from_apt
           else "installed outside apt (no nvidia-driver package: the .run installer or a vendor image)")
    sources = [s for s in (kept_source(facts.driver_source, p, packages[p]) for p in from_apt) if s]

    if (loaded_branch == branch and answering and not (open_bad and module.get("flavor") == "open")
            and not open_installed):
        return DriverPlan("keep", package, f"R{branch} {loaded} loaded ({module.get('flavor')} module) and nvidia-smi "
                          f"answers on {len(facts.gpus)} GPU(s); {how}: kept as it is, no reinstall, no reboot {cite}"
                          + "".join(f"; {s}" for s in sources),
                          hold=tuple(from_apt), from_apt=bool(from_apt),
                          kept=", ".join(from_apt) if from_apt else f"{loaded} (outside apt)")

    remove: list[str] = []
    if open_bad and (module.get("flavor") == "open" or open_installed):
        if not open_installed:
            raise RefusedHost(host, f"the open NVIDIA kernel module {loaded} is loaded on {gpus[0].name} and no "
                              f"nvidia-*-open package owns it: {rs.source_text('open-gsp')}",
                              UNINSTALL_RUN_FIX.format(package=package))
        where = "loaded" if module.get("flavor") == "open" else "installed, not loaded (it cannot drive this GPU)"
        why = f"the open kernel module is {where} ({', '.join(open_installed)}): {gpus[0].name} needs the proprietary one"
        remove = open_installed
    elif loaded_branch is not None and loaded_branch != branch:
        if not from_apt:
            raise RefusedHost(host, f"NVIDIA driver {loaded} is loaded, installed outside apt, and is not R{branch} "
                              f"(the stack's branch: {rs.source_text(drv['source'])}); apt cannot replace a .run install",
                              UNINSTALL_RUN_FIX.format(package=package))
        age = "older" if loaded_branch < branch else "newer"
        why = (f"R{loaded_branch} ({loaded}) is loaded" + (", too old for nvidia-smi to report compute_cap" if too_old else "")
               + f": {age} than R{branch}, the stack's branch")
        remove = other_branch + [p for p in from_apt if p.startswith("cuda-drivers") and p not in other_branch]
        remove += _removed_with(packages, remove, branch)
    elif not loaded and other_branch:
        why = f"{', '.join(other_branch)} installed, not loaded: not R{branch}, the stack's branch"
        remove = other_branch
    elif loaded:
        why = f"R{branch} {loaded} is loaded but nvidia-smi lists no GPU"
    elif package in packages and pending:
        why = f"{package} {packages[package]} is installed but not loaded: Secure Boot rejects its module until its MOK key is enrolled"
    elif package in packages:
        why = f"{package} {packages[package]} is installed but not loaded (a reboot is pending)"
    else:
        why = (f"R{branch}, proprietary kernel module" if open_bad else
               f"R{branch}, open kernel module (NVIDIA's recommended one from Turing on; Blackwell has no other)")
    reboot = "reboot pending (qwen27b_skip_reboot)" if settings.skip_reboot else "then reboot once"
    console = None
    if pending:  # the reboot's true cause is the key enrolment, done at the console (plan/mokstate.py)
        reboot, console = console_reboot(pending)
    steps = f"; purge {', '.join(sorted(remove))} and install it in one apt transaction" if remove else ""
    # an operator's hold on the old branch would stop `apt-get -y` at the purge: released in the same
    # transaction, and said so
    held = tuple(sorted(set(facts.held) & set(remove)))
    if remove and any(p.startswith("cuda-drivers") for p in remove):
        steps += _source_change(packages, remove, package, rs)
    if held:
        steps += (f" ({', '.join(held)} held with apt-mark hold: the hold is released in that transaction, "
                  f"--allow-change-held-packages {rs.cite('apt-held')})")
    return DriverPlan("replace" if remove else "install", package, f"{why}{steps}; {reboot} {cite}",
                      remove=tuple(sorted(remove)), hold=(package,), release_holds=held, console_reboot=console)


def _removed_with(packages: dict, remove: list[str], branch: int) -> list[str]:
    """What apt removes beside `remove`, named so the plan lists all of it: with NVIDIA's cuda-drivers,
    the rest of its branch (libraries, X driver) and the CUDA metapackages that depend on cuda-drivers."""
    if not any(p.startswith("cuda-drivers") for p in remove):
        return []
    def other(p: str) -> bool:
        m = _ANY_BRANCH_PACKAGE.match(p)
        return bool(m) and int(m["branch"] or m["xbranch"]) != branch
    return sorted(p for p in packages if p not in remove and (other(p) or _CUDA_DRIVERS_DEPENDENTS.match(p)))


def _source_change(packages: dict, remove: tuple | list, package: str, rs: ResolvedStack) -> str:
    """The driver moves from NVIDIA's CUDA repository (cuda-drivers) to the stack's archive package."""
    drivers = ", ".join(f"{p} {packages[p]}" for p in sorted(remove) if p.startswith("cuda-drivers") and p in packages)
    toolkits = sorted(p for p in packages if _TOOLKIT_PACKAGE.match(p))
    kept = f"; {', '.join(toolkits)} stay{'s' if len(toolkits) == 1 else ''}" if toolkits else ""
    return (f"; the driver source changes: NVIDIA's CUDA repository ({drivers}) to the OS archive's {package} "
            f"(apt-mark hold keeps the CUDA repository's pin from moving it back){kept} {rs.cite('cuda-repo-driver')}")


def _with_headers(host: str, plan: DriverPlan | None, facts: HostFacts) -> DriverPlan | None:
    """DKMS builds the module against linux-headers-<running kernel>: plan it only where apt has it;
    refuse a driver install without it (the build would fail half-way)."""
    if plan is None or not facts.kernel:
        return plan
    headers = facts.kernel_headers
    name = f"linux-headers-{facts.kernel}"
    if headers is None or headers.get("installed") or headers.get("candidate"):
        return replace(plan, headers=name)
    if plan.action == "keep":
        return plan  # nothing is built now; _warnings says what a future rebuild needs
    raise RefusedHost(host, f"{name} is in no configured apt archive (apt-cache policy lists no candidate), so DKMS "
                      f"cannot build {plan.package} for the running kernel {facts.kernel}",
                      "run `apt-get update` (a stale index); if still none, the running kernel is no longer in the "
                      "archive: install the current one of its flavour (e.g. `apt-get install linux-image-generic "
                      "linux-headers-generic`), reboot into it, then re-run the deploy")


def _failed_build(host: str, facts: HostFacts, rs: ResolvedStack) -> None:
    """A driver build left half-configured (dpkg iF/iU, dkms status): the same install would fail the
    same way, so refuse naming the cause the build log gives and its fix (plan/driverbuild.py)."""
    drv = rs.profile.get("driver")
    failure = drv and failed_build(facts.driver_build, facts.kernel, int(drv["branch"]))
    if failure:
        raise RefusedHost(host, f"{failure.cause} [{failure.what}]", failure.fix)


def _boot_headers(plan: DriverPlan | None, facts: HostFacts) -> DriverPlan | None:
    """A newer kernel installed, not booted (unattended-upgrades): the driver's reboot boots it, and
    DKMS builds only for kernels with headers, so its headers come with the driver; the plan says
    which kernel the reboot boots."""
    boot = boot_kernels(facts.kernels, facts.kernel)
    if plan is None or boot is None or plan.action == "keep":
        return plan
    return replace(plan, boot_headers=boot.headers, reason=f"{plan.reason}; {boot.planned}")
