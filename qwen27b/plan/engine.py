"""Engine choices for `vllm serve` that owners of the hardware measured: the KV-cache dtype, the
speculative method and depth, the agent parsers. Pure functions of the stack file, the checkpoint's
shape and host data; each returns its value with the reason and the sources the plan prints.
Kept apart from planner.py (memory and sizing) so each decision reads on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen27b.plan.checkpoint import ModelShape
from qwen27b.plan.stack import ResolvedStack


def kv_cache_dtype(stack: ResolvedStack, target: ModelShape, on_gpu: bool) -> tuple[str, str]:
    """--kv-cache-dtype and why. A profile with `serve.kv_cache_source` (sm70) sets its dtype
    explicitly: `auto` would follow a checkpoint's FP8-KV directive, slow on Volta."""
    serve = stack.profile["serve"]
    value = serve.get("kv_cache_dtype", "auto")
    sources = serve.get("kv_cache_source")
    asked = f"; this checkpoint asks for {target.kv_cache_quant} KV, overridden" if target.kv_cache_quant else ""
    if sources and value != "auto":
        return value, (f"{value} KV set explicitly, never 'auto': 'auto' follows a checkpoint's FP8-KV directive, and "
                       f"FP8 KV takes a slower scalar paged-attention path on sm_70{asked} {stack.cite(sources)}")
    if on_gpu and serve["dtype"] == "float16":
        return value, f"KV in the model dtype; fp8_e5m2 is experimental on V100 {stack.cite('kv-fp8-v100')}"
    follows = f" (auto: follows the checkpoint's {target.kv_cache_quant} KV directive)" if target.kv_cache_quant \
        and value == "auto" else ""
    return value, f"KV in the model dtype{follows}"


@dataclass(frozen=True)
class SpecChoice:
    """The speculative method for one host: 'mtp', 'dflash2' or 'off', its depth (tokens per step),
    why, and the methods passed over with their reasons (printed in the plan)."""

    method: str
    depth: int
    reason: str
    skipped: tuple = ()  # ((method, why), ...)

    @property
    def on(self) -> bool:
        return self.method != "off"


OFF = SpecChoice("off", 0, "qwen27b_speculative is off")


def _version_in(version: str, spec: str | None) -> bool:
    from packaging.specifiers import SpecifierSet

    return spec is None or SpecifierSet(spec).contains(version, prereleases=True)


class SpecRefused(ValueError):
    """A method named in host data cannot run on this host; `cause` and `fix` are for the admin."""

    def __init__(self, cause: str, fix: str):
        self.cause, self.fix = cause, fix
        super().__init__(f"{cause}. Fix: {fix}")


def cannot_run(method: str, stack: ResolvedStack, target: ModelShape) -> str | None:
    """Why `method` cannot run with this checkpoint and profile at all; None when it can."""
    if method == "mtp" and not target.mtp_layers:
        return f"{stack.model['id']} has no MTP layers (its config.json sets no mtp_num_hidden_layers)"
    if method == "dflash2" and not stack.draft:
        return f"profile {stack.profile_name} has no DFlash2 draft"
    if method == "dflash2" and target.lm_head_quantized:
        return (f"{stack.model['id']} quantizes its lm_head, which the DFlash2 draft shares: "
                f"{stack.source_text('dflash-dense-head')}")
    return None


def no_accept(method: str, stack: ResolvedStack, tp: int) -> str | None:
    """The stack's evidence that `method` accepts ~nothing with this build at this TP size, if any."""
    vllm = stack.profile["vllm"]
    for rule in stack.speculative.get("no_accept") or []:
        if (rule["method"] == method and rule.get("build", vllm["build"]) == vllm["build"]
                and _version_in(str(vllm["version"]), rule.get("versions")) and tp >= rule.get("min_tp", 1)):
            return f"{rule['why']} at TP {tp} {stack.cite(rule.get('source'))}"
    return None


def dflash2_reason(stack: ResolvedStack, tokens: int) -> str:
    return f"DFlash2 draft {stack.draft['id']}, block {tokens + 1} -> {tokens} tokens per step {stack.cite('dflash2')}"


def _depth(method: str, stack: ResolvedStack, max_model_len: int) -> tuple[int, str]:
    if method == "dflash2":
        tokens = stack.draft["speculative"]["num_speculative_tokens"]
        return tokens, dflash2_reason(stack, tokens)
    mtp = stack.speculative["mtp"]
    long = mtp.get("long_context") or {}
    if long and max_model_len >= long["from_max_model_len"]:
        return long["depth"], (f"k={long['depth']}: --max-model-len {max_model_len} >= {long['from_max_model_len']}, where "
                               f"shorter drafts decode faster {stack.cite(['v100-skinny-mtp', '1cat-mtp-long'])}")
    return mtp["depth"], f"k={mtp['depth']}, the checkpoint's own MTP layer {stack.cite(mtp.get('source'))}"


def choose_speculative(stack: ResolvedStack, target: ModelShape, setting: str, tp: int, max_model_len: int) -> SpecChoice:
    """The method and depth for qwen27b_speculative `setting` (auto | mtp | dflash2 | off). auto walks
    the profile's speculative_auto list and takes the first method this host can run that no
    no_accept evidence rules out, else off. A named method that cannot run is refused (SpecRefused);
    evidence against it is printed, not obeyed: the admin asked for it."""
    if setting == "off":
        return OFF
    if setting != "auto":
        why = cannot_run(setting, stack, target)
        if why:
            raise SpecRefused(f"qwen27b_speculative {setting}: {why}",
                              "set qwen27b_speculative to auto (the planner picks what fits) or off")
        depth, how = _depth(setting, stack, max_model_len)
        evidence = no_accept(setting, stack, tp)
        return SpecChoice(setting, depth, f"qwen27b_speculative {setting}; {how}"
                          + (f"; WARNING, asked for despite: {evidence}" if evidence else ""))
    skipped = []
    for method in stack.profile.get("speculative_auto") or []:
        why = cannot_run(method, stack, target) or no_accept(method, stack, tp)
        if why:
            skipped.append((method, why))
            continue
        depth, how = _depth(method, stack, max_model_len)
        passed = "".join(f"; not {m}: {w}" for m, w in skipped)
        return SpecChoice(method, depth, f"auto: {method}, {how}{passed}", tuple(skipped))
    passed = "; ".join(f"not {m}: {w}" for m, w in skipped)
    return SpecChoice("off", 0, f"auto: no speculative method fits this host ({passed})", tuple(skipped))


def speculative_config(stack: ResolvedStack, choice: SpecChoice, draft_path: str | None) -> dict:
    """The --speculative-config JSON for a chosen method, with the names the build accepts."""
    if choice.method == "mtp":
        return {"method": stack.speculative["mtp"]["method"], "num_speculative_tokens": choice.depth}
    spec = stack.draft["speculative"]
    config = {"method": spec["method"], "model": draft_path, "num_speculative_tokens": choice.depth}
    for key in ("draft_sample_method", "kv_cache_dtype"):
        if spec.get(key):
            config[key] = spec[key]
    return config
