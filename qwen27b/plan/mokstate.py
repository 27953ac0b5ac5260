"""A MOK key waiting for enrolment, and what the driver's reboot is then for (issue 52 item 8).

With Secure Boot on, DKMS signs nvidia.ko with the Machine Owner Key (qwen27b_mok_key_path). After
`mokutil --import` the key sits in shim's enrolment request (MokNew) until a reboot at the console:
shim stops in the blue MOK Manager ("Press any key to perform MOK management", ~10 s), a person
chooses Enroll MOK, Continue, Yes and types the one-time password. An unattended reboot skips it and
the request is dropped, so the signed module still does not load (nvidia-smi: "couldn't communicate
with the NVIDIA driver"). So a reboot on such a host is for the key enrolment, at the console; the
deploy names that cause and does not reboot the host itself.

The MokRequests fact runs `mokutil --list-new` (lcp/mokutil src/mokutil.c): "MokNew is empty", or per key `[key N]`,
`SHA1 Fingerprint: ..`, then the certificate's text (its `Subject: CN = ...`).
"""

from __future__ import annotations

import re

from qwen27b.plan.hostfacts_parse import FactParseError, numbered_lines
_KEY = re.compile(r"^\[key (?P<n>[0-9]+)\]$")
_FINGERPRINT = re.compile(r"^SHA1 Fingerprint: (?P<fp>[0-9a-fA-F:]+)$")
_SUBJECT = re.compile(r"^Subject: ?(?P<subject>.+)$")


def parse_mok_requests(output: list[str]) -> list[dict] | None:
    """The keys waiting in the enrolment request: [{"fingerprint", "subject"}]; [] when MokNew is
    empty; None when not read (no output, or EFI variables mokutil cannot read: no Secure Boot)."""
    lines = numbered_lines(output)
    keys: list[dict] = []
    for n, line in lines:
        text = line.strip()
        if "EFI variables are not supported" in text:
            return None
        if text.endswith("is empty"):
            return []
        if _KEY.match(text):
            keys.append({"fingerprint": None, "subject": None})
        elif keys and (match := _FINGERPRINT.match(text)):
            keys[-1]["fingerprint"] = match["fp"].lower()
        elif keys and (match := _SUBJECT.match(text)) and keys[-1]["subject"] is None:
            keys[-1]["subject"] = match["subject"].strip()
        elif not keys and text:
            raise FactParseError("MokRequests", n, "mokutil --list-new: 'MokNew is empty' or '[key 1]'", line)
    return keys if lines else None


def enrolment_pending(facts) -> str | None:
    """What waits for enrolment, as the plan names it ('the MOK key CN = ... (SHA1 4a:..)'), or None:
    Secure Boot off, nothing pending, or not read."""
    keys = facts.mok_requests or []
    if facts.secure_boot != "enabled" or not keys:
        return None
    named = "; ".join(" ".join(part for part in (k.get("subject") or "", f"(SHA1 {k['fingerprint']})"
                                                  if k.get("fingerprint") else "") if part) or "a key" for k in keys)
    return f"{len(keys)} MOK key(s) waiting for enrolment (mokutil --list-new: {named})"


def console_reboot(pending: str) -> tuple[str, str]:
    """(the driver row's reboot words, the role's note) when the reboot is for the key enrolment."""
    why = (f"the reboot is for the key enrolment, not the driver: {pending}; the signed module loads only "
           "once it is enrolled, which shim's MOK Manager does at the console (an unattended reboot skips it "
           "and drops the request), so this deploy does not reboot")
    note = (f"REBOOT AT THE CONSOLE for the MOK key enrolment ({pending}): `sudo reboot` with a screen or BMC/IPMI "
            "console, press a key at 'Press any key to perform MOK management', Enroll MOK, Continue, Yes, the "
            "password, Reboot; then `mokutil --test-key <the .der beside qwen27b_mok_key_path>` says it is already "
            "enrolled and `nvidia-smi -L` lists every GPU; then re-run the deploy")
    return why, note
