"""Weights fan-out: which host gets the checkpoint from where, wave by wave (pure; no pyinfra).

With `qwen27b_weights_fanout: "tree"` and `qwen27b_model_source: "mirror"` the checkpoint crosses
the WAN (the lab mirror) once: wave 0 is one host fetching from the mirror; in wave k every host
that holds a verified copy seeds one host that has none, so the holders double (1 -> 2 -> 4 -> 8)
and N hosts are done after 1 + ceil(log2 N) waves. Hosts that already hold a verified copy when
the deploy starts seed from wave 1 on, and then nothing crosses the WAN at all.

A seed serves its models dir read-only over HTTP (qwen27b/mirror.py, Range requests honoured) on
its lab address, in a transient sandboxed unit that stops itself after `SEED_MAX_S`; the receiver
runs the same qwen27b-fetch as for the mirror (resume from the part file, sha256 of every file
against the *mirror's* manifest, so a seed cannot hand out a bad copy) and falls back to the
mirror if its seed fails, resuming from what the seed had already sent.

The deploy (roles/weights.py) adds one operation per wave; pyinfra runs an operation on all its
hosts before the next starts, which gives the ordering: a seed's copy is verified and its server
listening before the wave that reads from it begins.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

MODES = ("none", "tree")
SEED_PORT = 8801  # the seeds' HTTP port on their lab address, only while the fan-out runs
SEED_UNIT = "qwen27b-seed.service"
SEED_MAX_S = 3600  # a seed left behind by a killed deploy stops itself after this
MIRROR = "mirror"


@dataclass(frozen=True)
class Member:
    """One host of a fan-out group: its inventory name, its lab address (None: it can receive
    but cannot seed) and whether it already holds a verified copy."""

    name: str
    address: str | None = None
    has_copy: bool = False


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
        for c in self.copies:
            source = "the mirror" if c.from_mirror else f"{c.source} ({c.source_address}:{self.port})"
            out.append(f"wave {c.wave}: {c.host} <- {source}: {c.reason}")
        for m in self.members:
            if m.has_copy and not self.seeds(m.name):
                out.append(f"        {m.name}: holds a verified copy, nothing to do")
        hosts = len(self.members)
        out.append(f"{hosts} host(s), {self.waves} wave(s), {self.mirror_copies} copy(ies) over the WAN "
                   f"(ideal for {hosts}: {ideal_waves(hosts)} wave(s), 1 WAN copy)")
        return out


def ideal_waves(hosts: int) -> int:
    return 0 if hosts <= 0 else 1 + math.ceil(math.log2(hosts))


def plan_waves(members: list[Member] | tuple[Member, ...], port: int = SEED_PORT) -> FanoutPlan:
    """The waves for a group: sorted by host name so every host of the run computes the same plan."""
    members = tuple(sorted(members, key=lambda m: m.name))
    if len({m.name for m in members}) != len(members):
        raise ValueError("a fan-out group lists a host twice")
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

def seed_start_commands(seed_tool: str, models_dir: str, address: str, port: int = SEED_PORT) -> list[str]:
    """Start the seed server (a transient unit, sandboxed: read-only file system, only the
    capability to read the 0750 models dir, stops itself after SEED_MAX_S) and wait until it listens."""
    props = ["RuntimeMaxSec=%d" % SEED_MAX_S, "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
             "NoNewPrivileges=yes", "CapabilityBoundingSet=CAP_DAC_READ_SEARCH",
             "RestrictAddressFamilies=AF_INET AF_INET6", "Environment=PYTHONDONTWRITEBYTECODE=1"]
    run = ["systemd-run", f"--unit={SEED_UNIT}", "--collect", "--quiet",
           *[f"--property={p}" for p in props],
           "python3", seed_tool, models_dir, "--host", address, "--port", str(port)]
    wait = ("import socket, sys, time; "
            f'up = lambda: socket.socket().connect_ex(("{address}", {port})) == 0; '
            f"sys.exit(0 if any(up() or time.sleep(0.1) for _ in range(150)) else "
            f'"the seed server did not listen on {address}:{port} within 15 s")')
    return [f"systemctl stop {SEED_UNIT} 2>/dev/null || true; systemctl reset-failed {SEED_UNIT} 2>/dev/null || true",
            shlex.join(run),
            f"python3 -c {shlex.quote(wait)}"]


def seed_stop_command() -> str:
    return f"systemctl stop {SEED_UNIT} 2>/dev/null || true; systemctl reset-failed {SEED_UNIT} 2>/dev/null || true"


def fetch_command(fetch: str, copy: Copy, mirror_base: str, safe_name: str, port: int = SEED_PORT,
                  proxy_env: str = "") -> str:
    """`fetch` is the qwen27b-fetch command line less its --base. A peer is on the lab LAN: reached
    without the proxy; if it fails, the mirror completes the copy (resuming the part files)."""
    from_mirror = f"{proxy_env}{fetch} --base {mirror_base}"
    if copy.from_mirror:
        return from_mirror
    peer = f"http://{copy.source_address}:{port}/{safe_name}"
    notice = shlex.quote(f"qwen27b: seed {copy.source} failed; the mirror completes the copy")
    return (f"no_proxy='*' NO_PROXY='*' {fetch} --base {peer} || "
            f"{{ echo {notice} >&2; {from_mirror}; }}")
