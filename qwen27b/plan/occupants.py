"""Something else already serves on the port or holds the GPUs (issue 24): an old vLLM or Ollama
container on 0.0.0.0:8000 with most of each GPU's memory. The new unit could not bind, and the old
server would answer its start-up probe; the memory plan assumes whole GPUs. The Occupants fact
(controller/facts.py) reads the listeners, the GPUs' compute processes and each one's systemd
unit; the gate refuses naming them, before anything is installed. qwen27b's own units are not
occupants: a converged host is re-deployed over itself.

Besides vLLM's port, the deploy binds the health endpoint's (a systemd socket unit), node_exporter's
(with qwen27b_node_exporter) and the fan-out seed server's (with qwen27b_weights_fanout): `Bound`
says each, with the units that are its own there. A socket unit's listener belongs to systemd
(pid 1) in ss: `systemctl list-sockets` names the unit behind it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple

from qwen27b.plan.gpufacts_parse import nvml_library_version
from qwen27b.plan.hostfacts_parse import FactParseError, numbered_lines

_SECTION = re.compile(r"^== (listen|gpu|units|sockets)$")
# ss -Hltnp: State Recv-Q Send-Q Local:Port Peer:Port [users:(("name",pid=N,fd=M),...)]
_SS = re.compile(r"^LISTEN\s+\d+\s+\d+\s+(?P<local>\S+):(?P<port>\d+)\s+\S+(?:\s+users:\((?P<users>.*)\))?\s*$")
_SS_USER = re.compile(r'\("(?P<name>[^"]*)",pid=(?P<pid>\d+),fd=\d+\)')
# nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_bus_id --format=csv,noheader,nounits
_APP = re.compile(r"^(?P<pid>\d+), (?P<name>.*?), (?P<mib>\d+|\[N/A\]|\[Not Supported\]), (?P<bus>[0-9A-Fa-f:.]+)$")
_UNIT = re.compile(r"^(?P<pid>\d+) (?P<unit>\S+) ?(?P<comm>.*)$")
# systemctl list-sockets --no-legend --full: LISTEN UNIT ACTIVATES; LISTEN may be a path or "kobject-uevent 1"
_SOCKET = re.compile(r"^(?P<listen>.+?)\s+(?P<unit>\S+\.socket)(?:\s+.*)?$")
_PORT = re.compile(r":(?P<port>\d+)$")


class Bound(NamedTuple):
    """A port the deploy binds besides vLLM's: where, what binds it (for the message), the key or
    step that moves it, and the units that are its own there (a re-deploy over itself)."""

    port: int
    address: str
    what: str
    move: str
    ours: frozenset
# nvidia-smi without a driver, or with no apps, prints these on stdout: nothing holds a GPU then
_NO_APPS = ("No running processes found", "NVIDIA-SMI has failed", "Failed to initialize NVML", "No devices were found")


def parse_occupants(output: list[str]) -> dict | None:
    """{"listen": [{address, port, process, pid}], "gpu": [{pid, process, used_mib, bus_id}],
    "units": {pid: {"unit", "comm"}}, "sockets": {port: [socket units]}}; None for no output (not
    read). Recordings made before the sockets section have none: {}."""
    fact = "Occupants"
    lines = numbered_lines(output)
    if not lines:
        return None
    found: dict = {"listen": [], "gpu": [], "units": {}, "sockets": {}}
    section = None
    for n, line in lines:
        head = _SECTION.match(line.strip())
        if head:
            section = head[1]
            continue
        if section is None:
            raise FactParseError(fact, n, "'== listen' first", line)
        if section == "listen":
            match = _SS.match(line.strip())
            if not match:
                raise FactParseError(fact, n, "an `ss -Hltnp` LISTEN line", line)
            users = _SS_USER.findall(match["users"] or "") or [(None, None)]
            for name, pid in users:
                found["listen"].append({"address": match["local"].strip("[]"), "port": int(match["port"]),
                                        "process": name, "pid": int(pid) if pid else None})
        elif section == "gpu":
            if line.strip().startswith(_NO_APPS) or nvml_library_version(line) is not None:
                continue  # no driver, no apps, or NVML's failure (its two-line mismatch form too)
            match = _APP.match(line.strip())
            if not match:
                raise FactParseError(fact, n, "'<pid>, <process name>, <MiB>, <bus id>'", line)
            found["gpu"].append({"pid": int(match["pid"]), "process": match["name"],
                                 "used_mib": int(match["mib"]) if match["mib"].isdigit() else None,
                                 "bus_id": match["bus"]})
        elif section == "units":
            match = _UNIT.match(line.strip())
            if not match:
                raise FactParseError(fact, n, "'<pid> <unit> <command>'", line)
            found["units"][int(match["pid"])] = {"unit": match["unit"], "comm": match["comm"] or None}
        else:
            match = _SOCKET.match(line.strip())
            if not match:
                raise FactParseError(fact, n, "a `systemctl list-sockets` line (LISTEN UNIT ACTIVATES)", line)
            port = _PORT.search(match["listen"])
            if port:  # a TCP/UDP listener; paths and netlink sockets bind no port
                units = found["sockets"].setdefault(int(port["port"]), [])
                units += [] if match["unit"] in units else [match["unit"]]
    return found


def _ours(unit: str | None) -> bool:
    return bool(unit) and (unit.startswith("qwen27b.") or unit.startswith(("qwen27b@", "qwen27b-")))


def _units(occ: dict, entry: dict) -> list[str] | None:
    """The units behind a listener: its process's, or for systemd's own (pid 1: a socket unit) the
    socket units on that port; None when pid 1's are not known (a recording without list-sockets)."""
    if _systemds(entry):
        return list(occ.get("sockets", {}).get(entry["port"], [])) or None
    return [occ["units"].get(entry["pid"], {}).get("unit") or ""]


def _systemds(entry: dict) -> bool:
    """PID 1's listener, or a child PID 1 has just forked to start a socket-activated service (still
    named "systemd" before its exec, it holds the listening socket for a moment: seen on a test host
    whose health endpoint a gateway polled every second, the rollout refused on our own socket)."""
    return entry["pid"] == 1 or entry.get("process") == "systemd"


def _wildcard(address: str) -> bool:
    return address in ("*", "0.0.0.0", "::")


def _overlaps(listen: str, bind: str) -> bool:
    """Would a bind on `bind` clash with a listener on `listen` (same port)?"""
    if _wildcard(listen) or _wildcard(bind):
        return True
    try:
        return ipaddress.ip_address(listen.split("%")[0]) == ipaddress.ip_address(bind)
    except ValueError:
        return listen == bind


def _who(occ: dict, pid: int | None, name: str | None) -> str:
    if pid is None:
        return "a process ss shows no owner for (not read as root)"
    unit = occ["units"].get(pid, {}).get("unit")
    where = f", {unit}" if unit and unit != "-" else ""
    return f"{name or occ['units'].get(pid, {}).get('comm') or '?'} (pid {pid}{where})"


def _stop_fix(units: list[str]) -> str:
    docker = [u for u in units if u.startswith("docker") or u == "containerd.service"]
    # a container's processes run in the scope docker-<64 hex id>.scope: its id, for docker stop
    ids = sorted({m[1][:12] for u in units if (m := re.fullmatch(r"docker-([0-9a-f]{64})\.scope", u))})
    said = []
    if ids:
        said.append(f"a container: `sudo docker update --restart=no {' '.join(ids)} && sudo docker stop {' '.join(ids)}`")
    elif docker:
        said.append("a container: `sudo docker ps` names it; `sudo docker update --restart=no <name> && sudo docker "
                    "stop <name>`")
    services = sorted({u for u in units if u.endswith((".service", ".socket"))
                       and u not in ("docker.service", "containerd.service")})
    if services:
        said.append(f"`sudo systemctl disable --now {' '.join(services)}`")
    if not said:
        said.append("stop that process")
    return "; ".join(said)


def _clash(occ: dict, port: int, bind: str, ours) -> list[dict]:
    """The listeners on `port` a bind on `bind` would clash with, not of `ours` (a unit -> bool);
    systemd's own (pid 1) only where list-sockets names a socket unit that is not ours."""
    out = []
    for entry in occ["listen"]:
        if entry["port"] != port or not _overlaps(entry["address"], bind):
            continue
        units = _units(occ, entry)
        if units is not None and not all(ours(unit) for unit in units):
            out.append(entry)
    return out


def _where(occ: dict, clash: list[dict], port: int) -> str:
    def who(e: dict) -> str:
        if e["pid"] == 1:
            return f"systemd's {', '.join(occ['sockets'][port])} (pid 1)"
        return _who(occ, e["pid"], e["process"])
    return ", ".join(sorted({f"{who(e)} on " + (f"[{e['address']}]" if ":" in e["address"] else e["address"])
                             + f":{port}" for e in clash}))


def occupied(occ: dict | None, port: int, bind: str, gpus: list, gpu_bus_ids: dict,
             also: tuple[Bound, ...] | list[Bound] = ()) -> list[tuple[str, str]]:
    """(cause, fix) for each foreign listener on `port` where the service binds, on each port of
    `also` (the other listeners the deploy adds), and for the foreign processes holding memory on
    the GPUs it serves on (`gpu_bus_ids`: index -> nvidia-smi bus id)."""
    if not occ:
        return []
    out = []
    clash = _clash(occ, port, bind, _ours)
    if clash:
        who = _where(occ, clash, port)
        # the container behind a docker-proxy: the one holding the GPUs, where one does
        units = [u for e in clash for u in _units(occ, e) or []] + [
            occ["units"].get(a["pid"], {}).get("unit") or "" for a in occ["gpu"]]
        out.append((f"port {port} is already served by {who}: the new service could not bind it, and the old "
                    "server would answer its start-up probe",
                    f"stop it first ({_stop_fix(units)}), or serve on another port with qwen27b_port"))
    for bound in also:
        clash = _clash(occ, bound.port, bound.address, lambda unit, b=bound: _ours(unit) or unit in b.ours)
        if clash:
            units = [u for e in clash for u in _units(occ, e) or []]
            out.append((f"port {bound.port} is already served by {_where(occ, clash, bound.port)}: {bound.what} "
                        "could not bind it", f"stop it first ({_stop_fix(units)}), or {bound.move}"))

    def slot(bus_id: str | None) -> str:  # nvidia-smi pads the PCI domain to 8 digits in one place, 4 in another
        return str(bus_id or "").lower().split(":", 1)[-1]

    serving = {slot(gpu_bus_ids.get(g.index)): g.index for g in gpus if gpu_bus_ids.get(g.index)}
    holders = [app for app in occ["gpu"] if slot(app["bus_id"]) in serving
               and not _ours(occ["units"].get(app["pid"], {}).get("unit"))]
    if holders:
        who = "; ".join(f"GPU {serving[slot(a['bus_id'])]}: {_who(occ, a['pid'], a['process'])}"
                        + (f" holds {a['used_mib']} MiB" if a["used_mib"] is not None else "") for a in holders)
        units = [occ["units"].get(a["pid"], {}).get("unit") or "" for a in holders]
        out.append((f"other processes hold the GPUs this host would serve on ({who}): the memory plan counts "
                    "whole GPUs, so vLLM would fail at start-up for memory",
                    f"stop them first ({_stop_fix(units)}), or leave those GPUs out with qwen27b_gpu_indices"))
    return out
