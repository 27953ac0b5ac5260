"""The address the controller reaches a host at: what the service binds to (unless
qwen27b_bind_address says), what verify calls and where a fan-out seed serves its peers.

A host written the usual pyinfra way, `("gpu-a.lab", {...})` with no `ssh_hostname`, or with a DNS
name or an ssh_config alias there, is reached at whatever pyinfra's SSH connector resolved (DNS,
/etc/hosts, the ssh config's HostName). That answer is the peer address of the open connection:
read it there rather than resolving the name a second time, which could answer differently
(another address family, a round-robin record, a name only the ssh config knows).
"""

from __future__ import annotations

import ipaddress
import socket

from pyinfra.connectors.ssh import SSHConnector

from qwen27b.plan.gate import RefusedHost
from qwen27b.plan.addresses import lab_address

STATED = "the host's lab address (ssh_hostname), not every interface"


def peer_address(host) -> str | None:
    """The IP address of the host's SSH connection, or None: not connected over SSH, or through a
    jump host or ProxyCommand (the socket then ends at the proxy, not at the host)."""
    client = getattr(host.connector, "client", None) if isinstance(host.connector, SSHConnector) else None
    transport = client.get_transport() if client is not None else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket):  # a paramiko Channel (ProxyJump) or ProxyCommand
        return None
    try:
        address = ipaddress.ip_address(sock.getpeername()[0].split("%", 1)[0])
    except (OSError, ValueError, IndexError):
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return str(address)


def host_address(host) -> tuple[str | None, str]:
    """(address, why) for the plan: the inventory's ssh_hostname when it is an IP, else the address
    the SSH connection reached; (None, why not) for a host reached otherwise."""
    stated = lab_address(dict(host.data.dict()))
    if stated:
        return stated, STATED
    reached = peer_address(host)
    if reached:
        named = host.data.get("ssh_hostname") or host.name
        return reached, f"the address the controller's SSH connection reached {named} at, not every interface"
    return None, "not connected over SSH"


def unknown_address(host, bind_address: str | None) -> RefusedHost | None:
    """A host reached over SSH whose address the controller cannot see (a jump host or ProxyCommand
    in between) and no qwen27b_bind_address: refused, rather than served on loopback and left
    unverified. Other connectors (@local, @docker, @fake) keep loopback."""
    if not isinstance(host.connector, SSHConnector) or bind_address:
        return None
    if host_address(host)[0] is not None:
        return None
    return RefusedHost(host.name, "the controller reaches this host through an SSH jump host or ProxyCommand, so its "
                       "lab address is unknown: the service would listen on loopback only and verify could not "
                       "reach it", "set qwen27b_bind_address to the host's lab address (the controller must reach "
                       "it there for verify)")
