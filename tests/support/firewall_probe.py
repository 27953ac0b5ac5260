"""What the e2e tier's firewall tests share (a serving host's, tests/e2e/test_faults.py; a gateway
host's, tests/e2e/test_scaleout_gateway.py): whether nftables can load rules in a test host, a
second controller address outside the allow-list, and a connection from either address.

Each test host has a /24 of its own on the controller's veth (tests/support/testhosts/network.py):
the controller is .1 there, the host .2; `stranger` adds .3 to the same veth for the test, so the
host sees the same link from an address no rule lists."""

from __future__ import annotations

import contextlib
import subprocess


def nft_usable(host) -> str | None:
    """None when nftables loads a table inside `host` (installed first, as the firewall step does);
    else why not (seen on some container kernels: the tests then skip rather than pass or fail falsely)."""
    host.run("command -v nft >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null",
             check=False, timeout=300)
    probe = host.run("nft add table inet q27probe && nft delete table inet q27probe", check=False)
    return None if probe.returncode == 0 else f"nftables cannot load rules inside this test host: " \
        f"{(probe.stderr or probe.stdout).strip()}"


def controller_address(host) -> str:
    """The controller's address on `host`'s veth: the one an allow-list names for the tests."""
    return f"{host.address.rsplit('.', 1)[0]}.1"


@contextlib.contextmanager
def stranger(host):
    """A second controller address on `host`'s veth (.3), outside any allow-list naming the
    controller's own (.1); removed after."""
    controller, address = controller_address(host), f"{host.address.rsplit('.', 1)[0]}.3"
    link = subprocess.run(["ip", "-o", "-4", "addr", "show", "to", f"{controller}/32"], capture_output=True,
                          text=True, check=True).stdout.split()[1]
    subprocess.run(["ip", "addr", "add", f"{address}/24", "dev", link], check=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/24", "dev", link], check=False)


def curl_code(url: str, source: str | None = None) -> str:
    """The HTTP code `url` answers, from `source` (an address of the controller) when given; "000"
    when the connection is refused or reset (a firewall's `reject with tcp reset`)."""
    bind = ["--interface", source] if source else []
    result = subprocess.run(["curl", "-s", "-o", "/dev/null", "-m", "5", "-w", "%{http_code}", *bind, url],
                            capture_output=True, text=True)
    return result.stdout.strip() or f"curl exit {result.returncode}"
