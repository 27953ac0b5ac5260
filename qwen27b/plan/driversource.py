"""Where a kept driver comes from and what would move it (issue 52 item 5).

A lab that installed the non-server `nvidia-driver-580` from the graphics-drivers PPA, pinned it and
let unattended-upgrades take the PPA's updates: the plan keeps and holds it (as for any loaded R580
from apt) and now says where it comes from (the PPA, not the Ubuntu archive's -server build), the
pin and the unattended-upgrades origin that would move it, and that the hold stops that. Pure: the
DriverSource fact's text (controller/facts.py builds its one command) parsed here, and the sentence.

The fact's sections: `== policy` (`apt-cache policy` of the installed nvidia-driver-* packages),
`== pins` (`grep -Hs '' /etc/apt/preferences /etc/apt/preferences.d/*`: FILE:LINE),
`== origins` (`apt-config dump`'s Unattended-Upgrade::Allowed-Origins / Origins-Pattern lines).
"""

from __future__ import annotations

import re

from qwen27b.plan.hostfacts_parse import FactParseError, numbered_lines

SECTIONS = ("policy", "pins", "origins")
_SECTION = re.compile(r"^== (policy|pins|origins)$")
_PACKAGE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9+.-]*):$")
_FIELD = re.compile(r"^\s+(?P<key>Installed|Candidate): (?P<value>\S+)$")
_VERSION = re.compile(r"^\s*(?:\*\*\* )?(?P<version>[0-9][^\s]*) (?P<priority>-?[0-9]+)$")
_SOURCE = re.compile(r"^\s+(?P<priority>-?[0-9]+) (?P<where>\S+)(?: (?P<suite>\S+))?")
_PIN = re.compile(r"^(?P<file>/etc/apt/preferences[^:]*):(?P<key>Package|Pin|Pin-Priority): ?(?P<value>.*)$")
_ORIGIN = re.compile(r'^Unattended-Upgrade::(?:Allowed-Origins|Origins-Pattern)::? "(?P<value>[^"]*)";$')
_PPA = re.compile(r"^https?://ppa\.launchpad(?:content)?\.net/(?P<owner>[^/]+)/(?P<name>[^/]+)/")


def source_command() -> str:
    """The DriverSource fact's one command (the three sections, each empty where nothing answers)."""
    return ("echo '== policy'; p=$(dpkg-query -W -f '${Package}\\n' 'nvidia-driver-*' 2>/dev/null); "
            '[ -n "$p" ] && apt-cache policy $p 2>/dev/null; '
            "echo '== pins'; grep -Hs '' /etc/apt/preferences /etc/apt/preferences.d/* 2>/dev/null; "
            "echo '== origins'; apt-config dump 2>/dev/null | grep -E '^Unattended-Upgrade::(Allowed-Origins|Origins-Pattern)'; "
            "true")


def parse_driver_source(output: list[str]) -> dict | None:
    """{"policy": {package: {"installed", "candidate", "versions": [{"version", "priority", "sources":
    [url or /var/lib/dpkg/status]}]}}, "pins": [{"file", "package", "pin", "priority"}], "origins": [str]};
    None for no output (not read)."""
    fact = "DriverSource"
    lines = numbered_lines(output)
    if not lines:
        return None
    found: dict = {"policy": {}, "pins": [], "origins": []}
    section, package, version = None, None, None
    for n, line in lines:
        head = _SECTION.match(line.strip())
        if head:
            section, package, version = head[1], None, None
            continue
        if section is None:
            raise FactParseError(fact, n, "'== policy' first", line)
        if section == "policy":
            if (match := _PACKAGE.match(line)):
                package = found["policy"].setdefault(match["name"], {"installed": None, "candidate": None, "versions": []})
            elif package is None:
                raise FactParseError(fact, n, "an apt-cache policy 'PACKAGE:' line", line)
            elif (match := _FIELD.match(line)):
                package[match["key"].lower()] = None if match["value"] == "(none)" else match["value"]
            elif line.strip() == "Version table:":
                continue
            elif (match := _VERSION.match(line)) and not line.startswith("        "):
                version = {"version": match["version"], "priority": int(match["priority"]), "sources": []}
                package["versions"].append(version)
            elif version is not None and (match := _SOURCE.match(line)):
                version["sources"].append(match["where"])
            else:
                raise FactParseError(fact, n, "apt-cache policy's Installed/Candidate/version table", line)
        elif section == "pins":
            match = _PIN.match(line.strip())
            if match is None:
                continue  # comments, Explanation:, blank lines of a preferences file
            if match["key"] == "Package" or not found["pins"] or found["pins"][-1]["file"] != match["file"] \
                    or found["pins"][-1].get(match["key"].lower().replace("-", "_")):
                found["pins"].append({"file": match["file"], "package": None, "pin": None, "pin_priority": None})
            found["pins"][-1][match["key"].lower().replace("-", "_")] = match["value"].strip()
        elif (match := _ORIGIN.match(line.strip())):
            found["origins"].append(match["value"])
    return found


def _ppa(url: str) -> tuple[str, str] | None:
    match = _PPA.match(url)
    return (match["owner"], match["name"]) if match else None


def kept_source(source: dict | None, package: str, version: str) -> str | None:
    """Where the kept `package` `version` comes from and what would move it, when that is a PPA (None
    otherwise: the Ubuntu archive's build, or the fact not read)."""
    if not source or package not in source["policy"]:
        return None
    entry = next((v for v in source["policy"][package]["versions"] if v["version"] == version), None)
    urls = [u for u in (entry or {}).get("sources", []) if u.startswith("http")]
    ppa = next((p for p in map(_ppa, urls) if p), None)
    if ppa is None:
        return None
    owner, name = ppa
    label = f"LP-PPA-{owner}" + ("" if name == "ppa" else f"-{name}")
    pins = [p for p in source["pins"] if p.get("pin") and (label in p["pin"] or f"{owner}/{name}" in p["pin"])]
    origins = [o for o in source["origins"] if label in o]
    candidate = source["policy"][package]["candidate"]
    said = (f"{package} {version} comes from the {owner} PPA (ppa:{owner}/{name}, {urls[0]}), not the Ubuntu "
            "archive's build")
    if pins:
        said += "; apt pin " + "; ".join(f"Pin-Priority {p['pin_priority']} for {p['package']} ({p['pin']}, {p['file']})"
                                         for p in pins)
    if origins:
        said += "; unattended-upgrades takes its updates (" + ", ".join(f'"{o}"' for o in origins) + ")"
    newer = f" (its candidate now: {candidate})" if candidate and candidate != version else ""
    return (said + f". What would move it: a newer build in that PPA{newer}"
            + (" installed by unattended-upgrades" if origins else "") + " or an `apt upgrade`, which the hold "
            "below stops (`apt-mark unhold` lifts it); a change to the pin or the origins; a move needs a reboot")
