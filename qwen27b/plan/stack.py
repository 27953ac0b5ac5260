"""The stack file: load it, pick a profile for a host, apply the user's overrides.

Every version and compatibility rule lives in stack.yaml with its source; this module only
reads it, so a decision can always say which entry (and which source) it came from.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from qwen27b.plan.hostlayout import HostLayout, revision_dir_name, with_models_dir  # noqa: F401 (revision_dir_name: its importers)
from qwen27b.plan import filepins
from qwen27b.plan.regression import check_limits

STACK_FILE = Path(__file__).with_name("stack.yaml")
CHECKPOINTS_DIR = Path(__file__).with_name("checkpoints")


class StackError(ValueError):
    """The stack file or an override of it is wrong; the message says which key and how to fix it."""


@lru_cache(maxsize=4)
def _load_raw(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_stack(path: Path | str = STACK_FILE) -> dict:
    """A private copy of the stack file (callers may merge overrides into it)."""
    return copy.deepcopy(_load_raw(str(path)))


def cc_tuple(value: str | None) -> tuple[int, int] | None:
    """'7.0' -> (7, 0): compute capabilities compare as numbers, not strings ('10.0' > '9.0')."""
    if value is None:
        return None
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


def gpu_spec(stack: dict, *, name: str | None = None, pci_id: str | None = None) -> dict | None:
    """The stack's row for a GPU, by nvidia-smi name or by PCI device id (before any driver)."""
    for row in stack["gpus"]:
        if name is not None and name in row["names"]:
            return row
        if pci_id is not None and pci_id.lower() in row["pci_ids"]:
            return row
    if pci_id is not None:
        return volta_pci_spec(stack, pci_id)
    return None


def volta_pci_spec(stack: dict, pci_id: str) -> dict | None:
    """A row for any Volta board of pci.ids (qwen27b/plan/pci_volta.yaml) that the gpus table lacks:
    memory from the size its name says, as R580 reports it, else the smallest Tesla V100's."""
    from qwen27b.plan.pciids import memory_class, volta_table

    name = volta_table()["devices"].get(pci_id.lower())
    rule = stack.get("volta_pci")
    if name is None or not rule:
        return None
    size = memory_class(name) or next((s for n, s in rule["size_by_name"].items() if n in name), None)
    row = {key: rule[key] for key in ("compute_capability", "bandwidth_gbs", "fp16_tensor_tflops", "source")}
    row.update(key=f"volta-{pci_id.lower()}", names=[name], pci_ids=[pci_id.lower()],
               memory_mib=rule["reported_memory_mib"][size or rule["unknown_size"]], memory_known=size is not None)
    return row


def os_support(stack: dict, os_id: str | None, version_id: str | None) -> dict | None:
    for row in stack["os_support"]:
        if row["id"] == os_id and row["version_id"] == version_id:
            return row
    return None


def profile_for_compute_capability(stack: dict, cc: str) -> str | None:
    """The GPU-generation profile whose compute-capability range holds cc."""
    value = cc_tuple(cc)
    for name, profile in stack["profiles"].items():
        bounds = profile.get("compute_capability")
        if bounds and cc_tuple(bounds["min"]) <= value <= cc_tuple(bounds["max"]):
            return name
    return None


def merge_overrides(base: dict, overrides: dict, where: str = "") -> dict:
    """Deep-merge overrides into base; an unknown key is refused with a 'did you mean'."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        path = f"{where}.{key}" if where else key
        if key not in merged and where == "serve.env":
            merged[key] = value  # the service's environment: new names are allowed (allow-listed in allowlist.py)
            continue
        if key not in merged:
            close = difflib.get_close_matches(key, list(merged), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise StackError(f"unknown stack key '{path}'{hint}; known here: {', '.join(sorted(merged))}")
        if isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge_overrides(merged[key], value, path)
        else:
            _check_number(path, merged[key], value)
            merged[key] = value
    return merged


def _check_number(path: str, base, value) -> None:
    """A number or a switch of the stack stays one: "120" or True for a timeout would reach a unit
    or a planner's arithmetic; a negative count or time is never meant."""
    if isinstance(base, bool):
        if not isinstance(value, bool):
            raise StackError(f"stack key '{path}' takes true or false, not {value!r}")
    elif isinstance(base, (int, float)):
        whole = isinstance(base, int)
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or value < 0:
            raise StackError(f"stack key '{path}' takes a {'whole ' if whole else ''}number >= 0 "
                             f"(the stack's is {base}), not {value!r}")


@dataclass(frozen=True)
class ResolvedStack:
    """One host's stack: the chosen profile with overrides applied, its model and draft entries."""

    profile_name: str
    profile: dict
    model: dict
    draft: dict | None
    paths: dict
    sources: dict
    build: dict  # the vllm_builds row for profile.vllm.build
    tools: dict  # controller-cached tools (uv) and the packages every release venv gets
    speculative: dict = field(default_factory=dict)  # the stack's speculative section (plan/engine.py)
    agent_parsers: dict = field(default_factory=dict)  # the stack's agent_parsers table (plan/engine.py)
    retry: dict = field(default_factory=dict)  # the stack's retry section (plan/retry.py)
    fetch_sources: dict = field(default_factory=dict)  # the default sources and their keys (plan/sources.py)

    @property
    def layout(self) -> HostLayout:
        """Where this stack puts things on a host (plan/hostlayout.py)."""
        return HostLayout.of(self.paths)

    @property
    def stack_hash(self) -> str:
        """Names the release dir: anything that changes what is installed changes the hash."""
        installed = {
            "profile": self.profile_name,
            "python": self.profile["python"],
            "vllm": self.profile["vllm"],
            "torch": self.profile["torch"],
        }
        digest = hashlib.sha256(json.dumps(installed, sort_keys=True).encode()).hexdigest()
        return digest[:12]

    @staticmethod
    def _ids(source_ids) -> list[str]:
        if source_ids is None:
            return []
        return [source_ids] if isinstance(source_ids, str) else list(source_ids)

    def cite(self, source_ids) -> str:
        """A short citation, '[id, id]'; the plan prints each id's text once as a legend."""
        ids = self._ids(source_ids)
        return f"[{', '.join(ids)}]" if ids else ""

    def source_text(self, source_ids) -> str:
        """The full text of the sources, for refusals (which must stand on their own)."""
        return "; ".join(self.sources.get(i, i) for i in self._ids(source_ids))


class NoModelScopeId(StackError):
    """qwen27b_model_source is modelscope, but a checkpoint the host serves has no ModelScope id."""


def on_source(entry: dict, model_source: str | None) -> dict:
    """A model entry as fetched from `model_source` (host data; None: the entry's default). ModelScope
    names checkpoints its own way: its id and revision (the entry's `modelscope`) replace the Hub's,
    so the dir name, the plan and the download all say what really came; `hub_id` keeps the Hub's."""
    if (model_source or entry.get("default_source", "hub")) != "modelscope":
        return entry
    ms = entry.get("modelscope")
    if not ms:
        raise NoModelScopeId(f"{entry['id']} has no ModelScope id in the stack (models: ... modelscope: {{id, revision}})")
    return {**entry, "id": ms["id"], "revision": ms["revision"], "hub_id": entry["id"]}


def resolve_stack(stack: dict, profile_name: str, overrides: dict | None = None, model: str | None = None,
                  model_source: str | None = None, models_dir: str | None = None) -> ResolvedStack:
    """Apply a host's overrides to one profile (and to the model/draft entries it names).

    Override layout: profile keys at the top level ({"driver": {...}, "serve": {...}}), plus
    "model" / "draft" dicts merged into the model entries, and shortcuts "model_revision" /
    "draft_revision" for the most common pin (refused beside "model": {"revision": ...}: one key,
    one spelling), and "speculative": {"floors": {...}} for the fallback's two floors (SPEC_FLOOR_KEYS;
    nothing else of the stack's speculative table is a host's to change). Every merged value is held to its allow-list (qwen27b/plan/allowlist.py).
    `model`: a key of the models table to serve instead of the profile's (host data qwen27b_model).
    `model_source`: host data qwen27b_model_source (`on_source`: ModelScope's ids where it is modelscope).
    `models_dir`: host data qwen27b_models_dir (plan/modelsdir.py): the models dir and its links there.
    """
    overrides = dict(overrides or {})
    if profile_name not in stack["profiles"]:
        close = difflib.get_close_matches(profile_name, list(stack["profiles"]), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise StackError(f"unknown profile '{profile_name}'{hint}; known: {', '.join(stack['profiles'])}")
    speculative = merge_overrides(stack.get("speculative") or {}, spec_floor_overrides(overrides.pop("speculative", None)),
                                  "speculative")
    model_over = overrides.pop("model", {}) or {}
    draft_over = overrides.pop("draft", {}) or {}
    for section, entry in (("model", model_over), ("draft", draft_over)):
        if f"{section}_revision" in overrides and isinstance(entry, dict) and "revision" in entry:
            raise StackError(f"'{section}_revision' and '{section}.revision' are one key given twice; give it once, "
                             f"as {{'{section}': {{'revision': ...}}}}")
    if "model_revision" in overrides:
        model_over = {**model_over, "revision": overrides.pop("model_revision")}
    if "draft_revision" in overrides:
        draft_over = {**draft_over, "revision": overrides.pop("draft_revision")}

    profile = merge_overrides(stack["profiles"][profile_name], overrides)
    if model is not None:
        if model not in stack["models"] or stack["models"][model].get("speculative"):
            targets = [k for k, v in stack["models"].items() if not v.get("speculative")]
            raise StackError(f"unknown model '{model}'; known: {', '.join(targets)}")
        profile["model"] = model
    model = _with_pins(stack, profile["model"], model_source, model_over, "model")
    draft = None
    if profile.get("draft"):
        draft = _with_pins(stack, profile["draft"], model_source, draft_over, "draft")
    elif draft_over:
        raise StackError(f"profile '{profile_name}' has no draft model to override")
    _check_allowed(profile, "")
    if "regression" in profile.get("serve", {}):
        try:
            check_limits(profile["serve"]["regression"])
        except ValueError as error:
            raise StackError(f"serve.regression: {error}") from None
    _check_allowed(model, "model.")
    if draft is not None:
        _check_allowed(draft, "draft.")
    build_name = profile["vllm"]["build"]
    if build_name not in stack["vllm_builds"]:
        raise StackError(f"unknown vllm build '{build_name}'; known: {', '.join(stack['vllm_builds'])}")
    return ResolvedStack(profile_name, profile, model, draft, with_models_dir(stack["paths"], models_dir), stack["sources"],
                         stack["vllm_builds"][build_name], stack["tools"], speculative,
                         stack.get("agent_parsers") or {}, stack.get("retry") or {},
                         stack.get("fetch_sources") or {})


def _with_pins(stack: dict, key: str, model_source: str | None, over: dict, what: str) -> dict:
    """models.<key> on its source with the host's overrides; its pinned files (filepins) kept only
    for the revision they describe."""
    try:
        filepins.validate(key, stack["models"][key], stack["sources"])
    except filepins.PinError as error:
        raise StackError(str(error)) from None
    own = on_source(stack["models"][key], model_source)
    return filepins.for_revision(merge_overrides(own, over, what), own)


SPEC_FLOOR_KEYS = ("min_acceptance", "min_draft_tokens")


def spec_floor_overrides(value) -> dict:
    """A host's {"floors": {min_acceptance: 0..1, min_draft_tokens: >= 1}}, checked; {} for None.
    (Why a host may: an admin who measured a method can hold it to a stricter floor; the CPU e2e sets
    one above what the tiny model accepts.)"""
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"floors"} or not isinstance(value.get("floors", {}), dict):
        raise StackError("stack key 'speculative': a host may set only {'floors': {'min_acceptance': ..., "
                         "'min_draft_tokens': ...}}")
    floors = value.get("floors") or {}
    for key, number in floors.items():
        if key not in SPEC_FLOOR_KEYS:
            close = difflib.get_close_matches(key, SPEC_FLOOR_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise StackError(f"unknown stack key 'speculative.floors.{key}'{hint}; known here: {', '.join(SPEC_FLOOR_KEYS)}")
        plain = isinstance(number, (int, float)) and not isinstance(number, bool)
        if key == "min_acceptance" and not (plain and 0 <= number <= 1):
            raise StackError(f"stack key 'speculative.floors.min_acceptance': {number!r} is not a fraction; "
                             "fix: a value from 0 to 1, e.g. 0.10")
        if key == "min_draft_tokens" and not (plain and isinstance(number, int) and number >= 1):
            raise StackError(f"stack key 'speculative.floors.min_draft_tokens': {number!r} is not a whole number "
                             "of 1 or more; fix: e.g. 64")
    # the verdict cites who set the floor: the host, not the stack's [spec-floor-ours]
    return {"floors": {**floors, "source": "qwen27b_stack_overrides"}} if floors else {}


def _check_allowed(tree: dict, prefix: str) -> None:
    """Every merged value that reaches a host matches its allow-list (qwen27b/plan/allowlist.py), the
    stack file's own values included."""
    from qwen27b.plan.allowlist import problem, walk

    for path, value in walk(tree, prefix):
        found = problem(path, value)
        if found:
            raise StackError(f"stack key '{path}': {found[0]}; fix: {found[1]}")


def checkpoint_metadata_dir(model: dict) -> Path:
    return CHECKPOINTS_DIR / model["metadata"]


def api_key_env_file(paths: dict) -> str:
    """HostLayout.api_key_env_file of a stack's `paths` (callers holding the stack dict)."""
    return HostLayout.of(paths).api_key_env_file


def health_status_file(paths: dict, copy: str | None = None) -> str:
    """HostLayout.health_status of a stack's `paths` (callers holding the stack dict); a copy of
    qwen27b_instances has its own, health@NAME.json."""
    layout = HostLayout.of(paths)
    return layout.copy_health_status(copy) if copy else layout.health_status
