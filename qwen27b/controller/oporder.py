"""Make pyinfra's per-operation call-stack walk cheap: the deploy file, known to `inspect` as a module.

In CLI mode pyinfra orders operations by the call stack of each operation call
(`pyinfra.api.util.get_operation_order_from_stack`: `inspect.stack()` and `getframeinfo` on every
frame, three passes). For each frame `inspect.findsource` asks `inspect.getmodule` which module the
frame's file belongs to; a file that is no module's `__file__`, as the deploy file pyinfra `exec`s
is not, is looked up by scanning all of `sys.modules` (~750 modules), every time: ~1.4 ms of CPU per
operation call, a quarter of the controller's CPU on a 50-host no-op run (docs/deploy-bench.md).

A module object naming the deploy file in `sys.modules` lets the first scan map that file and every
later lookup hit `inspect`'s file -> module map. Nothing else changes: the module is empty, has no
loader (so `linecache` reads the file itself, as before) and the frames, line numbers and hence the
operation order and hashes are the same. pyinfra is not patched.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types

PREFIX = "_qwen27b_deploy_file_"


def module_name(path: str) -> str:
    return PREFIX + hashlib.sha1(path.encode()).hexdigest()[:16]


def register_deploy_file(filename: str | None) -> None:
    """Name the deploy file `filename` (as pyinfra's CLI passed it, relative to the cwd) as a
    module for `inspect`; idempotent, one module per file (a later run of another file adds its own)."""
    if not filename:
        return  # pyinfra's API mode: the order is not taken from the stack
    path = os.path.abspath(filename)
    name = module_name(path)
    if name not in sys.modules:
        module = types.ModuleType(name, "the deploy file pyinfra runs, as inspect.getmodule finds it (oporder.py)")
        module.__file__ = path
        sys.modules[name] = module
