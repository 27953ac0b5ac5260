"""The engine profile catalog (stack.yaml `catalog:`): named routes a lab picks by host data.

An entry builds on a generation profile (sm70, sm75plus, cpu-smoke) and names what it was validated
with: the engine release, the target and draft checkpoints, the speculative order, serve settings,
the hardware it ran on and the figures measured there (labelled with who measured them). Exactly one
entry per profile is its default. `apply` turns an entry into the stack the gate plans with (the
profile's blocks with the entry's changes), so the planner's own rules (memory, draft on every card,
context, copies) adapt it to each host unchanged. Pure functions of the stack file and host data.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass

HOST_KEY = "qwen27b_engine_profile"
ENGINE_BLOCKS = ("vllm", "torch", "cuda", "packages")  # what `engine:` may change in its profile


class CatalogError(ValueError):
    """A catalog entry that cannot be used here: `problem` and `fix` name what and how."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}. Fix: {fix}")


@dataclass(frozen=True)
class Chosen:
    """The entry a host plans with and why (one line of the plan)."""

    name: str
    profile: str
    reason: str

    def line(self) -> str:
        return f"engine profile {self.name}: {self.reason}"


def entries(stack: dict) -> dict:
    return stack.get("catalog") or {}


def default_for(stack: dict, profile: str) -> str:
    """The profile's default entry (check_catalog holds there is exactly one)."""
    names = [n for n, e in entries(stack).items() if e["profile"] == profile and e.get("default")]
    if len(names) != 1:
        raise CatalogError(f"profile '{profile}' has {len(names)} default catalog entries",
                           "mark exactly one of its entries `default: true` in stack.yaml")
    return names[0]


def _unknown(stack: dict, name: str) -> CatalogError:
    known = list(entries(stack))
    close = difflib.get_close_matches(name, known, n=1)
    return CatalogError(f"{name!r} is not an entry of the engine profile catalog",
                        (f"did you mean '{close[0]}'? " if close else "") + f"use one of {', '.join(known)}, "
                        "or leave it out (the generation's default; `qwen27b profiles` lists them)")


def check_choice(stack: dict, profile: str | None, wanted: str | None) -> str | None:
    """Host data, before any host is touched: qwen27b_engine_profile names an entry, and one of
    qwen27b_profile's where both are given. Returns the profile the entry implies (cpu-smoke turns the
    CPU profile on as qwen27b_profile: cpu-smoke does); raises CatalogError."""
    if wanted is None:
        return profile
    if wanted not in entries(stack):
        raise _unknown(stack, wanted)
    entry_profile = entries(stack)[wanted]["profile"]
    if profile is not None and profile != entry_profile:
        same = [n for n, e in entries(stack).items() if e["profile"] == profile]
        raise CatalogError(f"{wanted!r} is an entry of the {entry_profile} profile, and qwen27b_profile is {profile!r}",
                           f"leave qwen27b_profile out, or use one of {profile}'s entries: {', '.join(same)}")
    return "cpu-smoke" if entry_profile == "cpu-smoke" else profile


def choose(stack: dict, profile: str, wanted: str | None, gpu: str | None = None, cc: str | None = None,
           model: str | None = None) -> Chosen:
    """The entry for a host whose GPUs chose `profile` (gate._choose_profile). An entry of another
    generation is refused naming the GPU's. `model`: host data qwen27b_model, which replaces the
    entry's target (the line says so)."""
    chosen = _choose(stack, profile, wanted, gpu, cc)
    target = entries(stack)[chosen.name]["model"]
    if model is None or model == target:
        return chosen
    return Chosen(chosen.name, profile, f"{chosen.reason}; its target {target} replaced by qwen27b_model {model}, "
                  "a checkpoint this entry was not validated with")


def _choose(stack: dict, profile: str, wanted: str | None, gpu: str | None, cc: str | None) -> Chosen:
    if wanted is None:
        name = default_for(stack, profile)
        how = "qwen27b_profile cpu-smoke" if profile == "cpu-smoke" else f"compute capability {cc}" if cc else profile
        return Chosen(name, profile, f"the {profile} profile's default ({how}; no {HOST_KEY}) [catalog-ours]")
    if wanted not in entries(stack):
        raise _unknown(stack, wanted)
    entry = entries(stack)[wanted]
    if entry["profile"] != profile:
        same = [n for n, e in entries(stack).items() if e["profile"] == profile]
        bounds = stack["profiles"][entry["profile"]].get("compute_capability")
        span = f" (compute capability {bounds['min']}-{bounds['max']})" if bounds else ""
        what = f"this host's {gpu} is compute capability {cc}, the {profile} generation" if gpu else \
            f"this host plans the {profile} profile"
        raise CatalogError(f"{HOST_KEY} {wanted!r} is an entry of the {entry['profile']} profile{span}; {what}",
                           f"use one of {', '.join(same)}, or leave {HOST_KEY} out (the default, {default_for(stack, profile)})")
    return Chosen(wanted, profile, f"{HOST_KEY} (the {profile} default is {default_for(stack, profile)}) [catalog-ours]")


def _merge(base, change, path: str):
    """A deep merge that refuses keys the profile does not have; null drops a setting."""
    if not isinstance(change, dict) or not isinstance(base, dict):
        return copy.deepcopy(change)
    out = copy.deepcopy(base)
    for key, value in change.items():
        if key not in out:
            close = difflib.get_close_matches(key, list(out), n=1)
            raise CatalogError(f"catalog key '{path}.{key}' is not a key of its profile"
                               + (f" (did you mean '{close[0]}'?)" if close else ""), "use the profile's own keys")
        out[key] = _merge(out[key], value, f"{path}.{key}") if value is not None else None
    return out


def profile_of(stack: dict, name: str) -> dict:
    """The entry's profile as the gate plans it: the generation profile with the entry's engine
    blocks, serve settings, speculative order, target and draft."""
    entry = entries(stack)[name]
    profile = copy.deepcopy(stack["profiles"][entry["profile"]])
    engine = entry.get("engine", "profile")
    if engine != "profile":
        for block, change in engine.items():
            if block not in ENGINE_BLOCKS:
                raise CatalogError(f"catalog entry {name}: engine.{block} is not an engine block",
                                   f"use {', '.join(ENGINE_BLOCKS)}")
            profile[block] = _merge(profile[block], change, f"catalog.{name}.engine.{block}")
    profile["serve"] = _merge(profile["serve"], entry.get("serve") or {}, f"catalog.{name}.serve")
    for key in ("speculative_auto", "model", "draft"):
        profile[key] = copy.deepcopy(entry[key])
    return profile


def apply(stack: dict, name: str) -> dict:
    """The stack with the entry's profile in place of its generation's (the rest shared, unchanged)."""
    entry = entries(stack)[name]
    return {**stack, "profiles": {**stack["profiles"], entry["profile"]: profile_of(stack, name)}}


def entry_stack(stack: dict, profile: str, wanted: str | None) -> dict:
    """The stack a host of `profile` with qwen27b_engine_profile `wanted` plans with (for the tools
    that resolve a profile themselves: doctor, mirror); raises CatalogError as `choose` does."""
    return apply(stack, choose(stack, profile, wanted).name)


def check_catalog(stack: dict) -> list[str]:
    """Every problem of the catalog section: profiles, models, sources, one default per profile."""
    problems, models, sources = [], stack.get("models") or {}, stack.get("sources") or {}
    for name, entry in entries(stack).items():
        if entry.get("profile") not in stack["profiles"]:
            problems.append(f"{name}: profile {entry.get('profile')!r} is not a profile")
            continue
        for key in ("model", "draft"):
            if entry.get(key) is not None and entry[key] not in models:
                problems.append(f"{name}: {key} {entry[key]!r} is not a key of models:")
        cited = list(ids(entry.get("source")))
        cited += ids((entry.get("validated_on") or {}).get("source"))
        cited += [i for f in entry.get("figures") or [] for i in ids(f.get("source"))]
        problems += [f"{name}: source '{i}' is not under sources:" for i in cited if i not in sources]
        try:
            profile_of(stack, name)
        except CatalogError as error:
            problems.append(f"{name}: {error}")
    for profile in stack["profiles"]:
        try:
            default_for(stack, profile)
        except CatalogError as error:
            problems.append(str(error))
    return problems


def ids(value) -> list[str]:
    """A `source` value (one id or a list) as a list."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def methods(entry: dict) -> list[str]:
    """The speculative methods the entry can use, in its order (a draft for DFlash2)."""
    return [m for m in entry.get("speculative_auto") or [] if m != "dflash2" or entry.get("draft")]


def figures_text(entry: dict) -> str:
    """The measured figures with who measured them, e.g. '206 tok/s (vendor)'."""
    return "; ".join(f"{f['tok_s']} tok/s ({f['by']}: {f['what']})" for f in entry.get("figures") or []) or "none published"


def validated_text(entry: dict) -> str:
    v = entry.get("validated_on")
    if not v:
        return "not validated"
    if not v.get("count"):
        return f"CPU only ({v['by']})"
    links = f", {v['links']}" if v.get("links") else ""
    return f"{v['count']}x {v['gpu']} {v['memory_gib']} GiB, TP {v['tp']}{links} ({v['by']})"
