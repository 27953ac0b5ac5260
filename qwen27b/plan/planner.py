"""The memory and flag planner: facts + stack + checkpoint shape -> the `vllm serve` flags.

A pure function. Every flag carries the reason it has its value; a user may pin any flag
(`qwen27b_serve_flags`), and the planner then checks the pin fits and says so if it does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from qwen27b.plan import engine
from qwen27b.plan.checkpoint import DTYPE_BYTES, ModelShape
from qwen27b.onhost.contract import MIDDLEWARE
from qwen27b.plan.stack import ResolvedStack
from qwen27b.plan.topology import nvlink_split, pick_group, plan_all_reduce

MiB = 2**20
GiB = 2**30
MIN_MODEL_LEN = 2048  # below this a chat model is not useful; refuse instead of shrinking further


class PlanRefused(ValueError):
    """No serving configuration fits; `cause` and `fix` are for the lab admin."""

    def __init__(self, cause: str, fix: str):
        self.cause, self.fix = cause, fix
        super().__init__(f"{cause}. Fix: {fix}")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the planner sees it (from nvidia-smi, or from lspci + the stack's GPU table)."""

    index: int
    name: str
    memory_mib: int
    compute_capability: str


@dataclass(frozen=True)
class Flag:
    name: str
    value: str | None  # None: a switch without a value
    reason: str
    pinned: bool = False


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes per GPU (or of host RAM on the CPU profile), each with what it is for."""

    device: str
    total: int
    usable: int
    weights: int
    draft: int
    activations: int
    cuda_graphs: int
    overhead: int
    recurrent_state: int
    kv_bytes_per_token: int
    kv_cap: int | None = None  # CPU: vLLM takes a fixed KV space (VLLM_CPU_KVCACHE_SPACE)
    reserved: int = 0  # the driver's own reserve within the reported total (CUDA never sees it)

    @property
    def headroom(self) -> int:
        """What the utilization cap leaves free of what CUDA sees: the CUDA context, NCCL buffers."""
        return self.total - self.reserved - self.usable

    @property
    def kv_room(self) -> int:
        room = self.usable - (self.weights + self.draft + self.activations + self.cuda_graphs
                              + self.overhead + self.recurrent_state)
        return room if self.kv_cap is None else min(room, self.kv_cap)

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv_room) // self.kv_bytes_per_token if self.kv_bytes_per_token else 0

    def rows(self) -> list[tuple[str, str]]:
        def gib(n: int) -> str:
            return f"{n / GiB:7.2f} GiB"
        gpu = [("driver reserve", gib(self.reserved)), ("headroom outside the cap", gib(self.headroom))] \
            if self.device == "per-GPU" else []
        return [
            (f"{self.device} memory" + (" (nvidia-smi)" if gpu else ""), gib(self.total)),
            *gpu,
            ("usable (utilization cap)", gib(self.usable)),
            ("target weights", gib(self.weights)),
            ("draft weights", gib(self.draft)),
            ("activations (prefill chunk)", gib(self.activations)),
            ("CUDA graphs", gib(self.cuda_graphs)),
            ("runtime overhead", gib(self.overhead)),
            ("recurrent (GDN) state, all seqs", gib(self.recurrent_state)),
            ("left for KV cache", gib(self.kv_room)),
            ("KV bytes per token", f"{self.kv_bytes_per_token:,} B"),
            ("KV capacity", f"{self.kv_tokens:,} tokens"),
        ]


@dataclass
class ServePlan:
    flags: list[Flag]
    env: dict[str, str]
    memory: MemoryBudget
    notes: list[str] = field(default_factory=list)
    spec: engine.SpecChoice = engine.OFF  # the speculative method in the flags (plan/engine.py)
    tp_group: tuple[int, ...] = ()  # the GPUs of the TP group (nvidia-smi indices); () on the CPU profile

    def value(self, name: str) -> str | None:
        for flag in self.flags:
            if flag.name == name:
                return flag.value
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(flag.name == name for flag in self.flags)

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag in self.flags:
            out.append(flag.name)
            if flag.value is not None:
                out.append(flag.value)
        return out


@dataclass(frozen=True)
class ServeInputs:
    """Everything the planner reads, gathered by the gate from facts, stack and host data."""

    stack: ResolvedStack
    gpus: list[Gpu]
    target: ModelShape
    draft: ModelShape | None
    model_path: str
    draft_path: str | None
    served_name: str
    bind_address: str
    bind_reason: str
    port: int
    speculative: bool
    prefix_caching: bool
    pins: dict
    ram_bytes: int | None = None
    route_guard: bool = False  # an API key is set: every route but /health needs it (route_auth.py)
    topology: dict | None = None  # GpuTopology: the links between the GPUs (None: not read)
    spec: engine.SpecChoice | None = None  # the speculative method (engine.choose_speculative); None: DFlash2 when `draft`
    agent: engine.AgentParsers | None = None  # reasoning / tool-call parsers (engine.agent_parsers); None: off, unsaid

    @property
    def speculation(self) -> engine.SpecChoice:
        if self.spec is not None:
            return self.spec
        if self.draft is not None and self.speculative:
            tokens = self.stack.draft["speculative"]["num_speculative_tokens"]
            return engine.SpecChoice("dflash2", tokens, engine.dflash2_reason(self.stack, tokens))
        return engine.OFF

    @property
    def draft_served(self) -> bool:
        """DFlash2 with its draft: the draft's weights and KV count, its flags and switches apply."""
        return self.draft is not None and self.speculation.method == "dflash2"


# pins the deploy adds itself, each with its reason (plan/gateway.py gateway_needs)
PIN_REASONS = {"--enable-force-include-usage": "behind a qwen27b gateway (added for it): every stream reports its "
                                               "usage, which the gateway counts and budgets per key"}


def _pin(pins: dict, name: str, cast):
    if name not in pins:
        return None
    value = pins[name]
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise PlanRefused(f"pinned {name} {value!r} is not a {cast.__name__}",
                          f"set qwen27b_serve_flags {name} to a number") from None


def _divides(tp: int, model: ModelShape) -> bool:
    kv = model.num_kv_heads
    return model.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def choose_tp(gpus: list[Gpu], model: ModelShape, pinned: int | None) -> tuple[int, str]:
    n = len(gpus)
    if pinned is not None:
        if pinned > n:
            raise PlanRefused(f"--tensor-parallel-size {pinned} is more than the {n} GPU(s) on this host",
                              f"use a TP size of at most {n}")
        if n % pinned:
            raise PlanRefused(f"--tensor-parallel-size {pinned} does not divide the {n} GPUs",
                              "pick a TP size that divides the GPU count, or list GPUs with qwen27b_gpu_indices")
        if not _divides(pinned, model):
            raise PlanRefused(f"--tensor-parallel-size {pinned} does not divide the model's "
                              f"{model.num_attention_heads} attention / {model.num_kv_heads} KV heads",
                              "use a TP size that divides the head counts (1, 2, 4, ...)")
        return pinned, "fits the GPUs and the model's heads"
    # a TP size dividing the GPU count; when only 1 does (3 GPUs: one of 4 left out as worn), the
    # largest the heads allow, the rest idle
    for divides_n in (True, False):
        for tp in range(n, 0 if not divides_n else 1, -1):
            if (n % tp == 0 or not divides_n) and _divides(tp, model):
                why = "decode is memory-bandwidth bound, so one TP group over every GPU multiplies bandwidth"
                if tp != n:
                    why += f"; {n} does not divide the model's heads, so {tp}"
                return tp, f"{why} ({n} GPU(s) visible)"
    return 1, "single GPU"


def _budget(inp: ServeInputs, tp: int, util: float, max_len: int, seqs: int, batched: int) -> MemoryBudget:
    serve = inp.stack.profile["serve"]
    kv_dtype = serve.get("kv_cache_dtype", "auto")
    kvb = DTYPE_BYTES.get(kv_dtype, 2) if kv_dtype != "auto" else DTYPE_BYTES[_act_dtype(inp)]
    act_bytes = DTYPE_BYTES[_act_dtype(inp)]
    method = inp.speculation.method
    use_draft = inp.draft_served
    draft_split = 1 if inp.stack.build.get("draft_on_every_card") else tp  # 1Cat loads the drafter whole per card
    kv_per_token = inp.target.kv_bytes_per_token(tp, kvb)
    if use_draft:
        # the draft's own KV dtype (speculative.kv_cache_dtype): `auto` is counted in the activation dtype,
        # not the target's fp8: whether 1Cat keeps a draft's KV at fp8 is not published, and the larger
        # figure cannot plan more sequences than the cards hold
        draft_kv = ((inp.stack.draft or {}).get("speculative") or {}).get("kv_cache_dtype", "auto")
        draft_kvb = DTYPE_BYTES[_act_dtype(inp)] if draft_kv == "auto" else DTYPE_BYTES.get(draft_kv, 2)
        kv_per_token += inp.draft.kv_bytes_per_token(draft_split, draft_kvb)
    if method == "mtp" and inp.target.full_attention_layers:  # each MTP layer keeps its own attention KV
        kv_per_token += inp.target.mtp_layers * inp.target.kv_bytes_per_token(tp, kvb) // inp.target.full_attention_layers
    activations = int(batched * inp.target.intermediate_size * 2 * act_bytes / tp * serve.get("activation_factor", 2.0))
    reserved = 0
    if inp.gpus:
        total = min(g.memory_mib for g in inp.gpus) * MiB
        reserved = serve.get("driver_reserved_mib", 0) * MiB
        device = "per-GPU"
    else:
        total = inp.ram_bytes or 0
        device = "host RAM"
        util = 1.0
    overhead = serve.get("runtime_overhead_mib", 0) * MiB
    graphs = 0 if (serve.get("enforce_eager") or not inp.gpus) else serve.get("cuda_graph_reserve_mib", 0) * MiB
    kv_cap = None if inp.gpus else int(serve.get("cpu_kvcache_space_gib", 1) * GiB)
    return MemoryBudget(
        device=device,
        total=total,
        usable=int((total - reserved) * util),
        reserved=reserved,
        weights=inp.target.weight_bytes // tp,
        draft=(inp.draft.weight_bytes // draft_split) if use_draft else 0,
        activations=activations,
        cuda_graphs=graphs,
        overhead=overhead,
        recurrent_state=seqs * inp.target.recurrent_state_bytes(tp),
        kv_bytes_per_token=kv_per_token,
        kv_cap=kv_cap,
    )


def _act_dtype(inp: ServeInputs) -> str:
    dtype = inp.stack.profile["serve"]["dtype"]
    return "bfloat16" if dtype == "auto" else dtype


def _shrink_steps(start: dict, pinned: set) -> list[dict]:
    """Configurations to try, largest first; only unpinned knobs move, cheapest loss first."""
    steps = [dict(start)]
    current = dict(start)
    for knob, floor in (("seqs", 1), ("batched", 2048), ("max_len", MIN_MODEL_LEN)):
        if knob in pinned:
            continue
        while current[knob] // 2 >= floor:
            current[knob] //= 2
            steps.append(dict(current))
    return steps


def gpus_text(gpus: list[Gpu]) -> str:
    """'4x Tesla V100-SXM2-32GB'; mixed cards as '1x ...-32GB + 1x ...-16GB (each sized as the smallest,
    16160 MiB)': a TP group gets the smallest card's memory on every GPU."""
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.name] = counts.get(g.name, 0) + 1
    text = " + ".join(f"{n}x {name}" for name, n in counts.items())
    sizes = {g.memory_mib for g in gpus}
    return text + (f" (each sized as the smallest, {min(sizes)} MiB)" if len(sizes) > 1 else "")


def _kv_needed(config: dict, pinned: set) -> int:
    """KV tokens a configuration must hold: every sequence it admits at --max-model-len. vLLM itself
    starts with room for one; planning 2 sequences on KV for 1.07 (32768 MiB did, where 32510 MiB
    planned 1 on a 65% larger KV) gave the larger GPU a worse plan: a second sequence that could only
    run by preempting the first, paid for with the KV. The shrink steps are a chain, so with this rule
    more memory never plans fewer sequences, a shorter context or a sequence count its KV cannot hold
    (tests/unit/test_planner.py). A pinned --max-num-seqs keeps vLLM's rule: the admin chose it."""
    return config["max_len"] * (1 if "seqs" in pinned else config["seqs"])


def _check_headroom(budget: MemoryBudget, serve: dict, util: float, cite) -> None:
    """The cap must leave the CUDA context and NCCL their stated minimum per GPU (stack key
    serve.min_headroom_mib): vLLM does not count them, and past the cap they run out of memory."""
    floor = serve.get("min_headroom_mib", 0) * MiB
    if budget.headroom < floor:
        seen = budget.total - budget.reserved
        raise PlanRefused(
            f"--gpu-memory-utilization {util} leaves {budget.headroom / MiB:.0f} MiB per GPU outside vLLM's cap "
            f"({budget.total / MiB:.0f} MiB reported - {budget.reserved / MiB:.0f} MiB driver reserve = "
            f"{seen / MiB:.0f} MiB), below the {floor / MiB:.0f} MiB minimum {cite(serve.get('headroom_source'))}",
            f"lower --gpu-memory-utilization to at most {int((seen - floor) / seen * 100) / 100:.2f} (qwen27b_serve_flags)")


def _all_reduce(inp: ServeInputs, group: list[int], add, notes: list[str]):
    """The TP group (vLLM's ranks: CUDA_VISIBLE_DEVICES lists it): its links decide the all-reduce
    (qwen27b/plan/topology.py); the flag goes in the table, a kept default and NCCL env in notes."""
    tp = len(group)
    decision = plan_all_reduce(inp.stack.build, inp.topology, group, inp.stack.cite)
    if decision.custom is False:
        add("--disable-custom-all-reduce", None, decision.reason)
        keeps = [r for r in inp.stack.build.get("all_reduce") or [] if r["custom_all_reduce"]]
        split = nvlink_split(inp.topology, group, sorted({r.get("tp_min", 2) for r in keeps}))
        if split:
            notes.append(f"GPU(s) {' and '.join(','.join(map(str, s)) for s in split)} are each all on NVLink: "
                         f"{len(split)} copies of TP {len(split[0])} (qwen27b_instances) would keep custom all-reduce on, "
                         "if the model fits a copy")
    elif decision.custom:
        notes.append(f"custom all-reduce kept on (vLLM's default): {decision.reason}")
    if decision.env_reason:
        notes.append(decision.env_reason)
    idle = [g.index for g in inp.gpus if g.index not in group]
    if idle:
        notes.append(f"GPU(s) {', '.join(map(str, idle))} are left out of this unit (CUDA_VISIBLE_DEVICES lists the TP group "
                     f"{', '.join(map(str, group))}): serve them with more copies of TP {tp} "
                     "(qwen27b_instances), or raise the TP size")
    return decision


def _profile_flags(serve: dict, add, cite, draft_used: bool) -> None:
    """The engine vendor's release-profile settings that size nothing here: each as the profile has it;
    --trust-remote-code (code from the checkpoints runs in the engine) only where its reason, the
    DFlash2 draft, is served."""
    why = cite(serve.get("profile_source"))
    if serve.get("block_size"):
        add("--block-size", int(serve["block_size"]), f"the vendor's release profile's KV block (tokens) {why}")
    if serve.get("mamba_block_size"):
        add("--mamba-block-size", int(serve["mamba_block_size"]), f"the vendor's release profile's GDN state block "
            f"(tokens; prefix caching aligns to it) {why}")
    if serve.get("default_chat_template_kwargs"):
        add("--default-chat-template-kwargs", json.dumps(serve["default_chat_template_kwargs"], separators=(",", ":")),
            f"the vendor's release profile: thinking off unless a request turns it on {why}")
    if serve.get("trust_remote_code") and draft_used:
        add("--trust-remote-code", None, f"the vendor's release profile (the DFlash2 draft's model class) {why}")


def plan_serve(inp: ServeInputs) -> ServePlan:
    serve = inp.stack.profile["serve"]
    pins = dict(inp.pins or {})
    cite = inp.stack.cite
    flags: list[Flag] = []
    notes: list[str] = []

    def add(name: str, value, reason: str) -> None:
        if name in pins:
            pinned = pins.pop(name)
            shown = None if pinned is True else str(pinned)
            note = "" if shown == (None if value is None else str(value)) else f"; the planner would choose {value}"
            flags.append(Flag(name, shown, f"pinned in host data{note} ({reason})", True))
        else:
            flags.append(Flag(name, None if value is None else str(value), reason))

    if inp.gpus:
        tp, tp_reason = choose_tp(inp.gpus, inp.target, _pin(pins, "--tensor-parallel-size", int))
    else:
        tp, tp_reason = 1, "CPU profile"
    # among more GPUs than the group needs, the best linked ones (qwen27b/plan/topology.py)
    tp_group, group_reason = pick_group(inp.topology, [g.index for g in inp.gpus], tp)
    if group_reason:
        notes.append(f"TP group {group_reason}")
    util = _pin(pins, "--gpu-memory-utilization", float) or serve.get("gpu_memory_utilization", 1.0)
    start = {
        "max_len": _pin(pins, "--max-model-len", int) or serve["max_model_len"],
        "seqs": _pin(pins, "--max-num-seqs", int) or serve["max_num_seqs"],
        "batched": _pin(pins, "--max-num-batched-tokens", int) or serve["max_num_batched_tokens"],
    }
    pinned = {k for k, f in (("max_len", "--max-model-len"), ("seqs", "--max-num-seqs"),
                             ("batched", "--max-num-batched-tokens")) if f in pins}
    limit = inp.target.max_position_embeddings
    if limit and start["max_len"] > limit:
        if "max_len" in pinned:
            raise PlanRefused(f"pinned --max-model-len {start['max_len']} is beyond the model's {limit} positions",
                              f"pin at most {limit}")
        start["max_len"] = limit

    if inp.gpus:
        _check_headroom(_budget(inp, tp, util, start["max_len"], start["seqs"], start["batched"]), serve, util, cite)
    chosen = None
    for config in _shrink_steps(start, pinned):
        budget = _budget(inp, tp, util, config["max_len"], config["seqs"], config["batched"])
        if budget.kv_room > 0 and budget.kv_tokens >= _kv_needed(config, pinned):
            chosen = (config, budget)
            break
    if chosen is None:
        budget = _budget(inp, tp, util, start["max_len"], start["seqs"], start["batched"])
        needed = budget.weights + budget.draft + budget.overhead + budget.cuda_graphs
        where = f"{gpus_text(inp.gpus)} at TP {tp}" if inp.gpus else "host RAM"
        if pinned:
            cause = (f"the pinned {', '.join(sorted(f for f in pins if f.startswith('--max')))} do not fit on {where}: "
                     f"KV room holds {budget.kv_tokens:,} tokens")
            fix = "lower the pinned values or remove the pins and let the planner choose"
        else:
            draft = f" + draft {budget.draft / GiB:.1f} GiB" if budget.draft else ""  # none when no draft is planned
            cause = (f"too little memory on {where}: weights {budget.weights / GiB:.1f} GiB{draft} + runtime "
                     f"{(budget.overhead + budget.cuda_graphs) / GiB:.1f} GiB (of {budget.usable / GiB:.1f} GiB usable) "
                     f"leave no room for a {MIN_MODEL_LEN}-token KV cache ({needed / GiB:.1f} GiB before KV)")
            fix = "use more or larger GPUs (a higher TP size)" + (
                ", or turn off speculative decoding (qwen27b_speculative=False)" if draft else "")
        raise PlanRefused(cause, fix)
    config, budget = chosen

    add("--model", inp.model_path, "the active checkpoint (the weights role switches this symlink)")
    add("--served-model-name", inp.served_name, "the name clients send as 'model'")
    add("--host", inp.bind_address, inp.bind_reason)
    add("--port", inp.port, "qwen27b_port")
    if inp.gpus:
        add("--tensor-parallel-size", tp, tp_reason)
        vendor = serve.get("profile_source")
        add("--gpu-memory-utilization", util, f"stack profile {inp.stack.profile_name}"
            + (f": the engine vendor's release profile {cite(vendor)}" if vendor
               else ": vLLM's usual headroom for CUDA context and NCCL"))
        all_reduce = _all_reduce(inp, tp_group, add, notes)
    add("--dtype", serve["dtype"], f"V100 has no bf16 {cite('v100-fp16')}" if serve["dtype"] == "float16"
        else f"stack profile {inp.stack.profile_name}")
    def sized(knob: str, detail: str) -> str:
        if config[knob] == start[knob]:
            return f"stack default; {detail}"
        return f"lowered from {start[knob]} to fit memory; {detail}"

    add("--max-model-len", config["max_len"],
        sized("max_len", f"KV room holds {budget.kv_tokens:,} tokens per {'GPU' if inp.gpus else 'host'}"))
    full = (f"every sequence planned at full context: {start['seqs']} x {config['max_len']:,} tokens of KV, "
            f"{budget.kv_tokens:,} fit; " if config["seqs"] < start["seqs"] and "seqs" not in pinned
            and start["seqs"] * config["max_len"] > budget.kv_tokens else "")
    add("--max-num-seqs", config["seqs"],
        sized("seqs", f"{full}recurrent state {budget.recurrent_state / MiB:.0f} MiB for this many sequences"))
    add("--max-num-batched-tokens", config["batched"],
        sized("batched", f"activations {budget.activations / MiB:.0f} MiB"))
    if serve.get("attention_backend"):
        add("--attention-backend", serve["attention_backend"],
            f"the sm_70 build's attention kernels (also non-causal, as the DFlash draft needs) {cite('1cat-vllm')}")
    add("--kv-cache-dtype", *engine.kv_cache_dtype(inp.stack, inp.target, bool(inp.gpus)))
    _profile_flags(serve, add, cite, inp.draft_served)
    if serve.get("quiet_endpoints"):
        add("--disable-access-log-for-endpoints", ",".join(serve["quiet_endpoints"]),
            f"no access-log line for a pool's probe each second or a scrape {cite(serve.get('quiet_endpoints_source'))}")
    if serve.get("executor"):
        add("--distributed-executor-backend", serve["executor"],
            f"the worker inside the engine-core process: one process fewer to start {cite(serve.get('executor_source'))}")
    if serve.get("enforce_eager"):
        add("--enforce-eager", None, f"start-up in under a minute instead of minutes of compiling {cite(serve.get('source'))}")
    spec = inp.speculation
    speculating = spec.on and (spec.method != "dflash2" or inp.draft_served)  # DFlash2 only with its draft
    if speculating:
        add("--speculative-config", json.dumps(engine.speculative_config(inp.stack, spec, inp.draft_path),
                                               separators=(",", ":")), spec.reason)
        if spec.method == "dflash2" and inp.target.lm_head_quantized and not engine.quant_lm_head_switch(inp.stack):
            notes.append(f"target lm_head is quantized: DFlash2 acceptance will be ~0 {cite('dflash-dense-head')}")
    elif inp.gpus or spec.skipped:
        notes.append(f"speculative decoding off: {spec.reason}")
    if inp.agent is not None and inp.agent.on:
        add("--reasoning-parser", inp.agent.reasoning, f"<think>...</think> into the message's `reasoning` field, "
            f"never `content`; {inp.agent.reason}")
        add("--enable-auto-tool-choice", None, "tool_choice 'auto' (what agent clients send); vLLM refuses it without "
            "this switch")
        add("--tool-call-parser", inp.agent.tool_call, "Qwen3's XML <tool_call> blocks into `tool_calls` entries")
    elif inp.agent is not None:
        notes.append(inp.agent.reason)
    if inp.target.multimodal:
        add("--limit-mm-per-prompt", json.dumps({"image": 0, "video": 0}, separators=(",", ":")),
            f"text-only serving: no vision encoder profiling {cite('mm-text-only')}")
    if inp.prefix_caching:
        add("--enable-prefix-caching", None, "reuse KV of repeated prefixes (multi-turn chat)")
        if inp.target.hybrid:
            add("--mamba-cache-mode", "align", f"hybrid GDN model with prefix caching {cite('gdn-prefix')}")
    else:
        add("--no-enable-prefix-caching", None, "qwen27b_prefix_caching is off")
    if inp.route_guard:
        add("--middleware", MIDDLEWARE, "every route but /health needs the API key: vLLM's VLLM_API_KEY guards "
            "only /v1, /v2, /inference and /cohere (/invocations, /tokenize, /metrics answered anyone)")
    for name, value in pins.items():
        flags.append(Flag(name, None if value is True else str(value), PIN_REASONS.get(name, "pinned in host data (qwen27b_serve_flags)"), True))

    env = {str(k): str(v) for k, v in (serve.get("env") or {}).items()}
    if serve.get("omp_threads"):
        env["OMP_NUM_THREADS"] = str(int(serve["omp_threads"]))
        notes.append(f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}: the engine's OpenMP threads; more spin at each "
                     f"barrier and on shared cores wait for each other {cite(serve.get('omp_threads_source'))}")
    if inp.gpus:
        env.update(all_reduce.env)
        cuda = inp.stack.profile.get("cuda") or {}
        if cuda.get("needed_by_vllm"):  # the engine compiles at first use: with this toolkit, not /usr/local/cuda's
            env["CUDA_HOME"] = f"/usr/local/cuda-{cuda['toolkit']}"
            notes.append(f"CUDA_HOME={env['CUDA_HOME']}: the engine's kernels built at first use take this toolkit's "
                         f"nvcc, never another one /usr/local/cuda may point at {cite(cuda.get('source'))}")
    switch = engine.quant_lm_head_switch(inp.stack) if inp.draft_served and inp.target.lm_head_quantized else None
    if switch:
        env[switch["env"]] = str(switch["value"])
        notes.append(f"{switch['env']}={switch['value']}: DFlash2 beside the target's quantized lm_head "
                     f"{cite(switch.get('source'))}")
    notes.append("API key: VLLM_API_KEY from a 0600 env file, never a flag (flags show in ps and systemctl status)")
    warm = serve["warmup"]
    notes.append(f"start-up: once /health answers, one {warm['max_tokens']}-token completion (deadline {warm['timeout_s']} s, "
                 f"within the {serve['start_timeout_s']} s start) before systemd counts the unit as started, so no "
                 f"client meets the first request's compile {cite(warm['source'])}")
    return ServePlan(flags=flags, env=env, memory=budget, notes=notes, tp_group=tuple(tp_group),
                     spec=spec if speculating or not spec.on else engine.OFF)
