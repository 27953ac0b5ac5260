"""Fixtures for end-to-end tests on throwaway real hosts (tests.support.testhosts).

`testhosts` (session scope) boots N Debian 12 hosts running real systemd in systemd-nspawn,
each in its own network namespace, reachable over SSH, and always tears them down again
(also on failure, Ctrl-C or SIGTERM). N defaults to $QWEN27B_TESTHOSTS_N or 1; a test
module can ask for more with indirect parametrisation:

    @pytest.mark.parametrize("testhosts", [2], indirect=True)
    def test_two(testhosts): ...

Each pytest process uses its own profile (state dir), so it does not touch hosts brought up
with the CLI (`python3 -m tests.support.testhosts up`), nor those of another pytest run.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.testhosts import NspawnHosts
from setupcheck import skip_or_fail_setup

E2E_DIR = Path(__file__).resolve().parent


@dataclass
class E2EHost:
    name: str
    address: str
    ssh_config: Path
    ssh_options: list[str] = field(repr=False)
    lab: NspawnHosts = field(repr=False)

    def run(self, command: str, check: bool = True, timeout: float = 120):
        """Run a shell command on the host over SSH (CompletedProcess, text)."""
        return self.lab.ssh(self.name, command, check=check, timeout=timeout)

    def ssh_argv(self, *cmd: str) -> list[str]:
        """`ssh -F ssh_config NAME CMD...` (plain OpenSSH, no config of the user's)."""
        return self.lab.ssh_argv(self.name, *cmd)

    def testinfra(self, backend: str = "ssh"):
        """A testinfra Host for this test host (ssh backend, or paramiko)."""
        import testinfra

        host = testinfra.get_host(f"{backend}://{self.name}", ssh_config=str(self.ssh_config))
        if backend == "paramiko" and "client" not in vars(host.backend):
            # testinfra's paramiko backend ignores UserKnownHostsFile (WarningPolicy): hand it
            # a client that checks the host key strictly against our known_hosts
            import paramiko

            client = paramiko.SSHClient()
            client.load_host_keys(str(self.lab.known_hosts))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(self.address, username="root", key_filename=str(self.lab.key),
                           look_for_keys=False, allow_agent=False, timeout=10)
            host.backend.client = client
        return host


@dataclass
class E2EHosts:
    lab: NspawnHosts
    hosts: list[E2EHost]

    @property
    def inventory(self) -> Path:
        """pyinfra inventory file (group `testhosts`)."""
        return self.lab.inventory

    @property
    def ssh_config(self) -> Path:
        return self.lab.ssh_config

    @property
    def state_file(self) -> Path:
        return self.lab.state_file

    def __getitem__(self, i: int) -> E2EHost:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self):
        return iter(self.hosts)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return ("e2e test hosts need root (network namespaces, veth, systemd-nspawn, "
                "debootstrap); run pytest as root")
    if not Path("/proc/self/ns/time").exists():
        return "kernel without time namespaces (CONFIG_TIME_NS): test hosts need them"
    return None


class _Terminated(KeyboardInterrupt):
    pass


def _raise_on_sigterm(signum, frame):
    raise _Terminated(f"signal {signum}")


@pytest.fixture(scope="session")
def testhosts(request) -> E2EHosts:
    reason = _skip_reason()
    if reason:
        skip_or_fail_setup(reason)
    n = int(getattr(request, "param", None) or os.environ.get("QWEN27B_TESTHOSTS_N", "1"))
    lab = NspawnHosts(profile=f"pytest-{os.getpid()}-{n}")
    old = None
    try:
        old = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # SIGTERM -> teardown too
    except ValueError:  # not the main thread
        pass
    try:
        lab.up(n)
        hosts = [E2EHost(h["name"], h["address"], lab.ssh_config, lab.ssh_options(), lab)
                 for h in lab.hosts]
        yield E2EHosts(lab, hosts)
    finally:
        try:
            lab.down()
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)


@pytest.fixture(scope="module")
def own_testhosts():
    """Test hosts of a module's own, beside the session's (whose deployed host the other modules
    keep using): `own_testhosts(n, link_peers=True)` -> E2EHosts, all torn down after the module."""
    reason = _skip_reason()
    if reason:
        skip_or_fail_setup(reason)
    made: list[NspawnHosts] = []

    def make(n: int, link_peers: bool = False, name: str = "own") -> E2EHosts:
        lab = NspawnHosts(profile=f"pytest-{os.getpid()}-{name}{len(made)}")
        made.append(lab)
        lab.up(n)
        if link_peers:
            lab.link_peers()
        return E2EHosts(lab, [E2EHost(h["name"], h["address"], lab.ssh_config, lab.ssh_options(), lab)
                              for h in lab.hosts])

    try:
        yield make
    finally:
        for lab in made:
            lab.down()


@pytest.fixture(scope="session")
def testhost(testhosts) -> E2EHost:
    """The first test host."""
    return testhosts[0]


@pytest.fixture
def clean_env() -> dict[str, str]:
    """A minimal environment for controller-side subprocesses (pyinfra passes env through)."""
    keep = ("PATH", "HOME", "LANG", "TERM", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    return env

