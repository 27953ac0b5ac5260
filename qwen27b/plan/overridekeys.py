"""qwen27b_stack_overrides checked before any host is touched (issue 50 item 3, cut from hostdata.py):
the ids, revisions and hashes that end up in paths and downloads, the serve numbers, the fallback's
floors, then every value against the stack file's shape (a known key, the same type) and its
allow-list (plan/allowlist.py)."""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from typing import Any

from qwen27b.plan import allowlist
from qwen27b.plan.settings import BadHostData


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


REVISION = re.compile(r"^(?:[0-9a-f]{7,40}|[A-Za-z0-9][A-Za-z0-9._-]{0,99})$")  # a commit, or a tag/branch name


SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def _check_overrides(host: str, overrides: dict) -> None:
    """The values in stack overrides that end up in paths and downloads: ids, revisions, hashes;
    then every value's type and allow-list (qwen27b/plan/allowlist.py)."""
    key = "qwen27b_stack_overrides"
    for section in ("model", "draft"):
        entry = overrides.get(section) or {}
        if not isinstance(entry, dict):
            raise BadHostData(host, f"{key}.{section}", f"expected a dict, got {type(entry).__name__}", "e.g. {'id': 'org/name'}")
        if f"{section}_revision" in overrides and "revision" in entry:
            # two spellings of one key: the shortcut would win over the checked one
            raise BadHostData(host, f"{key}.{section}_revision", f"given twice, as {section}_revision and "
                              f"{section}.revision", f"give it once: {{'{section}': {{'revision': ...}}}}")
        if "id" in entry and not (isinstance(entry["id"], str) and HUB_ID.match(entry["id"]) and ".." not in entry["id"]):
            raise BadHostData(host, f"{key}.{section}.id", f"{entry['id']!r} is not a hub id 'org/name'",
                              "use the checkpoint's hub id, e.g. 'nvidia/Qwen3.8-27B-NVFP4' (no paths, no '..')")
        revision = entry.get("revision", overrides.get(f"{section}_revision"))
        if revision is not None and not (isinstance(revision, str) and REVISION.match(revision) and ".." not in revision):
            raise BadHostData(host, f"{key}.{section}_revision", f"{revision!r} is not a commit or tag",
                              "pin a commit hash (7-40 hex) or a tag name")
    serve = overrides.get("serve")
    if isinstance(serve, dict):
        for name, value in serve.items():
            where = f"{key}.serve.{name}"
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "start_timeout_s"):
                if not (isinstance(value, int) and number and value > 0):
                    raise BadHostData(host, where, f"must be a positive whole number, got {value!r}",
                                      "use a value of 1 or more")
            elif name.endswith(("_mib", "_gib")) and not (number and value >= 0):
                raise BadHostData(host, where, f"must be a size of 0 or more, got {value!r}", "use a number >= 0")
            elif name == "gpu_memory_utilization" and not (number and 0 < value <= 1):
                raise BadHostData(host, where, f"{value!r} is not a fraction of GPU memory",
                                  "use a value above 0 and at most 1, e.g. 0.88")
    vllm = overrides.get("vllm") or {}
    if isinstance(vllm, dict) and vllm.get("sha256") is not None and not (
            isinstance(vllm["sha256"], str) and SHA256.match(vllm["sha256"])):
        raise BadHostData(host, f"{key}.vllm.sha256", f"{vllm['sha256']!r} is not a sha256 (64 hex digits)",
                          "copy the wheel's full sha256 (sha256sum FILE)")
    if "speculative" in overrides:
        from qwen27b.plan.stack import StackError, spec_floor_overrides
        try:
            spec_floor_overrides(overrides["speculative"])
        except StackError as error:
            raise BadHostData(host, f"{key}.speculative", str(error).split("; fix: ")[0],
                              "set only {'floors': {'min_acceptance': 0..1, 'min_draft_tokens': 1 or more}}") from None
    shapes = _stack_shapes()
    for name, value in overrides.items():
        if name == "speculative":
            continue  # checked above: only the fallback's floors
        path = {"model_revision": "model.revision", "draft_revision": "draft.revision"}.get(name, name)
        _check_override_value(host, f"{key}.{name}", path, value, shapes)


@lru_cache(maxsize=1)
def _stack_shapes() -> dict[str, frozenset]:
    """Stack key path -> the types its value has in some profile (or model entry) of stack.yaml."""
    from qwen27b.plan.stack import load_stack

    stack, shapes = load_stack(), {}

    def add(tree: dict, prefix: str) -> None:
        for name, value in tree.items():
            path = prefix + str(name)
            shapes.setdefault(path, set()).add(type(value))
            if isinstance(value, dict) and path != "serve.env":
                add(value, path + ".")
    for profile in stack["profiles"].values():
        add(profile, "")
    for entry in stack["models"].values():
        add(entry, "model.")
        add(entry, "draft.")
    shapes["model"] = shapes["draft"] = {dict}  # overrides of the model entries, not the profile's names
    for path in allowlist.STACK_RULES:
        if shapes.get(path) == {type(None)}:  # null in every profile (a sha256 to pin, a URL): a string
            shapes[path].add(str)
    return {path: frozenset(types) for path, types in shapes.items()}


def _type_ok(value: Any, types: frozenset) -> bool:
    if value is None:
        return type(None) in types
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int):
        return bool(types & {int, float})
    return any(isinstance(value, t) for t in types if t not in (bool, int, type(None)))


def _check_override_value(host: str, where: str, path: str, value: Any, shapes: dict) -> None:
    """One override against the stack's shape (known key, same type) and its allow-list pattern."""
    types = shapes.get(path)
    if types is None:
        parent, _, leaf = path.rpartition(".")
        known = sorted({p[len(parent) + 1:] if parent else p for p in shapes
                        if p.rpartition(".")[0] == parent and "." not in (p[len(parent) + 1:] if parent else p)})
        close = difflib.get_close_matches(leaf, known, n=1)
        raise BadHostData(host, where, "unknown stack key", (f"did you mean '{close[0]}'? " if close else "")
                          + f"known here: {', '.join(known)}")
    if not _type_ok(value, types):
        names = " or ".join(sorted("null" if t is type(None) else t.__name__ for t in types))
        raise BadHostData(host, where, f"expected {names} (as in qwen27b/plan/stack.yaml), got {type(value).__name__} {value!r}",
                          f"write it as qwen27b/plan/stack.yaml does at {path}")
    if isinstance(value, dict) and path != "serve.env":
        for name, item in value.items():
            if not isinstance(name, str):
                raise BadHostData(host, where, f"{name!r} is not a stack key", "stack keys are strings")
            _check_override_value(host, f"{where}.{name}", f"{path}.{name}", item, shapes)
        return
    found = allowlist.problem(path, value)
    if found:
        raise BadHostData(host, where, *found)
