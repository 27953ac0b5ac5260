"""One profile's paths and state.json: the base the test-host collaborators share."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from .common import TestHostsError, cache_dir


class ProfileState:
    """Paths and recorded state of one set ("profile") of test hosts."""

    def __init__(self, profile: str = "default", cache: Path | None = None, *,
                 boot_timeout: float = 180.0):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", profile):
            raise ValueError(f"bad profile name {profile!r}")
        self.profile = profile
        self.cache = Path(cache) if cache else cache_dir()
        self.state_dir = self.cache / "testhosts" / profile
        self.boot_timeout = boot_timeout
        self.key = self.cache / "testhosts_id_ed25519"
        self.known_hosts = self.state_dir / "known_hosts"
        self.ssh_config = self.state_dir / "ssh_config"
        self.inventory = self.state_dir / "inventory.py"
        self.state_file = self.state_dir / "state.json"
        self.proxy_sock = self.state_dir / "proxy.sock"
        if len(str(self.proxy_sock)) > 100:  # sun_path limit
            self.proxy_sock = Path("/tmp") / (
                "qwen27b-" + hashlib.sha1(str(self.state_dir).encode()).hexdigest()[:12] + ".sock")
        # OpenSSH's shared connections (ssh.mux_options): a socket per host, named by a 40-character hash plus
        # a 17-character suffix while it is made, inside sun_path's 108 bytes: a short dir of its own
        self.mux_dir = Path("/tmp") / ("qwen27b-mux-" + hashlib.sha1(str(self.state_dir).encode()).hexdigest()[:12])

    # -- state
    def load(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {"profile": self.profile, "hosts": {}, "proxy": {}}

    def save(self, st: dict) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2, sort_keys=True))
        os.replace(tmp, self.state_file)

    @property
    def hosts(self) -> list[dict]:
        return sorted(self.load()["hosts"].values(), key=lambda h: h["index"])

    def host(self, name: str) -> dict:
        h = self.load()["hosts"].get(name)
        if h is None:
            raise TestHostsError(f"no test host {name!r} in profile {self.profile!r}")
        return h

    def _update_host(self, h: dict) -> None:
        st = self.load()
        st["hosts"][h["name"]] = h
        self.save(st)

    def _drop_host(self, name: str) -> None:
        st = self.load()
        st["hosts"].pop(name, None)
        self.save(st)
