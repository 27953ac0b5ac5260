"""NVIDIA driver: the stack's branch and package (never -open on Volta), nouveau blacklisted,
held against unattended upgrades, persistence daemon on; a reboot only when the driver changed.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.operations import files, server, systemd

from qwen27b.gate import Decision
from qwen27b.operations import apt_hold

from ._common import note
from .toolchain import apt_install

NOUVEAU_BLACKLIST = "# qwen27b: the NVIDIA driver needs nouveau out of the way\nblacklist nouveau\noptions nouveau modeset=0\n"


def _mok_config(key_path: str) -> str:
    # DKMS signs the module with this key so secure boot loads it (the key must be enrolled with mokutil).
    cert = key_path.rsplit(".", 1)[0] + ".der"
    return f'mok_signing_key="{key_path}"\nmok_certificate="{cert}"\n'


def nvidia(decision: Decision) -> None:
    if not decision.gpus:
        note("nvidia: skipped - this profile uses no GPU")
        return
    facts, settings = decision.facts, decision.settings
    package = decision.stack.profile["driver"]["package"]
    blacklist = files.put(name="blacklist nouveau", src=StringIO(NOUVEAU_BLACKLIST),
                          dest="/etc/modprobe.d/blacklist-nouveau.conf", user="root", group="root", mode="0644")
    if blacklist.will_change:
        server.shell(name="rebuild initramfs (nouveau blacklist changed)", commands=["update-initramfs -u"])
    if facts.secure_boot == "enabled":
        files.put(name="DKMS signs the module with the MOK key", src=StringIO(_mok_config(settings.mok_key_path)),
                  dest="/etc/dkms/framework.conf.d/qwen27b-mok.conf", user="root", group="root", mode="0644")
    if apt_install("NVIDIA driver", [package]):
        if settings.skip_reboot:
            note(f"nvidia: {package} changes: REBOOT PENDING (qwen27b_skip_reboot); the service starts after it")
        else:
            server.reboot(name="reboot to load the new driver", delay=10, interval=5, reboot_timeout=900)
        server.shell(name="nvidia-smi answers after the driver change", commands=["nvidia-smi -L"])
    held = [package] + ([f"linux-image-{facts.kernel}"] if settings.hold_kernel and facts.kernel else [])
    apt_hold(name="hold the driver against unattended upgrades", packages=held)
    systemd.service(name="nvidia-persistenced on", service="nvidia-persistenced", running=True, enabled=True)
