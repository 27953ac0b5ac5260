"""Open WebUI 0.12.4 driven as a person uses it: a real headless Chromium (Debian's `chromium`, not
a Playwright download) under Playwright for Python signs in, sends one chat message and waits for the
streamed answer. `add_user` makes a non-admin account through Open WebUI's admin API (httpx).

What the flow needs from Open WebUI's environment: an admin from WEBUI_ADMIN_EMAIL/PASSWORD (the
page then shows the sign-in form, not onboarding); BYPASS_MODEL_ACCESS_CONTROL=true (else a plain
user is offered no model: only admins see a model without an access grant);
DEFAULT_MODEL_PARAMS={"function_calling":"legacy"} (else Open WebUI sends its built-in tools with
tool_choice "auto", which a vLLM without --enable-auto-tool-choice answers with HTTP 400).
With the 135M model, cap the answer: add_user(..., params={"max_tokens": 64}) (or "max_tokens" in
DEFAULT_MODEL_PARAMS); uncapped it once rambled to the 2048-token context: 88 s, 42 s of Chromium CPU.
Open WebUI refuses a 16th sign-in of one email within 3 minutes (HTTP 429, "API rate limit
exceeded"; not configurable, refused tries count too, a restart clears it); add_user's counts.

HTTPS with a lab CA: Chromium on Linux takes extra roots only from an NSS database (certutil, of
libnss3-tools) or a system-wide policy file. Instead Python verifies the server's certificate
against `ca_file` (chain, host name, dates) and Chromium gets exactly that certificate's key
through --ignore-certificate-errors-spki-list; ignore_https_errors stays False, so a server that
presents any other certificate still fails in the browser (NET::ERR_CERT_AUTHORITY_INVALID).

Manual run (Open WebUI and its backend up; --add-user EMAIL:PASSWORD first makes that plain user
with the admin given and chats as it; --ca-file for https):
    .venv/bin/python -m tests.support.browser http://127.0.0.1:18080 admin@lab.test adminpass123
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import ssl
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

CHROMIUM = "/usr/bin/chromium"
# the lab's closed network refuses anything but the page: no sync, updates, QUIC probes, first-run
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# How the page gets the answer: socket.io events over its websocket, one per streamed piece, as
# 42["events",{..."data":{"type":"response:completion","data":{"type":"response.output_text.delta",
# ..."delta":"Hel"}}}]. They are counted off the wire: the page renders at most once an animation
# frame, so a short answer's pieces, arriving a few ms apart, often show up in the DOM all at once.
DELTA = '"response.output_text.delta"'


def _pinned_spki(page_url: str, ca_file: str) -> str:
    """base64 SHA-256 of the SubjectPublicKeyInfo of the certificate the page's server presents, once
    Python verified it (chain to `ca_file`, host name, dates): what --ignore-certificate-errors-spki-list
    takes. Only this leaf is pinned, not the CA: Chromium ignores every error of a pinned chain."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    u = urlsplit(page_url)
    ctx = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection((u.hostname, u.port or 443), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=u.hostname) as tls:
        leaf = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
    spki = leaf.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def _cpu_seconds(profile: str) -> float:
    """utime+stime of the Chromium started with `profile` and of all its descendants (renderer, GPU,
    network and zygote processes), read from /proc while they still run."""
    procs = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                procs[int(d.name)] = (int(stat[1]), int(stat[11]) + int(stat[12]),
                                      (d / "cmdline").read_bytes())
    ours = {pid for pid, (_, _, cmd) in procs.items() if f"--user-data-dir={profile}".encode() in cmd}
    while True:
        more = {pid for pid, (ppid, _, _) in procs.items() if ppid in ours} - ours
        if not more:
            break
        ours |= more
    return sum(procs[p][1] for p in ours) / os.sysconf("SC_CLK_TCK")


def chat_in_browser(page_url: str, email: str, password: str, prompt: str, screenshot: Path,
                    timeout_s: float = 180, ca_file: str | None = None) -> dict:
    """Sign in at `page_url` as `email`, send `prompt` in a new chat with the model the page selects
    (the only one), and wait for the streamed answer; a full-page screenshot goes to `screenshot`
    either way. Returns {"answer", "chunks_seen", "seconds" (send to done), "model" (the name shown
    on the answer), "chromium_cpu_s"}; any failure raises AssertionError naming the step and what
    the page showed."""
    from playwright.sync_api import sync_playwright

    args = list(CHROMIUM_ARGS)
    if ca_file and page_url.startswith("https:"):
        try:
            args.append("--ignore-certificate-errors-spki-list=" + _pinned_spki(page_url, ca_file))
        except (OSError, ValueError) as e:  # ssl.SSLCertVerificationError is an OSError
            raise AssertionError(f"Open WebUI: {page_url}'s certificate against {ca_file}: {e}") from e
    deadline = time.monotonic() + timeout_s
    left_ms = lambda: max(1000, (deadline - time.monotonic()) * 1000)  # noqa: E731
    step = "launch chromium"
    with tempfile.TemporaryDirectory(prefix="owui-chromium-") as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=args, ignore_https_errors=False,
            viewport={"width": 1280, "height": 900}, locale="en-US")
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        frames: list[str] = []  # the answer's delta events, as the page received them
        page.on("websocket", lambda ws: ws.on(
            "framereceived", lambda f: frames.append(f) if isinstance(f, str) and DELTA in f else None))
        try:
            step = "open the sign-in page"
            page.goto(page_url.rstrip("/") + "/auth", timeout=left_ms())
            page.locator("#email").wait_for(timeout=left_ms())  # the form renders after /api/config

            step = "sign in"
            page.fill("#email", email)
            page.fill("#password", password)
            page.get_by_role("button", name="Sign in", exact=True).click()
            # the chat page is up when its input is; a refusal leaves the form and an error toast
            # (a wrong password, or "API rate limit exceeded": 15 sign-ins an email in 3 minutes)
            refused = page.locator("[data-sonner-toast][data-type=error]")
            page.locator("#chat-input").or_(refused).first.wait_for(timeout=left_ms())
            assert not refused.count(), f"sign-in refused: {refused.first.inner_text()!r}"

            step = "dismiss the first-login modal"
            # an admin gets the changelog once (until their settings hold this version; its button
            # saves it). The layout decides that before it renders the chat: there now, or not at all
            okay = page.get_by_role("button", name="Okay, Let's Go!")
            if okay.count():
                okay.click()
                okay.wait_for(state="hidden", timeout=10000)
            modal = page.locator("[role=dialog][aria-modal=true]")
            assert not modal.count(), f"a modal is in the way: {modal.first.inner_text()[:300]!r}"

            step = "select the model"
            picker = page.locator("#model-selector-model-button")
            label = picker.get_attribute("aria-label", timeout=left_ms()) or ""
            if not label.startswith("Selected model:"):  # nothing chosen: take the first model offered
                picker.click()
                options = page.get_by_role("listbox", name="Available models").get_by_role("option")
                with contextlib.suppress(Exception):
                    options.first.wait_for(timeout=5000)
                assert options.count(), ("the model picker offers no model (a plain user sees one only "
                                         "with BYPASS_MODEL_ACCESS_CONTROL=true or an access grant)")
                options.first.click()
                label = picker.get_attribute("aria-label") or ""
            assert label.startswith("Selected model:"), f"no model selected; the picker says {label!r}"

            step = "send the prompt"
            page.locator("#chat-input").click()
            page.keyboard.type(prompt)
            frames.clear()
            page.locator("#send-message-button").click()  # enabled once the input holds text
            sent = time.monotonic()

            step = "wait for the streamed answer"
            answer = page.locator("#response-content-container").last
            # message.done: the answer's action buttons (Copy ...) replace the typing cursor, and the
            # input's Stop button goes back to Send
            page.locator(".copy-response-button").last.wait_for(timeout=left_ms())
            page.get_by_role("button", name="Stop", exact=True).wait_for(state="hidden", timeout=left_ms())
            seconds = time.monotonic() - sent
            text = answer.inner_text().strip()
            events = [json.loads(f[f.index("["):])[1]["data"]["data"] for f in frames]  # past socket.io's 42
            pieces = [e["delta"] for e in events if e.get("delta")]
            assert text, "the answer is empty"
            assert len(pieces) >= 2, f"the answer did not stream: the page got it in {len(pieces)} piece(s)"
            model = page.locator("#response-message-model-name").last.inner_text().strip()
            cpu = _cpu_seconds(profile)
            page.screenshot(path=str(screenshot), full_page=True)
            return {"answer": text, "chunks_seen": len(pieces), "seconds": round(seconds, 2),
                    "model": model, "chromium_cpu_s": round(cpu, 2)}
        except Exception as e:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(screenshot), full_page=True)
            shown = ""
            with contextlib.suppress(Exception):
                shown = " ".join(page.locator("body").inner_text(timeout=2000).split())[:1500]
            raise AssertionError(f"Open WebUI in Chromium: step '{step}' failed at {page.url}: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
                                 f"the page showed: {shown!r}\nscreenshot: {screenshot}") from e
        finally:
            ctx.close()


def add_user(page_url: str, admin_email: str, admin_password: str, name: str, email: str, password: str,
             role: str = "user", params: dict | None = None, ca_file: str | None = None) -> dict:
    """A user made by the admin (POST /api/v1/auths/add, the admin's bearer token), with role
    "user": the endpoint's default role is "pending", whom the page keeps waiting for approval.
    `params` (e.g. {"max_tokens": 64}) go into the new user's settings, where the page's chat
    controls keep them: the page sends them with each of that user's messages (they win over the
    model's defaults). Returns Open WebUI's answer (id, email, role, token)."""
    verify = ssl.create_default_context(cafile=ca_file) if ca_file else True
    with httpx.Client(base_url=page_url.rstrip("/"), verify=verify, timeout=30) as http:
        r = http.post("/api/v1/auths/signin", json={"email": admin_email, "password": admin_password})
        assert r.status_code == 200, f"admin sign-in: HTTP {r.status_code} {r.text[:300]}"
        r = http.post("/api/v1/auths/add", headers={"Authorization": f"Bearer {r.json()['token']}"},
                      json={"name": name, "email": email, "password": password, "role": role})
        assert r.status_code == 200, f"add user {email}: HTTP {r.status_code} {r.text[:300]}"
        made = r.json()
        if params:
            r = http.post("/api/v1/users/user/settings/update", json={"ui": {"params": params}},
                          headers={"Authorization": f"Bearer {made['token']}"})
            assert r.status_code == 200, f"settings of {email}: HTTP {r.status_code} {r.text[:300]}"
        return made


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Chat once through Open WebUI in headless Chromium.")
    ap.add_argument("url")
    ap.add_argument("email")
    ap.add_argument("password")
    ap.add_argument("--prompt", default="Say hello in five words.")
    ap.add_argument("--screenshot", type=Path, default=Path("/tmp/owui/shot.png"))
    ap.add_argument("--ca-file")
    ap.add_argument("--add-user", metavar="EMAIL:PASSWORD",
                    help="first make this non-admin user (as the admin given), then chat as it")
    ap.add_argument("--max-tokens", type=int, help="the added user's max_tokens (its chat settings)")
    a = ap.parse_args()
    email, password = a.email, a.password
    if a.add_user:
        email, password = a.add_user.split(":", 1)
        made = add_user(a.url, a.email, a.password, email.split("@")[0], email, password, ca_file=a.ca_file,
                        params={"max_tokens": a.max_tokens} if a.max_tokens else None)
        print("added", made["email"], made["role"])
    t0 = time.monotonic()
    out = chat_in_browser(a.url, email, password, a.prompt, a.screenshot, ca_file=a.ca_file)
    print(json.dumps({**out, "wall_s": round(time.monotonic() - t0, 2)}, indent=1))
