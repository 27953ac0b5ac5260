"""Addresses and networks in host data (issue 50 item 3, cut from hostdata.py): each re-printed from
its parsed form before it reaches a unit line, a shell command, an nft rule or an nginx upstream; a
zone id only as an interface name and only for SSH; the lab address read from ssh_hostname; the
warning for an allow-list open to every address."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from qwen27b.plan.settings import PREFIX, BadHostData, Settings


# An IPv6 zone id (fe80::1%eth0) names an interface (IFNAMSIZ: 15 characters): Python's ipaddress
# takes anything after the '%', shell and quotes included, and addresses reach unit lines, shell
# commands, nft rules and nginx upstreams. Every address is re-printed from its parsed form.
ZONE_ID = re.compile(r"[A-Za-z0-9_.-]{1,15}")


ZONE_FIX = "write the zone as an interface name only (letters, digits and . _ -, at most 15), e.g. fe80::1%eth0"


ADDRESS_KEYS = {"bind_address": "give the lab interface's address, e.g. 192.168.1.20",
                "node_address": "give this host's address on the link between the members, e.g. 10.10.0.1"}


NETWORK_KEYS = ("firewall_allow", "metrics_allow")


def parse_address(host: str, key: str, value: Any, fix: str, zone: bool = False) -> str:
    """The address as every file and command gets it: re-printed from the parsed address. A zone id
    (fe80::1%eth0) only where `zone` (ssh_hostname, for the SSH connection), and then an interface
    name: systemd's ListenStream=/IPAddressAllow=, nft and nginx take none."""
    try:
        if not isinstance(value, str):
            raise TypeError(value)
        address = ipaddress.ip_address(value)
    except (TypeError, ValueError):
        raise BadHostData(host, key, f"{value!r} is not an IP address", fix) from None
    scope = getattr(address, "scope_id", None)
    if scope is not None and not ZONE_ID.fullmatch(scope):
        raise BadHostData(host, key, f"{value!r} has the zone id {scope!r}, which is not an interface name", ZONE_FIX)
    if scope is not None and not zone:
        raise BadHostData(host, key, f"{value!r} has a zone id: the units, nft rules and nginx take none",
                          "use the interface's global or unique-local address (fd00::/8), without %zone")
    return str(address)


def parse_network(host: str, key: str, value: Any) -> str:
    """A network re-printed from its parsed form (host bits kept as written: every reader parses it
    with strict=False). No zone id: nftables and systemd's IPAddressAllow= match addresses only."""
    fix = "write networks as CIDR strings, e.g. '10.0.0.0/24' or '192.168.1.7/32'"
    try:
        if not isinstance(value, str):
            raise TypeError(value)
        network = ipaddress.ip_interface(value)
    except (TypeError, ValueError):
        raise BadHostData(host, key, f"{value!r} is not a network", fix) from None
    if getattr(network, "scope_id", None) is not None:
        raise BadHostData(host, key, f"{value!r} has a zone id: nftables and IPAddressAllow= take none",
                          "write the network without its %zone, e.g. 'fe80::/64'")
    if network.ip != network.network.network_address:
        # every reader (nft, IPAddressAllow=, the route guard) takes the whole network: 10.0.0.7/8 is 10.0.0.0/8
        raise BadHostData(host, key, f"{value!r} has host bits set: it would allow all of {network.network}",
                          f"write '{network.network}' for the whole network, or "
                          f"'{network.ip}/{network.max_prefixlen}' for the one host")
    return str(network)


def open_to_all(s: Settings) -> list[str]:
    """A warning per allow-list that lets every address in (0.0.0.0/0, ::/0): allowed, as the lab's
    explicit choice, but never without a word in the plan."""
    what = {"firewall_allow": "vLLM's port is reachable from every address (the firewall rule filters nothing)",
            "metrics_allow": "/metrics, the health endpoint and node_exporter answer every address without the key"}
    out = []
    for name, meaning in what.items():
        wide = [n for n in getattr(s, name) or [] if ipaddress.ip_network(n).prefixlen == 0]
        if wide:
            out.append(f"WARNING: {PREFIX}{name} lists {', '.join(wide)}: {meaning}")
    return out


def lab_address(data: dict) -> str | None:
    """The host's address on the lab network when the inventory states one as an IP (re-printed;
    None for a name, or a scoped link-local address: no unit, rule or peer can use its zone id)."""
    for key in ("ssh_hostname",):
        value = data.get(key)
        if isinstance(value, str):
            try:
                return parse_address("", key, value, "")
            except BadHostData:
                return None
    return None


def check_ssh_address(host: str, data: dict) -> None:
    """An ssh_hostname written as a scoped IPv6 address must have an interface name as its zone."""
    value = data.get("ssh_hostname")
    if isinstance(value, str) and "%" in value:
        parse_address(host, "ssh_hostname", value, ZONE_FIX, zone=True)
