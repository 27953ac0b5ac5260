"""Throwaway real test hosts: Debian 12 + real systemd in systemd-nspawn, one network
namespace each, reached over SSH (pyinfra, testinfra, plain ssh).

    python3 -m tests.support.testhosts up [-n N]       # boot N hosts (default 1), print a table
                                   [--link-peers]  # ... that reach each other (lab LAN)
    python3 -m tests.support.testhosts status          # name, address, PIDs, systemd state
    python3 -m tests.support.testhosts ssh NAME [CMD]  # ssh into a host (or run CMD there)
    python3 -m tests.support.testhosts reset NAME      # fresh root from the cached tarball, reboot
    python3 -m tests.support.testhosts check [NAME]    # apt-get update + pip download six inside
    python3 -m tests.support.testhosts down            # stop everything, delete roots (keeps cache)
    python3 -m tests.support.testhosts --profile lab lab-inventory DIR  # README's lab inventory
                                   # (admin + sudo, a gateway; labinventory.py): what `./run up N` writes

Needs root (network namespaces, veth, nspawn). Stdlib only. See docs/testhosts.md.
Parts: rootfs (the cached pristine root), network (namespaces, veths, the proxy), ssh (keys,
known_hosts, client files), container (roots, nspawn supervisors, waits, stops), hosts
(NspawnHosts: up/reset/down/status over those), procs and common (helpers), cli.

Layout (CACHE = $QWEN27B_CACHE or ~/.cache/qwen27b):
    CACHE/rootfs/debian-bookworm-<hash>.tar   pristine root, keyed by the package list
    CACHE/testhosts_id_ed25519[.pub]          the SSH key authorized for root in every host
    CACHE/testhosts/<profile>/                state of one set of hosts:
        state.json  inventory.py  ssh_config  known_hosts  roots/NAME/  NAME.console.log ...

Each host NAME (q27tN) gets: netns NAME, veth vNAME (10.231.N.1/24) <-> eth0 inside
(10.231.N.2/24), no default route (nothing leaves the namespace except through the proxy);
a forward proxy (tinyproxy on 127.0.0.1, started here) bridged into the namespace at
127.0.0.1:3128 with socat over a unix socket; apt and pip inside use that proxy.
"""

from .cli import main
from .common import TestHostsError
from .hosts import NspawnHosts
from .procs import pid_alive
from .rootfs import PACKAGES

__all__ = ["NspawnHosts", "TestHostsError", "main", "PACKAGES", "pid_alive"]
