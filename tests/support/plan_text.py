"""The recorded plans (tests/golden) read back as operations and their commands, and a command's kind."""

import re

_HEADER = re.compile(r"^== @fake/(?P<host>\S+): \d+ operation\(s\) planned")
_OP = re.compile(r"^   (?:CHANGE|ok)\s+(?P<name>.+)$")
_CMD = re.compile(r"^\s+\$ (?P<cmd>.*)$")


def parse_plans(text: str) -> dict[str, list[tuple[str, list[str]]]]:
    """host -> [(operation name, [commands])] from the '== @fake/<host>: N operation(s) planned' blocks."""
    plans: dict[str, list[tuple[str, list[str]]]] = {}
    ops = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            ops = plans.setdefault(header["host"], [])
        elif ops is not None and _OP.match(line):
            ops.append((_OP.match(line)["name"], []))
        elif ops is not None and ops and _CMD.match(line):
            ops[-1][1].append(_CMD.match(line)["cmd"])
        elif not line.strip():
            ops = None
    return plans


def _kind(command: str) -> str | None:
    """Which download route a command is (None: it downloads nothing)."""
    if re.search(r"\bhf download\b", command):
        return "hub"
    if re.search(r"\bpip install\b", command):
        if "--no-index" in command:
            return "pip-wheelhouse"
        return "pip-url" if re.search(r"[\s'\"]https?://\S+\.whl", command) else "pip-index"
    if re.search(r"\buv python install\b", command):
        return "uv-python"
    if re.search(r"\bapt-get\b.*\binstall\b", command):
        return "apt"
    if re.search(r"-m qwen27b_onhost\.fetch\b", command):
        return "mirror-fetch"
    if re.search(r"\b(?:curl|wget)\b", command) and re.search(r"https?://", command):
        return "curl"
    if re.search(r"\bgit\s+clone\b|\burlopen\b|\bhf_hub_download\b|huggingface-cli download", command):
        return "unclassified"
    return None
