"""NVIDIA driver as the gate planned it (gatetypes.DriverPlan): a loaded driver of the stack's branch is
kept whatever installed it; otherwise the stack's package is installed (never -open on Volta),
purging what would conflict in the same apt transaction, and the host rebooted once. nouveau
blacklisted where a driver is installed, the driver held against unattended upgrades.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra.operations import files, server, systemd

from qwen27b.plan.gate import Decision
from qwen27b.controller import factcache
from qwen27b.controller.operations import apt_hold
from qwen27b.controller.render import GPU_POWER_UNIT, gpu_power_unit
from qwen27b.plan.hostlayout import UNIT_DIR

from ._common import apt_install, apt_lock_option, note

NOUVEAU_BLACKLIST = "# qwen27b: the NVIDIA driver needs nouveau out of the way\nblacklist nouveau\noptions nouveau modeset=0\n"
APT = 'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" -o Dpkg::Options::="--force-confold"'


def _mok_config(key_path: str) -> str:
    # DKMS signs the module with this key so secure boot loads it (the key must be enrolled with mokutil).
    cert = key_path.rsplit(".", 1)[0] + ".der"
    return f'mok_signing_key="{key_path}"\nmok_certificate="{cert}"\n'


def replace_command(package: str, remove: tuple[str, ...], release_holds: tuple[str, ...] = ()) -> str:
    """One apt transaction: install `package`, purge `remove` (apt's `name-` suffix), waiting for the dpkg
    lock; held packages in it are released in it (_apt), or apt-get -y would stop at the hold."""
    return f"{_apt(release_holds)} --purge install {shlex.quote(package)} " + " ".join(shlex.quote(f"{p}-") for p in remove)


def nvidia(decision: Decision) -> None:
    plan = decision.driver
    if plan is None:
        note("nvidia: skipped - this profile uses no GPU")
        return
    facts, settings = decision.facts, decision.settings
    if plan.action == "keep":
        note("nvidia: driver kept as found (the plan's driver row says why): no install, no reboot")
    else:
        blacklist = files.put(name="blacklist nouveau", src=StringIO(NOUVEAU_BLACKLIST),
                              dest="/etc/modprobe.d/blacklist-nouveau.conf", user="root", group="root", mode="0644")
        if blacklist.will_change:
            server.shell(name="rebuild initramfs (nouveau blacklist changed)", commands=["update-initramfs -u"])
        if facts.secure_boot == "enabled":
            files.put(name="DKMS signs the module with the MOK key", src=StringIO(_mok_config(settings.mok_key_path)),
                      dest="/etc/dkms/framework.conf.d/qwen27b-mok.conf", user="root", group="root", mode="0644")
        if plan.remove:
            server.shell(name="replace the NVIDIA driver (purge and install in one apt transaction)",
                         commands=["apt-get update", replace_command(plan.package, plan.remove, plan.release_holds)])
            changed = True
        else:
            changed = apt_install("NVIDIA driver", [plan.package]) or plan.package in facts.packages
        if changed:
            _reboot(decision)
    if plan.hold:
        held = list(plan.hold) + ([f"linux-image-{facts.kernel}"] if settings.hold_kernel and facts.kernel else [])
        apt_hold(name="hold the driver against unattended upgrades", packages=held)
    if plan.from_apt or plan.action != "keep":
        factcache.prefetch(factcache.service_reads("nvidia-persistenced.service"))
        systemd.service(name="nvidia-persistenced on", service="nvidia-persistenced", running=True, enabled=True)
    else:
        note("nvidia: nvidia-persistenced left as the driver's installer set it up (no apt package owns the driver)")
    gpu_power(decision)


def _reboot(decision: Decision) -> None:
    """Once, after the driver changed; with qwen27b_skip_reboot, the exact steps to do by hand."""
    package = decision.driver.package
    if decision.driver.console_reboot:  # a MOK key to enrol: only a person at the console can (plan/mokstate.py)
        note(f"nvidia: {decision.driver.console_reboot}", always=True)
        return
    if decision.settings.skip_reboot:
        note(f"nvidia: {package} changes: REBOOT PENDING (qwen27b_skip_reboot). By hand: `sudo systemctl reboot`; "
             "then `nvidia-smi -L` lists every GPU and `cat /proc/driver/nvidia/version` shows "
             f"{decision.stack.profile['driver']['branch']}.x; then re-run the deploy (the service starts after it)", always=True)
        return
    server.reboot(name="reboot to load the new driver", delay=10, interval=5, reboot_timeout=900)
    server.shell(name="nvidia-smi answers after the driver change", commands=["nvidia-smi -L"])


def _apt(release_holds: tuple[str, ...]) -> str:
    """apt-get that waits for the dpkg lock [apt-lock-timeout]; with --allow-change-held-packages where the
    plan's driver row releases holds [apt-held]. Kept below the operations: pyinfra keys an operation by
    its line numbers alone, and lines added above moved "replace the NVIDIA driver" onto multinode.py's
    line 58 (the recorded hosts' dry run failed with 'Cycle detected in operation ordering DAG')."""
    return f"{APT} {apt_lock_option()}" + (" --allow-change-held-packages" if release_holds else "")


def gpu_power(decision: Decision) -> None:
    """qwen27b-gpu-power.service (issue 27): persistence mode on and the power caps, at each boot before
    the service. Run now when it changed, unless a reboot for the driver is still to come (it runs then)."""
    if decision.power is None:
        return
    dest = f"{UNIT_DIR}/{GPU_POWER_UNIT}"
    factcache.prefetch(factcache.put_reads(dest, create_remote_dir=False) + factcache.service_reads(GPU_POWER_UNIT))
    unit = files.put(name=f"render {dest}", src=StringIO(gpu_power_unit(decision)), dest=dest, user="root", group="root",
                     mode="0644", create_remote_dir=False)
    if unit.will_change:
        systemd.daemon_reload(name="systemd daemon-reload (the GPU power unit changed)")
    waits = decision.driver is not None and decision.driver.reboot and bool(decision.settings.skip_reboot
                                                                           or decision.driver.console_reboot)
    wear = {w["index"]: w for w in ((decision.facts.wear or {}).get("gpus") or [])}
    off = [g["index"] for g in decision.facts.gpus if g.get("persistence_mode") is False]
    drift = [i for i, w in decision.power.limits if (wear.get(i) or {}).get("power_limit_w") not in (None, float(w))]
    why = ([f"persistence mode off on GPU(s) {', '.join(map(str, off))}"] if off else []) + (
        [f"power limit not as planned on GPU(s) {', '.join(map(str, drift))}"] if drift else [])
    rerun = not waits and (unit.will_change or bool(why))
    if why and not waits:
        note(f"nvidia: {GPU_POWER_UNIT} runs again: {'; '.join(why)}", always=True)
    # one name on every host: pyinfra joins the names one operation gets on different hosts
    systemd.service(name=f"{GPU_POWER_UNIT} enabled (run when it changed or the GPUs drifted from it)",
                    service=GPU_POWER_UNIT, running=not waits, restarted=rerun, enabled=True)
    if decision.power.ecc_on:
        note(f"nvidia: ECC turned on for GPU(s) {', '.join(map(str, decision.power.ecc_on))} (qwen27b_ecc: on): it takes "
             "effect after a reboot, which this deploy does not do: `sudo systemctl reboot`", always=True)
