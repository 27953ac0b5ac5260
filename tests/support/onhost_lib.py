"""The on-host package laid out as the vllm role ships it (`<lib>/qwen27b_onhost/`), for tests that
run host code the way a host runs it: vLLM's route guard, the qwen27b-health command."""

from __future__ import annotations

import shutil
from pathlib import Path

from qwen27b import onhost
from qwen27b.controller.artifacts import source_manifest
from qwen27b.onhost.contract import PACKAGE

SOURCE = Path(onhost.__file__).parent


def install(lib: Path) -> Path:
    """Copy the files the role sends (dir_manifest's list) into lib/qwen27b_onhost/; returns that dir."""
    dest = Path(lib) / PACKAGE
    dest.mkdir(parents=True, exist_ok=True)
    for name in source_manifest(SOURCE):
        shutil.copy(SOURCE / name, dest / name)
    return dest
