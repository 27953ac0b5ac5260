"""Weights fan-out: which host gets the checkpoint from where, wave by wave (pure; no pyinfra).

With `qwen27b_weights_fanout: "tree"` and `qwen27b_model_source: "mirror"` the checkpoint crosses
the WAN (the lab mirror) once: wave 0 is one host fetching from the mirror; in wave k every host
that holds a verified copy seeds one host that has none, so the holders double (1 -> 2 -> 4 -> 8)
and N hosts are done after 1 + ceil(log2 N) waves. Hosts that already hold a verified copy when
the deploy starts seed from wave 1 on, and then nothing crosses the WAN at all.

A seed serves the one model revision it holds over HTTP (qwen27b/onhost/mirror.py in seed mode, Range
requests honoured) on its lab address, in a transient sandboxed unit (the service user, no
capability, only that revision visible and read-only) that the last wave's operation stops and
that stops itself after the planned waves' time budget (`seed_max_s`) if the deploy dies first.
It answers only its planned peers' addresses (in the server, and a per-unit IPAddressAllow= where
systemd can enforce one) presenting the run's random token, which the controller makes once per
run and writes to a 0600 file on each host of the fan-out (never argv, never a plan line). So a
host without a known lab address fetches from the mirror: no seed could admit it. The receiver
runs the same qwen27b-fetch as for the mirror (resume from the part file, sha256 of every file
against the *mirror's* manifest, so a seed cannot hand out a bad copy) and falls back to the
mirror if its seed fails or refuses, resuming from what the seed had already sent.

The deploy (roles/weights.py; the run-wide part in controller/weightsfanout.py) adds one operation
per wave; pyinfra runs an operation on all its hosts before the next starts, which gives the
ordering: a seed's copy is verified and its server listening before the wave that reads from it begins.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from qwen27b.onhost.contract import SEED_UNIT
from qwen27b.plan.hostdata import http_base

MODES = ("none", "tree")
SEED_PORT = 8801  # the seeds' HTTP port on their lab address, only while the fan-out runs
SEED_MIN_RATE = 25e6  # bytes/s a LAN copy is budgeted at (200 Mbit/s); slower, the mirror completes it
SEED_WAVE_SLACK_S = 120  # per wave: the fetch's own start, hashing, pyinfra's round trips
MIRROR = "mirror"


@dataclass(frozen=True)
class Member:
    """One host of a fan-out group: its inventory name, its lab address (None: it can receive
    but cannot seed) and whether it already holds a verified copy. `in_run=False`: a host of the
    inventory outside this run's `--limit` that holds a verified copy: it seeds (its seed server is
    started and stopped from the controller, since the run queues no operation for it), never receives."""

    name: str
    address: str | None = None
    has_copy: bool = False
    in_run: bool = True


@dataclass(frozen=True)
class Copy:
    """One transfer of the checkpoint: `host` gets it in `wave` from `source` (MIRROR or a host)."""

    host: str
    wave: int
    source: str
    source_address: str | None
    reason: str

    @property
    def from_mirror(self) -> bool:
        return self.source == MIRROR


@dataclass(frozen=True)
class FanoutPlan:
    members: tuple[Member, ...]
    copies: tuple[Copy, ...]  # in wave order, then host name
    port: int = SEED_PORT

    @property
    def waves(self) -> int:
        """Number of waves (operations) the deploy needs: 0 when every host holds a copy."""
        return max((c.wave for c in self.copies), default=-1) + 1

    @property
    def mirror_copies(self) -> int:
        return sum(c.from_mirror for c in self.copies)

    def copy_for(self, name: str) -> Copy | None:
        return next((c for c in self.copies if c.host == name), None)

    def seeds(self, name: str) -> list[Copy]:
        """The copies `name` serves."""
        return [c for c in self.copies if c.source == name]

    def outside_seeds(self) -> list[Member]:
        """The seeds outside this run's --limit that serve somebody."""
        return [m for m in self.members if not m.in_run and self.seeds(m.name)]

    def seed_start_wave(self, name: str) -> int | None:
        """The wave operation in which `name` starts its seed server: the one in which its own copy
        arrives (it serves from the next wave on), or wave 0 for a host that held a copy already."""
        if not self.seeds(name):
            return None
        own = self.copy_for(name)
        return own.wave if own else 0

    def lines(self) -> list[str]:
        """The plan as printed: one line per copy with its reason, then the totals."""
        out = []
        outside = {m.name for m in self.outside_seeds()}
        for c in self.copies:
            source = "the mirror" if c.from_mirror else f"{c.source} ({c.source_address}:{self.port})"
            out.append(f"wave {c.wave}: {c.host} <- {source}: {c.reason}"
                       + (" (outside --limit: its seed server is started from the controller)" if c.source in outside else ""))
        for m in self.members:
            if m.has_copy and not self.seeds(m.name) and m.in_run:
                out.append(f"        {m.name}: holds a verified copy, nothing to do")
        hosts = sum(m.in_run for m in self.members)
        seeds = f" (+{len(self.members) - hosts} seed(s) outside --limit)" if hosts < len(self.members) else ""
        out.append(f"{hosts} host(s){seeds}, {self.waves} wave(s), {self.mirror_copies} copy(ies) over the WAN "
                   f"(ideal for {hosts}: {ideal_waves(hosts)} wave(s), 1 WAN copy)")
        return out


def ideal_waves(hosts: int) -> int:
    return 0 if hosts <= 0 else 1 + math.ceil(math.log2(hosts))


def plan_waves(members: list[Member] | tuple[Member, ...], port: int = SEED_PORT) -> FanoutPlan:
    """The waves for a group: sorted by host name so every host of the run computes the same plan."""
    members = tuple(sorted(members, key=lambda m: m.name))
    if len({m.name for m in members}) != len(members):
        raise ValueError("a fan-out group lists a host twice")
    if any(not m.in_run and not m.has_copy for m in members):
        raise ValueError("a host outside the run is a member only as a seed (with a verified copy)")
    need = [m for m in members if not m.has_copy]
    seeds = [m for m in members if m.has_copy and m.address]
    since: dict[str, str] = {m.name: "held a verified copy before this deploy" for m in seeds}
    copies: list[Copy] = []
    if need and not seeds:
        # the one WAN transfer: prefer a host that can pass the copy on (has a lab address)
        first = next((m for m in need if m.address), need[0])
        need.remove(first)
        why = "no host holds a verified copy: the one transfer over the WAN"
        if not first.address:
            why += " (no host has a lab address to seed from: all fetch from the mirror)"
        copies.append(Copy(first.name, 0, MIRROR, None, why))
        if first.address:
            seeds.append(first)
            since[first.name] = "verified in wave 0"
    for m in [m for m in need if not m.address]:
        # a seed admits only its planned peers' addresses: one without a known address cannot be let in
        need.remove(m)
        copies.append(Copy(m.name, 0, MIRROR, None, "no lab address (ssh_hostname as an IP) for a seed to admit"))
    wave = 1
    while need:
        if not seeds:
            for m in need:
                copies.append(Copy(m.name, wave, MIRROR, None, "no holder has a lab address to seed from"))
            break
        fresh = []
        for seed in list(seeds):
            if not need:
                break
            m = need.pop(0)
            copies.append(Copy(m.name, wave, seed.name, seed.address,
                               f"{seed.name} {since[seed.name]}; falls back to the mirror if the seed fails"))
            if m.address:
                fresh.append(m)
                since[m.name] = f"verified in wave {wave}"
        seeds += fresh
        wave += 1
    return FanoutPlan(members, tuple(copies), port)


# ---------------------------------------------------------------- the commands on a host

def seed_peers(plan: FanoutPlan, name: str) -> list[str]:
    """The addresses `name`'s seed admits: the hosts the plan has it serve."""
    return sorted({next(m.address for m in plan.members if m.name == c.host) for c in plan.seeds(name)})


def seed_max_s(plan: FanoutPlan, name: str, total_bytes: int) -> int:
    """RuntimeMaxSec of `name`'s seed: the planned waves it serves, each budgeted one copy at
    SEED_MIN_RATE plus slack. The last wave's operation stops it; this only bounds a seed that a
    failed or killed deploy left behind."""
    start = plan.seed_start_wave(name) or 0
    waves = max(1, plan.waves - start - 1)  # started in wave `start`, it serves the waves after it
    return int(waves * (SEED_WAVE_SLACK_S + total_bytes / SEED_MIN_RATE))


def seed_start_commands(seed_argv: list[str], revision_dir: str, address: str, peers: list[str], token_file: str,
                        user: str, max_s: int, hide: str, port: int = SEED_PORT, pythonpath: str | None = None) -> list[str]:
    """Start the seed server and wait until it listens. A transient unit: the service user (it
    reads the root:user 0750 models dir through its group), no capability, the whole of `hide`
    (the service's state dir) replaced by an empty read-only tmpfs in which only `revision_dir`
    is mounted back, read-only; its peers' (and its own, for the readiness probe) addresses only.
    `seed_argv` runs the seed server (qwen27b_onhost.mirror), with `pythonpath` in its environment."""
    props = [f"User={user}", f"Group={user}", f"RuntimeMaxSec={max_s}",
             "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes", "PrivateMounts=yes",
             f"TemporaryFileSystem={hide}:ro", f"BindReadOnlyPaths={revision_dir}",
             "NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectKernelTunables=yes", "ProtectKernelModules=yes",
             "ProtectKernelLogs=yes", "ProtectControlGroups=yes", "ProtectClock=yes", "ProtectHostname=yes",
             "ProtectProc=invisible", "RestrictNamespaces=yes", "RestrictRealtime=yes", "RestrictSUIDSGID=yes",
             "LockPersonality=yes", "MemoryDenyWriteExecute=yes", "SystemCallArchitectures=native",
             "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged @resources",
             "SystemCallErrorNumber=EPERM", "RestrictAddressFamilies=AF_INET AF_INET6", "UMask=0077",
             "IPAddressDeny=any", f"IPAddressAllow={' '.join([address, *peers])}",
             "Environment=PYTHONDONTWRITEBYTECODE=1", *([f"Environment=PYTHONPATH={pythonpath}"] if pythonpath else [])]
    run = ["systemd-run", f"--unit={SEED_UNIT}", "--collect", "--quiet",
           *[f"--property={p}" for p in props],
           *seed_argv, revision_dir, "--host", address, "--port", str(port), "--token-file", token_file,
           *[arg for peer in peers for arg in ("--allow", peer)]]
    wait = ("import socket, sys, time; "
            f'up = lambda: socket.socket({"socket.AF_INET6" if ":" in address else "socket.AF_INET"}).connect_ex'
            f'(("{address}", {port})) == 0; '
            f"sys.exit(0 if any(up() or time.sleep(0.1) for _ in range(150)) else "
            f'"the seed server did not listen on {address}:{port} within 15 s")')
    return [seed_stop_command(),
            shlex.join(run),
            f"python3 -c {shlex.quote(wait)}"]


def seed_stop_command(token_file: str | None = None) -> str:
    """Stop the seed (if any) and, at the end of the fan-out, remove the run's token file."""
    stop = f"systemctl stop {SEED_UNIT} 2>/dev/null || true; systemctl reset-failed {SEED_UNIT} 2>/dev/null || true"
    return stop + (f"; rm -f {shlex.quote(token_file)}" if token_file else "")


def fetch_command(fetch: str, copy: Copy, mirror_base: str, safe_name: str, port: int = SEED_PORT,
                  proxy_env: str = "", token_file: str | None = None) -> str:
    """`fetch` is the qwen27b-fetch command line less its --base. A peer is on the lab LAN: reached
    without the proxy, with the run's token (read from `token_file`; the mirror never sees it); if
    it fails, the mirror completes the copy (resuming the part files)."""
    from_mirror = f"{proxy_env}{fetch} --base {mirror_base}"
    if copy.from_mirror:
        return from_mirror
    peer = f"{http_base(copy.source_address, port)}/{safe_name}"
    token = f" --token-file {shlex.quote(token_file)}" if token_file else ""
    notice = shlex.quote(f"qwen27b: seed {copy.source} failed; the mirror completes the copy")
    return (f"no_proxy='*' NO_PROXY='*' {fetch} --base {shlex.quote(peer)}{token} || "
            f"{{ echo {notice} >&2; {from_mirror}; }}")
