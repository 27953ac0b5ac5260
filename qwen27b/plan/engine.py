"""Engine choices for `vllm serve` that owners of the hardware measured: the KV-cache dtype, the
speculative method and depth, the agent parsers. Pure functions of the stack file, the checkpoint's
shape and host data; each returns its value with the reason and the sources the plan prints.
Kept apart from planner.py (memory and sizing) so each decision reads on its own.
"""

from __future__ import annotations

import re
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
    if sources and value.startswith("fp8"):
        return value, (f"{value} KV, set explicitly as the engine vendor's release profile does: its DFlash2 "
                       f"verification is built on it, and it halves the KV per token (262,144 tokens of context); "
                       f"never 'auto', which follows a checkpoint's FP8-KV directive{asked} {stack.cite(sources)}")
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
    """The speculative method for one host: 'mtp', 'dflash2', 'ngram' or 'off', its depth (tokens per step),
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
    if method == "ngram" and not stack.speculative.get("ngram"):
        return "the stack has no speculative.ngram entry"
    if method == "dflash2" and target.lm_head_quantized and not quant_lm_head_switch(stack):
        switch = stack.build.get("quant_lm_head_dflash2")
        newer = (f"; vLLM build '{stack.profile['vllm']['build']}' {switch['versions']} opts in with "
                 f"{switch['env']} {stack.cite(switch.get('source'))}, this profile has {stack.profile['vllm']['version']}"
                 if switch else "")
        return (f"{stack.model['id']} quantizes its lm_head, which the DFlash2 draft shares: "
                f"{stack.source_text('dflash-dense-head')}{newer}")
    return None


def quant_lm_head_switch(stack: ResolvedStack) -> dict | None:
    """The build's opt-in for DFlash2 beside a quantized lm_head (1Cat PR 451), where this profile's
    version carries it; None elsewhere."""
    switch = stack.build.get("quant_lm_head_dflash2")
    if switch and _version_in(str(stack.profile["vllm"]["version"]), switch.get("versions")):
        return switch
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
    if method == "ngram":
        ngram = stack.speculative["ngram"]
        return ngram["depth"], (f"n-gram lookup: up to {ngram['depth']} tokens copied from where the last "
                                f"{ngram['prompt_lookup_min']}-{ngram['prompt_lookup_max']} tokens occurred earlier "
                                f"in the context; no draft model {stack.cite(ngram.get('source'))}")
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
    """The method and depth for qwen27b_speculative `setting` (auto | mtp | dflash2 | ngram | off). auto walks
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
    method, depth, how, skipped = _first_fit(stack, target, tp, max_model_len)
    if method is not None:
        passed = "".join(f"; not {m}: {w}" for m, w in skipped)
        return SpecChoice(method, depth, f"auto: {method}, {how}{passed}", tuple(skipped))
    passed = "; ".join(f"not {m}: {w}" for m, w in skipped)
    return SpecChoice("off", 0, f"auto: no speculative method fits this host ({passed})", tuple(skipped))


def speculative_config(stack: ResolvedStack, choice: SpecChoice, draft_path: str | None) -> dict:
    """The --speculative-config JSON for a chosen method, with the names the build accepts."""
    if choice.method == "mtp":
        return {"method": stack.speculative["mtp"]["method"], "num_speculative_tokens": choice.depth}
    if choice.method == "ngram":
        ngram = stack.speculative["ngram"]
        return {"method": ngram["method"], "num_speculative_tokens": choice.depth,
                "prompt_lookup_max": ngram["prompt_lookup_max"], "prompt_lookup_min": ngram["prompt_lookup_min"]}
    spec = stack.draft["speculative"]
    config = {"method": spec["method"], "model": draft_path, "num_speculative_tokens": choice.depth}
    for key in ("draft_sample_method", "kv_cache_dtype"):
        if spec.get(key):
            config[key] = spec[key]
    if stack.profile["serve"].get("attention_backend"):  # the draft's attention as the target's [1cat-release-profile]
        config["attention_backend"] = stack.profile["serve"]["attention_backend"]
    return config


# --- Agent-ready API: reasoning and tool-call parsers ---------------------------------------------

PARSER_NAME = re.compile(r"^[a-z0-9_]{1,40}$")  # a registered parser name; it reaches the unit's argv


@dataclass(frozen=True)
class AgentParsers:
    """--reasoning-parser / --tool-call-parser for one host (None: off), with why."""

    reasoning: str | None
    tool_call: str | None
    reason: str

    @property
    def on(self) -> bool:
        return self.reasoning is not None


class AgentRefused(ValueError):
    """qwen27b_agent_parsers true where the checkpoint or build has no parsers; `cause`, `fix`."""

    def __init__(self, cause: str, fix: str):
        self.cause, self.fix = cause, fix
        super().__init__(f"{cause}. Fix: {fix}")


def agent_parsers(stack: ResolvedStack, setting: bool | None) -> AgentParsers:
    """The parsers for qwen27b_agent_parsers `setting` (None: on where the stack knows them). On when
    the checkpoint's family (models[].agent_parsers) has an entry whose `builds` list the profile's
    build; a `true` the host cannot honour is refused (AgentRefused), never silently dropped."""
    family = stack.model.get("agent_parsers")
    entry = stack.agent_parsers.get(family) if family else None
    build = stack.profile["vllm"]["build"]
    why_not = None
    if entry is None:
        why_not = (f"{stack.model['id']} has no agent_parsers entry in the stack (not a Qwen3-family chat model: "
                   "it speaks neither <think> reasoning nor Qwen3's XML tool calls, a parser would prove nothing)"
                   + (f"; recorded with the qwen3 parser: its answer went to `reasoning`, `content` null "
                      f"{stack.cite(stack.model['agent_parsers_off'])}"
                      if stack.model.get("agent_parsers_off") else ""))
    elif build not in (entry.get("builds") or []):
        why_not = (f"vLLM build '{build}' is not known to register the {family} parsers (the stack lists "
                   f"{', '.join(entry.get('builds') or {}) or 'no build'})")
    if why_not:
        if setting:
            raise AgentRefused(f"qwen27b_agent_parsers true: {why_not}",
                               "remove qwen27b_agent_parsers (the planner turns them on where they fit) or set it false")
        return AgentParsers(None, None, f"agent parsers off: {why_not}")
    if setting is False:
        return AgentParsers(None, None, "agent parsers off: qwen27b_agent_parsers is false (reasoning stays in "
                                        "`content`, tool_choice auto is refused by vLLM)")
    names = (entry["reasoning_parser"], entry["tool_call_parser"])
    for name in names:
        if not PARSER_NAME.match(str(name)):
            raise ValueError(f"stack agent_parsers.{family}: {name!r} is not a parser name (a-z, 0-9, _)")
    how = "qwen27b_agent_parsers true" if setting else "on by default"
    return AgentParsers(*names, f"{how}: {stack.model['id']} is a {family}-family model, the parsers its build "
                                f"registers {stack.cite(entry['builds'][build])}")


# --- The measured fallback --------------------------------------------------------------------------

_COUNTER = r"^{name}_total(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)\s*$"
SPEC_DRAFT_TOKENS = re.compile(_COUNTER.format(name="vllm:spec_decode_num_draft_tokens"), re.M)
SPEC_ACCEPTED_TOKENS = re.compile(_COUNTER.format(name="vllm:spec_decode_num_accepted_tokens"), re.M)


def spec_counters(metrics_text: str) -> tuple[float, float] | None:
    """(drafted, accepted) tokens from a /metrics text, summed over label sets (engines); None when
    the text has no spec-decode counters (speculation off, or not vLLM's /metrics)."""
    drafted = SPEC_DRAFT_TOKENS.findall(metrics_text or "")
    if not drafted:
        return None
    return sum(map(float, drafted)), sum(map(float, SPEC_ACCEPTED_TOKENS.findall(metrics_text)))


@dataclass(frozen=True)
class Verdict:
    """What the counters say about the method in use: keep (True), drop (False) or not enough
    evidence (None); the acceptance measured and the figures behind it."""

    keep: bool | None
    acceptance: float | None
    reason: str


def floors(stack: ResolvedStack, method: str) -> dict:
    """The floors for `method`: the method's own min_acceptance over speculative.floors."""
    base = dict(stack.speculative.get("floors") or {})
    own = (stack.speculative.get(method) or {}).get("min_acceptance")
    if own is not None:
        base["min_acceptance"] = own
    return base


def judge_acceptance(stack: ResolvedStack, method: str, before: str, after: str) -> Verdict:
    """The method's acceptance between two /metrics scrapes (counters are cumulative), against the
    stack's floors. No verdict below min_draft_tokens drafted: too little to judge a method by."""
    floor = floors(stack, method)
    cite = stack.cite(floor.get("source"))
    start, end = spec_counters(before), spec_counters(after)
    if end is None:
        return Verdict(None, None, f"{method}: /metrics has no vllm:spec_decode_* counters: is speculation on?")
    drafted, accepted = end[0] - (start or (0, 0))[0], end[1] - (start or (0, 0))[1]
    if drafted < floor["min_draft_tokens"]:
        return Verdict(None, None, f"{method}: {drafted:.0f} tokens drafted, fewer than the {floor['min_draft_tokens']} "
                                   f"a verdict needs {cite}")
    rate = accepted / drafted
    measured = f"{method} accepted {accepted:.0f} of {drafted:.0f} drafted tokens ({rate:.1%})"
    if rate < floor["min_acceptance"]:
        return Verdict(False, rate, f"{measured}, below the floor {floor['min_acceptance']:.0%} {cite}")
    return Verdict(True, rate, f"{measured}, at or above the floor {floor['min_acceptance']:.0%} {cite}")


def _first_fit(stack: ResolvedStack, target: ModelShape, tp: int, max_model_len: int,
               tried: list[str] | tuple = ()) -> tuple[str | None, int, str, list]:
    """The first method of the profile's speculative_auto list, not in `tried`, that this host can
    run and no evidence rules out: (method, depth, how, skipped); method None when none fits."""
    skipped = []
    for method in stack.profile.get("speculative_auto") or []:
        if method in tried:
            continue
        reason = cannot_run(method, stack, target) or no_accept(method, stack, tp)
        if reason:
            skipped.append((method, reason))
            continue
        depth, how = _depth(method, stack, max_model_len)
        return method, depth, how, skipped
    return None, 0, "", skipped


def next_method(stack: ResolvedStack, target: ModelShape, tried: list[str], tp: int, max_model_len: int,
                why: str) -> SpecChoice:
    """The method to try after `tried` (in order; the last one just failed `why`): the next one of the
    profile's speculative_auto list this host can run that no evidence rules out, else off."""
    method, depth, how, skipped = _first_fit(stack, target, tp, max_model_len, tried)
    passed = "".join(f"; not {m}: {w}" for m, w in skipped)
    if method is not None:
        return SpecChoice(method, depth, f"fallback: {why}; next {method}, {how}{passed}", tuple(skipped))
    return SpecChoice("off", 0, f"fallback: {why}; no other method fits, speculation off{passed}", tuple(skipped))


def fallback(stack: ResolvedStack, target: ModelShape, choice: SpecChoice, tried: list[str], tp: int,
             max_model_len: int, before: str, after: str) -> tuple[SpecChoice | None, Verdict]:
    """Keep the method in use (None) or the one to re-render the flags with, from the /metrics
    scrapes around verify's request. `tried` lists the methods already dropped this deploy."""
    if not choice.on:
        return None, Verdict(None, None, "speculation off: nothing to judge")
    verdict = judge_acceptance(stack, choice.method, before, after)
    if verdict.keep is not False:
        return None, verdict
    return next_method(stack, target, list(tried) + [choice.method], tp, max_model_len, verdict.reason), verdict
