"""Who holds the service's port: the API key goes only to a listener of the unit's own processes.

Any local user can bind the service's port while vLLM is not holding it (a restart, a crash loop,
`qwen27b qualify` stopping the service) and answer 200: before this check, the health check and the
warm-up sent ``Authorization: Bearer <key>`` to whoever answered (issue 51 item 2). Now a key is sent
only when every socket in LISTEN state that a connection to the URL's address and port can reach
(the exact address, the wildcard of its family, and ``[::]`` for an IPv4 address) belongs to the
unit's MainPID or one of its descendants; otherwise the caller names the holder (CRITICAL) and
sends nothing.

Why this channel and not another:

- ``/proc/net/tcp`` and ``/proc/net/tcp6`` list every TCP socket of the network namespace with its
  state, its owner's uid and its inode, readable by any user; the health unit's hardening keeps
  them (ProcSubset= is off; PrivateNetwork= is off, so its namespace is the service's).
  ``ss``/sock_diag would need AF_NETLINK, which the health unit's RestrictAddressFamilies= leaves out.
- ``/proc/<pid>/fd`` maps an inode to a process. The kernel lets a process read another's fd table
  when ptrace's read check passes: same uid and gid, the target dumpable, no capability the reader
  lacks. The health unit and the warm-up (ExecStartPost of the service unit) run as the service
  user and group (User=/Group= in both templates), so the service's own processes are readable;
  ProtectProc=invisible hides other users' processes, which is why a squatter of another user is
  named by the uid /proc/net/tcp gives (its pid where its fd table is readable, e.g. one of the
  service user's own processes that is not the unit's).
- MainPID comes from systemd: ``systemctl show -p MainPID`` (unit.show_argv, over D-Bus on AF_UNIX,
  as the health check already asks for ActiveState) or, for the warm-up, ``$MAINPID`` that
  systemd sets for ExecStartPost=. No MainPID (0, unknown unit): nothing is ours, no key is sent.
- Descendants: each visible ``/proc/<pid>/stat``'s parent pid (vLLM's API server may hand the
  socket to child processes, e.g. ``--api-server-count``).

What stays true (docs/security.md): between this check and the request a few milliseconds pass;
if vLLM dies in exactly that window and another process binds the port in it, that process gets
the key. While vLLM holds the port no other user can bind it (Linux refuses a second LISTEN on an
address a listener holds, and SO_REUSEPORT groups need the same uid).

Pure parts (:func:`parse_net_tcp`, :func:`parse_stat_ppid`, :func:`descendants`,
:func:`candidates`, :func:`judge`) take the files' text and are unit-tested with recorded /proc
formats; :func:`check_owner` reads the real /proc.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import urllib.parse

LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN = 10
PROC = "/proc"


# ------------------------------------------------------------------------------- pure parts

def _hex_address(text: str) -> ipaddress._BaseAddress:
    """/proc/net/tcp's address: the 32-bit words of the address as the kernel stores them, each
    printed as host-order hex (little-endian here: x86_64 and ppc64le, the hosts qwen27b runs on)."""
    raw = bytes.fromhex(text)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(swapped)


def parse_net_tcp(text: str) -> list[dict]:
    """/proc/net/tcp or tcp6 text -> [{address, port, state, uid, inode}] (the header and malformed
    lines skipped)."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        addr, _, port = fields[1].partition(":")
        try:
            out.append({"address": _hex_address(addr), "port": int(port, 16), "state": fields[3],
                        "uid": int(fields[7]), "inode": int(fields[9])})
        except ValueError:
            continue
    return out


def parse_stat_ppid(text: str) -> int | None:
    """/proc/<pid>/stat -> its parent pid (the field after the state, after the last ')': the
    command name may itself hold spaces and parentheses)."""
    rest = text.rpartition(")")[2].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every process below it, from {pid: ppid}."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def reachable(address: ipaddress._BaseAddress, bound: ipaddress._BaseAddress) -> bool:
    """Would a connection to `address` reach a socket bound to `bound`? The same address, the
    wildcard of its family, or [::] (or ::ffff:a.b.c.d) for an IPv4 address (a dual-stack socket)."""
    if bound == address:
        return True
    if address.version == 4:
        return bound == ipaddress.ip_address("0.0.0.0") or bound == ipaddress.ip_address("::") or \
            (bound.version == 6 and bound.ipv4_mapped == address)
    return bound == ipaddress.ip_address("::")


def candidates(sockets: list[dict], addresses: list, port: int) -> list[dict]:
    """The LISTEN sockets a connection to any of `addresses` at `port` may reach."""
    return [s for s in sockets if s["state"] == LISTEN and s["port"] == port
            and any(reachable(a, s["address"]) for a in addresses)]


def judge(found: list[dict], ours: set[int], holders: dict[int, list[dict]]) -> dict:
    """-> {"ours": bool, "listening": bool, "holders": [...], "text": str}. `found` are the
    candidate sockets, `ours` the inodes the unit's processes hold, `holders` {inode: [{pid, name}]}
    for the others, as far as readable."""
    if not found:
        return {"ours": False, "listening": False, "holders": [], "text": "nothing listens there"}
    foreign = [s for s in found if s["inode"] not in ours]
    if not foreign:
        return {"ours": True, "listening": True, "holders": [], "text": "the unit's own process listens there"}
    named = []
    for s in foreign:
        procs = holders.get(s["inode"]) or []
        named.append({"uid": s["uid"], "user": _user(s["uid"]), "address": str(s["address"]), "port": s["port"],
                      "processes": procs})
    return {"ours": False, "listening": True, "holders": named, "text": "; ".join(_describe(h) for h in named)}


def _user(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def _describe(holder: dict) -> str:
    who = f"user {holder['user']} (uid {holder['uid']})" if holder["user"] else f"uid {holder['uid']}"
    procs = ", ".join(f"pid {p['pid']} ({p['name']})" for p in holder["processes"])
    where = f"{holder['address']}:{holder['port']}"
    return (f"{procs} of {who} listens on {where}" if procs
            else f"a process of {who} listens on {where} (its pid is not visible to this check)")


def main_pid_of(properties: dict) -> int | None:
    """systemd's MainPID from `systemctl show` (0, absent or garbage: None, the unit runs no process)."""
    value = str(properties.get("MainPID", ""))
    return int(value) if value.isdigit() and int(value) > 0 else None


# ------------------------------------------------------------------------------- readings

def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _pids(proc: str) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


def socket_inodes(pid: int, proc: str = PROC) -> set[int]:
    """The socket inodes in /proc/<pid>/fd ({} when it is not readable: another user's process)."""
    out = set()
    base = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            out.add(int(target[8:-1]))
    return out


def url_addresses(url: str) -> tuple[list, int]:
    """The URL's addresses (an IP literal; a name is resolved) and port."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    try:
        return [ipaddress.ip_address(host)], port
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return [], port
    return sorted({ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos}, key=str), port


def check_owner(url: str, main_pid: int | None, proc: str = PROC) -> dict:
    """Does the process tree of `main_pid` hold every listener a request to `url` may reach?
    judge()'s dict, plus "main_pid"."""
    addresses, port = url_addresses(url)
    sockets = parse_net_tcp(_read(f"{proc}/net/tcp")) + parse_net_tcp(_read(f"{proc}/net/tcp6"))
    found = candidates(sockets, addresses, port)
    parents = {}
    for pid in _pids(proc):
        ppid = parse_stat_ppid(_read(f"{proc}/{pid}/stat"))
        if ppid is not None:
            parents[pid] = ppid
    tree = descendants(main_pid, parents) if main_pid else set()
    ours: set[int] = set()
    for pid in tree:
        ours |= socket_inodes(pid, proc)
    wanted = {s["inode"] for s in found} - ours
    holders: dict[int, list[dict]] = {}
    if wanted:
        for pid in sorted(parents):
            held = socket_inodes(pid, proc) & wanted
            for inode in held:
                name = _read(f"{proc}/{pid}/comm").strip() or "?"
                holders.setdefault(inode, []).append({"pid": pid, "name": name})
    out = judge(found, ours, holders)
    if out["listening"] and not out["ours"] and not main_pid:
        out["text"] += " (the unit has no main process: it is not running)"
    return {**out, "main_pid": main_pid}


def main(argv=None) -> int:
    """`python -m qwen27b_onhost.listener --url URL --unit UNIT`: exit 0 when the unit's own process
    holds every listener there, else 1 with one `#` line (a comment in Prometheus text) naming the
    holder; for shell callers that send a key after it (doctor's /metrics read on the host)."""
    import argparse
    import subprocess

    from .unit import parse_show, show_argv
    p = argparse.ArgumentParser(prog="qwen27b-listener", description=main.__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--unit", required=True)
    args = p.parse_args(argv)
    try:
        shown = subprocess.run(show_argv(args.unit, ("MainPID",)), capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        shown = ""
    owner = check_owner(args.url, main_pid_of(parse_show(shown)))
    if owner["ours"]:
        return 0
    print(f"# qwen27b: the API key is not sent to {args.url}: not {args.unit}'s process: {owner['text']}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
