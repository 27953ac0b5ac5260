"""`qwen27b status`: one line per host of the fleet, every host read at once.

    qwen27b status INVENTORY [--json] [--limit HOST ...] [--reports DIR] [--timeout S] [--parallel N]

For each host: the service (systemd's ActiveState/SubState and NRestarts of qwen27b.service),
the health check's last verdict and its age (its status file, /var/lib/qwen27b/health.json),
the current release (the `current` release symlink: the release hash), the model revision (the
`models/current` symlink), the GPUs (nvidia-smi's name and memory; "none" without nvidia-smi)
and the last verify (the newest deploy report under reports/ on this controller naming the host:
the verify role writes no marker on the host), with its comparison against the host's previous
release (decode tok/s, TTFT, acceptance: qwen27b/plan/regression.py), figures below the table. A
gateway host (the qwen27b_gateway group) shows its gateway unit and its pool instead: the backends
in it and those drained. A host serving copies (qwen27b_instances) gets a row per copy below its
own: qwen27b@NAME.service's state and its health check's verdict (health@NAME.json). Hosts on one
release whose units start vLLM with different flags (a rollback restores the previous deploy's) get a
NOTE naming the flags that differ. doctor stays the deep, one-host tool.

Hosts are reached through pyinfra's own connectors with the inventory read as the deploy reads
it (qwen27b.controller.remote): ssh_port, ssh_user, ssh_key, ssh_password, _sudo, @local, @fake. One
read-only command per host (a small sh script printing sections between nonce markers), all
hosts in parallel. A host that cannot be reached is a row "unreachable: <why>", the others are
still listed, and the exit code is 1 (also when a host answered but its script did not run);
2 for a bad inventory or --limit.

`commands()` (what runs), `parse()` (its output -> a `HostStatus`, pure) and `last_verifies()`
(the controller's reports) are separate from the I/O, so the parsing is unit-tested on recorded
outputs (tests/fixtures/status/).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from qwen27b.controller import remote
from qwen27b.controller.gateway_render import GATEWAY_UNIT, layout as gateway_layout
from qwen27b.controller.report import reports_dir, table
from qwen27b.onhost.contract import SERVICE_UNIT
from qwen27b.plan.chatpage import UNIT as CHAT_PAGE_UNIT
from qwen27b.onhost.unit import parse_show, show_command
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan.modelsdir import host_paths
from qwen27b.plan.stack import load_stack

UNIT = SERVICE_UNIT
SERVICE_UNIT_FILE = HostLayout.unit_file(UNIT)
SPEC_FLAG = re.compile(r"--speculative-config\s+'?(\{[^']*\})")
UNIT_PROPS = ("LoadState", "ActiveState", "SubState", "NRestarts")
POWER_FIELDS = "index,persistence_mode,power.limit,ecc.mode.current,ecc.mode.pending"
HEALTH_MAX_BYTES = 262144  # the status file is a few KiB (20 verdicts of history); bound what we read


def commands(paths: dict) -> dict[str, str]:
    """Section key -> read-only shell command. Every path is shell-quoted."""
    q, at = shlex.quote, HostLayout.of(paths)
    return {
        "now": "date +%s",
        "unit": remote.guard("systemctl", show_command(UNIT, UNIT_PROPS)),
        "health": f"head -c {HEALTH_MAX_BYTES} {q(at.health_status)}",
        "release": f"readlink {q(at.current_release)}",
        "model": f"readlink {q(at.current_model)}",
        # the engine flags the unit was rendered with: the speculative method in use and the agent parsers
        "engine": f"grep -h -e --speculative-config -e --reasoning-parser {q(SERVICE_UNIT_FILE)}",
        # every engine flag the unit starts vLLM with: one release, different flags after a rollback
        "flags": flags_command(SERVICE_UNIT_FILE),
        "gpus": remote.guard("nvidia-smi", "timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader"),
        # persistence, power cap and ECC as qwen27b-gpu-power.service left them (issue 27)
        "power": remote.guard("nvidia-smi", f"timeout 20 nvidia-smi --query-gpu={POWER_FIELDS} --format=csv,noheader,nounits"),
        # a gateway host (the qwen27b_gateway group) has these instead of the service and its health
        "gateway": remote.guard("systemctl", show_command(GATEWAY_UNIT, UNIT_PROPS)),
        "pool": f"head -c {HEALTH_MAX_BYTES} {q(gateway_layout()['pool_file'])}",
        # its chat page (qwen27b_chat_page): the unit's state, and its URL from the unit's description
        "page": remote.guard("systemctl", show_command(CHAT_PAGE_UNIT, UNIT_PROPS + ("Description",))),
        "copies": copies_command(paths),
    }


def flags_command(unit_file: str) -> str:
    """The unit's ExecStart, one flag a line (render.py writes `--name value \\` lines), up to ExecStartPost."""
    return f"sed -n '/^ExecStart=/,/^ExecStartPost=/p' {shlex.quote(unit_file)}"


HOST_FLAGS = ("--host", "--port")  # a host's own address and port: expected to differ between hosts
COPY_NAME = re.compile(r"^[a-z0-9-]{1,16}$")  # qwen27b.plan.copykeys.INSTANCE_NAME


WANTS_DIR = "/etc/systemd/system/multi-user.target.wants"


def copies_command(paths: dict, wants: str = WANTS_DIR) -> str:
    """Each enabled copy (its link in multi-user.target.wants, as `systemctl enable` made it): a line
    `copy NAME`, its unit's properties each prefixed `unit `, and `health ` with its status file on one
    line (JSON needs no newline; a read error lands there too, and reads as no status file)."""
    q = shlex.quote
    prefix, _, suffix = HostLayout.of(paths).copy_health_status("NAME").partition("NAME")
    status = f"{q(prefix)}\"$n\"{q(suffix)}"
    copy_unit = show_command('"qwen27b@$n.service"', UNIT_PROPS, expand=True)  # the loop's copy $n
    return (f"for f in {q(wants)}/qwen27b@*.service; do [ -e \"$f\" ] || continue; "
            "n=${f##*/qwen27b@}; n=${n%.service}; echo \"copy $n\"; "
            f"{copy_unit} 2>/dev/null | sed 's/^/unit /'; "
            f"printf 'health '; head -c {HEALTH_MAX_BYTES} {status} 2>&1 | tr -d '\\n'; echo; done")


@dataclass
class HostStatus:
    """One host's row. `reach`: ok | unreachable | error (answered, but the script did not run)."""

    host: str
    reach: str = "ok"
    error: str = ""
    load_state: str = ""  # systemd LoadState: loaded / not-found ("" when unknown)
    active: str = "unknown"  # ActiveState (what `systemctl is-active` prints)
    sub: str = ""
    unit_note: str = ""  # why the unit's state is unknown
    restarts: int | None = None
    health: str = "unknown"  # the check's verdict OK / WARNING / CRITICAL / UNKNOWN, or unknown
    health_time: str | None = None
    health_age_s: float | None = None
    health_note: str = ""  # why the verdict is unknown
    speculative: str = "unknown"  # from the unit's --speculative-config: "mtp k=7", "dflash2 k=7", "off"
    agent_parsers: bool | None = None  # the unit has --reasoning-parser
    flags: list[str] = field(default_factory=list)  # the unit's engine flags ("--name value"), less HOST_FLAGS
    release: str = "none"
    release_path: str = ""
    model: str = "none"  # org/name@revision
    model_revision: str = ""
    gpu_count: int = 0
    gpus: list[dict] = field(default_factory=list)  # {"name", "memory"}
    gpu_note: str = ""  # nvidia-smi failed: its first line
    power: list[dict] = field(default_factory=list)  # {"index", "persistence", "limit_w", "ecc", "ecc_pending"}
    health_needs: str | None = None  # the health check's "needs": reboot / human (a GPU fault it does not restart for)
    last_verify: dict | None = None  # {"status", "run", "reason", "report"} from the controller's reports
    gateway: dict | None = None  # a gateway host: {"active", "sub", "pool", "drained", "failed_open"}
    copies: list = field(default_factory=list)  # a host serving copies: a HostStatus per copy ("HOST/NAME")
    seconds: float | None = None  # how long this host took to answer

    @property
    def failed(self) -> bool:
        return self.reach != "ok"


def _epoch(iso) -> float | None:
    try:
        stamp = datetime.fromisoformat(str(iso))
    except (TypeError, ValueError):
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _parse_unit(row: HostStatus, text: str | None, code: int | None) -> None:
    if text is None:
        return
    if text.strip() == remote.NOCMD:
        row.unit_note = "no systemctl"
        return
    props = parse_show(text)
    if code or "ActiveState" not in props:
        row.unit_note = f"systemctl: {(text.strip().splitlines() or [f'exit {code}'])[0][:120]}"
        return
    row.load_state = props.get("LoadState", "")
    row.active = props.get("ActiveState") or "unknown"
    row.sub = props.get("SubState", "")
    try:
        row.restarts = int(props["NRestarts"]) if props.get("NRestarts") else None
    except ValueError:
        row.restarts = None


def _parse_health(row: HostStatus, text: str | None, code: int | None, now: float | None) -> None:
    if text is None:
        row.health_note = "not read"
        return
    if code:
        row.health_note = ("no status file" if "No such file" in text
                           else "status file unreadable" if "ermission denied" in text else "status file not read")
        return
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("verdict"), str):
        row.health_note = "corrupt status file"
        return
    verdict = data["verdict"]
    if verdict not in ("OK", "WARNING", "CRITICAL", "UNKNOWN"):
        row.health_note = "corrupt status file"
        return
    row.health = verdict
    row.health_needs = data.get("needs") if data.get("needs") in ("reboot", "human") else None
    row.health_time = data.get("time") if isinstance(data.get("time"), str) else None
    stamp = _epoch(row.health_time)
    if stamp is not None and now is not None:
        row.health_age_s = max(0.0, now - stamp)


def _parse_release(row: HostStatus, text: str | None, code: int | None, releases: str) -> None:
    target = (text or "").strip()
    if code or not target:
        return
    row.release_path = target
    parent, _, name = target.rstrip("/").rpartition("/")
    row.release = name if parent == releases.rstrip("/") or not target.startswith("/") else target


def _parse_model(row: HostStatus, text: str | None, code: int | None) -> None:
    target = (text or "").strip().rstrip("/")
    if code or not target:
        return
    name = target.rpartition("/")[2]
    repo, at, revision = name.rpartition("@")
    if at:  # the weights role's 'org--name@revision' (qwen27b.plan.stack.revision_dir_name)
        row.model, row.model_revision = f"{repo.replace('--', '/', 1)}@{revision}", revision
    else:
        row.model = name


def _parse_engine(row: HostStatus, text: str | None, code: int | None) -> None:
    """grep's lines of the unit: no --speculative-config (exit 1, or no such line) is "off"; no
    unit file (exit 2) or no section leaves "unknown"."""
    if text is None or code not in (0, 1):
        return
    row.agent_parsers = "--reasoning-parser" in text
    found = SPEC_FLAG.search(text)
    if not found:
        row.speculative = "off"
        return
    try:
        config = json.loads(found.group(1))
    except ValueError:
        return
    method = {"dflash": "dflash2"}.get(config.get("method"), str(config.get("method")))
    row.speculative = f"{method} k={config.get('num_speculative_tokens')}"


def _parse_flags(row: HostStatus, text: str | None, code: int | None) -> None:
    """flags_command's lines -> the unit's engine flags as rendered, less the host's own address and port."""
    if text is None or code != 0:
        return
    lines = [line.strip().removesuffix("\\").strip() for line in text.splitlines()]
    row.flags = [line for line in lines if line.startswith("--") and line.split(" ", 1)[0] not in HOST_FLAGS]


def flag_notes(rows: list[HostStatus]) -> list[str]:
    """One note per release that hosts serve with different flags (a rollback restores the previous
    deploy's unit, flags included, while another host keeps the inventory's): the flags not common
    to them all, per host."""
    by_release: dict[str, list[HostStatus]] = {}
    for row in rows:
        if not row.failed and row.flags and row.release not in ("none", "unknown", ""):
            by_release.setdefault(row.release, []).append(row)
    notes = []
    for release, group in by_release.items():
        if len({tuple(r.flags) for r in group}) < 2:
            continue
        common = set.intersection(*(set(r.flags) for r in group))
        each = "; ".join(f"{r.host}: {' '.join(f for f in r.flags if f not in common) or '(none of the others)'}"
                         for r in group)
        notes.append(f"release {release} runs with different flags on {', '.join(r.host for r in group)}: {each} "
                     "(a rollback restores the previous deploy's flags; a deploy renders the inventory's again)")
    return notes


def _parse_gpus(row: HostStatus, text: str | None, code: int | None) -> None:
    if text is None or text.strip() == remote.NOCMD:
        return
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        name, sep, memory = line.rpartition(",")
        if not sep or not name.strip() or not memory.strip():
            parsed = None
            break
        parsed.append({"name": name.strip(), "memory": memory.strip()})
    if code or parsed is None:
        row.gpu_note = f"nvidia-smi: {(lines or [f'exit {code}'])[0][:120]}"
        return
    row.gpus, row.gpu_count = parsed, len(parsed)


def _parse_power(row: HostStatus, text: str | None, code: int | None) -> None:
    """POWER_FIELDS rows; anything else (no nvidia-smi, its failure) leaves the list empty."""
    if text is None or code:
        return
    out = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5 or not fields[0].isdigit():
            continue
        try:
            limit = round(float(fields[2]))
        except ValueError:
            limit = None
        out.append({"index": int(fields[0]), "persistence": fields[1] == "Enabled", "limit_w": limit,
                    "ecc": fields[3] == "Enabled", "ecc_pending": fields[4] == "Enabled"})
    row.power = out


def power_cell(row: HostStatus) -> str:
    """'275 W' or '250-300 W', persistence off and ECC changes named by GPU; "" when not read."""
    if not row.power:
        return ""
    limits = sorted({p["limit_w"] for p in row.power if p["limit_w"] is not None})
    parts = [f"{limits[0]} W" if len(limits) == 1 else f"{limits[0]}-{limits[-1]} W"] if limits else []
    off = [str(p["index"]) for p in row.power if not p["persistence"]]
    if off:
        parts.append(f"persistence off on {','.join(off)}")
    no_ecc = [str(p["index"]) for p in row.power if not p["ecc"]]
    if no_ecc:
        parts.append(f"ECC off on {','.join(no_ecc)}")
    pending = [str(p["index"]) for p in row.power if p["ecc_pending"] != p["ecc"]]
    if pending:
        parts.append(f"ECC change pending a reboot on {','.join(pending)}")
    return "; ".join(parts)


def _parse_gateway(row: HostStatus, unit: str | None, pool: str | None, pool_code: int | None,
                   page_text: str | None = None) -> None:
    """A host whose gateway unit is loaded: its state, its pool file (the watcher's record) and its
    chat page's unit (qwen27b_chat_page), if any."""
    props = parse_show(unit or "") if unit and unit.strip() != remote.NOCMD else {}
    if props.get("LoadState") != "loaded":
        return
    row.gateway = {"active": props.get("ActiveState", "unknown"), "sub": props.get("SubState", ""),
                   "pool": None, "drained": [], "failed_open": False}
    try:
        record = json.loads(pool or "") if not pool_code else None
    except ValueError:
        record = None
    page = parse_show(page_text or "") if page_text and page_text.strip() != remote.NOCMD else {}
    if page.get("LoadState") == "loaded":
        url = re.search(r"https?://\S+/", page.get("Description", ""))
        row.gateway["page"] = {"active": page.get("ActiveState", "unknown"), "sub": page.get("SubState", ""),
                               "url": url.group(0) if url else ""}
    if isinstance(record, dict) and isinstance(record.get("pool"), list):
        row.gateway.update(pool=[str(p) for p in record["pool"]], drained=[str(d) for d in record.get("drained") or []],
                           failed_open=bool(record.get("failed_open")))


def _parse_copies(row: HostStatus, text: str | None, now: float | None) -> None:
    """copies_command's lines -> one row per copy: its unit's state and its check's verdict."""
    blocks: list[tuple[str, list[str], str | None]] = []
    for line in (text or "").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "copy" and COPY_NAME.match(rest):
            blocks.append((rest, [], None))
        elif blocks and kind == "unit":
            blocks[-1][1].append(rest)
        elif blocks and kind == "health":
            blocks[-1] = (blocks[-1][0], blocks[-1][1], rest)
    for name, unit, health in blocks:
        copy = HostStatus(f"{row.host}/{name}")
        _parse_unit(copy, "\n".join(unit), 0)
        _parse_health(copy, health, 0 if (health or "").startswith("{") else 1, now)
        row.copies.append(copy)


def parse(host: str, outputs: dict[str, str], codes: dict[str, int], paths: dict,
          controller_now: float | None = None) -> HostStatus:
    """The script's sections -> the host's row. Pure; a missing or garbled section is 'unknown'."""
    row = HostStatus(host)
    try:
        now = float(outputs["now"].strip())
    except (KeyError, ValueError):
        now = controller_now  # the host's clock when it gave it: ages are not skewed by ours
    _parse_unit(row, outputs.get("unit"), codes.get("unit"))
    _parse_health(row, outputs.get("health"), codes.get("health"), now)
    _parse_release(row, outputs.get("release"), codes.get("release"), HostLayout.of(paths).releases)
    _parse_model(row, outputs.get("model"), codes.get("model"))
    _parse_gpus(row, outputs.get("gpus"), codes.get("gpus"))
    _parse_power(row, outputs.get("power"), codes.get("power"))
    _parse_engine(row, outputs.get("engine"), codes.get("engine"))
    _parse_flags(row, outputs.get("flags"), codes.get("flags"))
    _parse_gateway(row, outputs.get("gateway"), outputs.get("pool"), codes.get("pool"), outputs.get("page"))
    _parse_copies(row, outputs.get("copies"), now)
    return row


def from_answer(answer: remote.Answer, nonce: str, paths: dict, controller_now: float | None = None) -> HostStatus:
    """One host's answer (qwen27b.controller.remote.run_command) -> its row."""
    if answer.error:
        row = HostStatus(answer.host, reach="unreachable" if answer.unreachable else "error", error=answer.error)
    else:
        outputs, codes = remote.parse_script_output(answer.stdout, nonce)
        if outputs:
            row = parse(answer.host, outputs, codes, paths, controller_now)
        else:
            row = HostStatus(answer.host, reach="error",
                             error=f"the status script did not run: {remote.no_sections_why(answer)}")
    row.seconds = round(answer.seconds, 3)
    return row


# --------------------------------------------------------------------------- the controller's reports

def last_verifies(reports: Path, hosts: list[str]) -> dict[str, dict]:
    """host -> its newest verify result in reports/deploy-*.json (the verify role's run reports),
    newest first, read until every host is found; unreadable or corrupt files are skipped."""
    found: dict[str, dict] = {}
    wanted = set(hosts)
    try:
        files = sorted(Path(reports).glob("deploy-*.json"), key=lambda p: p.name, reverse=True)
    except OSError:
        return found
    for path in files:
        if wanted <= set(found):
            break
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        entries = data.get("hosts") if isinstance(data, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            name = entry.get("host")
            if name in wanted and name not in found:
                found[name] = {"status": str(entry.get("status") or "?"), "run": str(data.get("run") or path.stem),
                               "reason": str(entry.get("reason") or "")[:200], "report": path.name}
                comparison = entry.get("comparison")
                if isinstance(comparison, dict) and isinstance(comparison.get("verdict"), str):
                    # against the host's previous release (plan/regression.py), with the figures
                    found[name]["comparison"] = {"verdict": comparison["verdict"],
                                                 "text": str(comparison.get("text") or "")[:400]}
    return found


# --------------------------------------------------------------------------- output

def age(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3].rstrip() + "..."


def cells(row: HostStatus) -> list[str]:
    if row.failed:
        return [row.host, f"{row.reach}: {_short(row.error, 120)}", "-", "-", "-", "-", _verify_cell(row), "-"]
    if row.gateway is not None and row.load_state != "loaded":
        return [row.host, *_gateway_cells(row.gateway), _verify_cell(row), "-"]
    if row.load_state == "not-found" and row.copies:
        service = f"{len(row.copies)} copies (rows below)"
    elif row.load_state == "not-found":
        service = "not installed"
    elif row.unit_note:
        service = f"unknown: {_short(row.unit_note)}"
    else:
        service = "/".join(p for p in (row.active, row.sub) if p)
        if row.restarts is not None:
            service += f", {row.restarts} restart{'' if row.restarts == 1 else 's'}"
    health = _health_cell(row) if not (row.copies and row.load_state == "not-found") else "-"
    groups = Counter((g["name"], g["memory"]) for g in row.gpus)
    gpus = (", ".join(f"{n}x {name} ({memory})" for (name, memory), n in groups.items()) if groups
            else _short(row.gpu_note) or "none")
    if power_cell(row):
        gpus += f"; {power_cell(row)}"
    engine = row.speculative + ("" if row.agent_parsers is None else
                                ", parsers on" if row.agent_parsers else ", parsers off")
    return [row.host, service, health, row.release, row.model, gpus, _verify_cell(row), engine]


def _health_cell(row: HostStatus) -> str:
    cell = (f"{row.health} {age(row.health_age_s)}" if row.health != "unknown"
            else f"unknown: {row.health_note}" if row.health_note else "unknown")
    return cell + (f", needs a {row.health_needs} (no restart)" if row.health_needs else "")


def copy_cells(host: HostStatus, copy: HostStatus) -> list[str]:
    """A copy's row under its host's: its unit and its own check; the release and model are the host's."""
    service = (f"unknown: {_short(copy.unit_note)}" if copy.unit_note else
               "not installed" if copy.load_state == "not-found" else "/".join(p for p in (copy.active, copy.sub) if p))
    if copy.restarts is not None and not copy.unit_note:
        service += f", {copy.restarts} restart{'' if copy.restarts == 1 else 's'}"
    return ["  copy " + copy.host.rpartition("/")[2], service, _health_cell(copy), host.release, host.model, "-", "-", "-"]


def _gateway_cells(g: dict) -> list[str]:
    """service, health (the pool), release, model, gpus of a gateway host's row."""
    service = "gateway " + "/".join(p for p in (g["active"], g["sub"]) if p)
    if g.get("page"):
        page = g["page"]
        service += f"; chat page {'/'.join(p for p in (page['active'], page['sub']) if p)} {page['url']}".rstrip()
    if g["pool"] is None:
        pool = "pool unknown (no pool file)"
    else:
        pool = f"pool: {', '.join(g['pool']) or 'EMPTY'}" + (" (failed open)" if g["failed_open"] else "")
        pool += f"; drained: {', '.join(g['drained'])}" if g["drained"] else ""
    return [service, _short(pool, 120), "-", "(gateway)", "-"]


def _verify_cell(row: HostStatus) -> str:
    v = row.last_verify
    if not v:
        return "never (no report here)"
    if row.load_state == "not-found" and row.gateway is None and not row.copies:  # uninstalled since: history
        return f"- (not installed; was {v['status']})"
    text = f"{v['status']} (run {v['run']})" + (f": {_short(v['reason'])}" if v["status"] != "ok" and v["reason"] else "")
    return text + (f"; vs previous release: {v['comparison']['verdict']}" if v.get("comparison") else "")


def comparisons(rows: list[HostStatus]) -> str:
    """The last comparison with the previous release, per host, with its figures (below the table)."""
    return "".join(f"vs previous release: {r.host}: {r.last_verify['comparison']['text']}\n"
                   for r in rows if r.last_verify and r.last_verify.get("comparison"))


HEADERS = ["host", "service", "health", "release", "model", "gpus", "last verify", "speculative"]
WIDTHS = [28, 30, 24, 12, 40, 36, 34, 26]  # wrap points; a column is as wide as its longest line


def status_table(rows: list[HostStatus]) -> str:
    return table(HEADERS, [line for r in rows for line in [cells(r)] + ([] if r.failed else
                                                                      [copy_cells(r, c) for c in r.copies])], WIDTHS)


def footer(rows: list[HostStatus], elapsed: float) -> str:
    bad = [r.host for r in rows if r.failed]
    slowest = max(rows, key=lambda r: r.seconds or 0.0, default=None)
    text = f"read {len(rows)} host(s) in {elapsed:.2f} s"
    if slowest is not None and slowest.seconds is not None:
        text += f" (slowest {slowest.host}: {slowest.seconds:.2f} s)"
    if bad:
        text += f"; {len(bad)} not read: {', '.join(bad)}"
    return text


# --------------------------------------------------------------------------- I/O

def collect(state, hosts, paths: dict, timeout: int = 60) -> list[HostStatus]:
    """Every host at once, one script each (a fresh nonce per host); rows in inventory order."""
    nonces = {host.name: remote.new_nonce() for host in hosts}
    own = {host.name: host_paths(paths, host.name, dict(host.data.dict())) for host in hosts}  # qwen27b_models_dir
    answers = remote.run_everywhere(state, hosts, lambda host: remote.script(commands(own[host.name]), nonces[host.name]),
                                    timeout)
    now = time.time()
    return [from_answer(a, nonces[a.host], own.get(a.host, paths), now) for a in answers]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b status", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="pyinfra inventory file (as for deploy.py)")
    p.add_argument("--limit", nargs="+", action="extend", metavar="HOST",
                   help="only these hosts or groups (globs, as pyinfra's --limit)")
    p.add_argument("--json", action="store_true", help="JSON for machines instead of the table")
    p.add_argument("--reports", type=Path, default=reports_dir(),
                   help="the deploy reports dir for 'last verify' (default $QWEN27B_REPORTS or ./reports)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per host for the status script (default 60)")
    p.add_argument("--parallel", type=int, metavar="N", help="hosts read at once (as pyinfra's --parallel; "
                   "default pyinfra's: 20 per CPU)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from gevent import monkey  # as pyinfra's CLI: sockets and subprocesses cooperate, hosts overlap
    monkey.patch_all()

    paths = load_stack()["paths"]
    started = time.monotonic()
    selected = remote.selected_hosts("status", args.inventory, args.limit, parallel=args.parallel)
    if selected is None:
        return 2
    state, hosts = selected
    rows = collect(state, hosts, paths, args.timeout)
    verifies = last_verifies(args.reports, [r.host for r in rows])
    for row in rows:
        row.last_verify = verifies.get(row.host)
    elapsed = time.monotonic() - started
    code = 1 if any(r.failed for r in rows) else 0
    if args.json:
        print(json.dumps({"hosts": [asdict(r) for r in rows], "flag_notes": flag_notes(rows),
                          "elapsed_s": round(elapsed, 3), "exit_code": code}, indent=2, ensure_ascii=False))
    else:
        print(status_table(rows))
        print()
        print("".join(f"NOTE: {note}\n" for note in flag_notes(rows)), end="")
        print(comparisons(rows), end="")
        print(footer(rows, elapsed))
    return code


if __name__ == "__main__":
    sys.exit(main())
