"""Multi-node serving: when a model does not fit one host, the hosts of a serving group (host data
`qwen27b_node_group`) serve it together: tensor parallel within each host, pipeline parallel across
them, on vLLM's Ray executor. Or the group is refused with the numbers.

Pure: facts + host data + stack in, one Decision (or RefusedHost) per member out.

Why PP across hosts and TP within one [vllm-multinode, interconnects]: TP all-reduces every layer's
output twice per token (128 synchronisations per token for a 64-layer model), which NVLink (300 GB/s)
or PCIe (~16 GB/s) inside a box absorbs and a 10-25 GbE link (1.25-3.1 GB/s, ~10-50 us a round trip)
does not; PP hands one stage's output to the next once per token: 2 x hidden values (hidden_states
and residual) [vllm-pp-tensors], 20 KiB for Qwen3.8-27B at fp16.

The decision, for a group whose members are otherwise fit to serve:
1. the model fits one member as configured: each member serves alone (the group is not needed;
   replicas behind a gateway double the throughput, which a pipeline does not);
2. it fits one member only without the DFlash2 draft: the same, the draft off (a pipeline could not
   keep it either: the draft reads target layers on every stage, which vLLM cannot relay for
   Qwen3.5/3.8 [vllm-pp-dflash]);
3. otherwise a pipeline: PP = members, TP = GPUs per member, the draft off, each GPU planned for its
   stage's layers (the tightest stage decides the flags), the link checked against the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qwen27b.plan.checkpoint import DTYPE_BYTES, ModelShape
from qwen27b.plan.gate import (Decision, HostFacts, RefusedHost, _catalog_entry, _choose_profile, _os_check,
                                _select_gpus, decide, host_gpus)
from qwen27b.plan.hostdata import Settings
from qwen27b.plan.planner import Flag, Gpu, PlanRefused, ServeInputs, ServePlan, choose_tp, plan_serve
from qwen27b.plan.stack import gpu_spec, resolve_stack

GiB = 2**30


def pp_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per stage, as vLLM splits them [vllm-pp-partition]: evenly, the remainder one each to
    the stages before the last (counting back from the second-to-last)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


@dataclass(frozen=True)
class Stage:
    index: int
    first_layer: int
    layers: int
    full_attention: int
    linear_attention: int
    weight_bytes: int  # the whole stage's, before TP splits it

    @property
    def span(self) -> str:
        return f"layers {self.first_layer}-{self.first_layer + self.layers - 1}"


def embedding_bytes(shape: ModelShape, act_bytes: int) -> int:
    """The embedding matrix (and the lm_head, the same shape): dense, never 4-bit in these checkpoints."""
    return shape.vocab_size * shape.hidden_size * act_bytes


def stages(shape: ModelShape, pp: int, act_bytes: int) -> list[Stage]:
    """Each stage's layers, their kinds and weights: the checkpoint's total less the embedding and
    lm_head, spread evenly over the layers; the first stage adds the embedding, the last the lm_head
    (vLLM builds one there even when it is tied to the embedding)."""
    embed = embedding_bytes(shape, act_bytes)
    head_in_checkpoint = 0 if shape.tied_embeddings else embed
    per_layer = max(0, shape.weight_bytes - embed - head_in_checkpoint) / shape.num_layers
    kinds = shape.layer_types or ("full_attention",) * shape.num_layers
    out, first = [], 0
    for index, count in enumerate(pp_partition(shape.num_layers, pp)):
        full = sum(1 for kind in kinds[first:first + count] if kind == "full_attention")
        weight = int(per_layer * count) + (embed if index == 0 else 0) + (embed if index == pp - 1 else 0)
        out.append(Stage(index, first, count, full, count - full, weight))
        first += count
    return out


def stage_shape(shape: ModelShape, stage: Stage) -> ModelShape:
    """The model as one stage's GPUs hold it: the planner's memory plan then applies unchanged."""
    return replace(shape, num_layers=stage.layers, full_attention_layers=stage.full_attention,
                   linear_attention_layers=stage.linear_attention, weight_bytes=stage.weight_bytes)


def layer_params(shape: ModelShape) -> int:
    """~ Parameters of one layer: the MLP's three matrices and the attention projections (the GDN
    layers' projections counted as attention-sized): what a token's FLOPs scale with."""
    h, q, kv = shape.hidden_size, shape.num_attention_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return 3 * h * shape.intermediate_size + 2 * h * q + 2 * h * kv


@dataclass(frozen=True)
class Link:
    """The link check's numbers (docs/scale-out.md "Multi-node" has the formula)."""

    gbps: float
    boundary_bytes: int  # per token per stage boundary: hidden_states + residual
    link_tokens_s: float  # tokens per second the link carries across one boundary
    stage_gflop: float  # ~ per token, the largest stage
    stage_tokens_s: float  # the stage's GPUs' fp16 peak, in tokens per second
    tp_bytes: int  # per token per GPU if TP spanned the link instead (ring all-reduce)
    allreduces: int  # per token with TP
    gpus: str

    @property
    def decode_us(self) -> float:
        return self.boundary_bytes / (self.gbps * 1e9 / 8) * 1e6


def link_check(shape: ModelShape, parts: list[Stage], tp: int, tflops: float, gbps: float, act_bytes: int,
               gpus: str) -> Link:
    """Refuses when the link would bound prefill before the GPUs: the tokens per second it carries
    across a stage boundary (gbps / 8 / (2 x hidden x bytes)) below the tokens per second one stage
    can compute at its GPUs' fp16 peak (TP x TFLOPS / (2 x the stage's parameters))."""
    boundary = 2 * shape.hidden_size * act_bytes
    link_tokens = gbps * 1e9 / 8 / boundary
    flop = 2 * layer_params(shape) * max(s.layers for s in parts)
    stage_tokens = tp * tflops * 1e12 / flop
    world = tp * len(parts)
    tp_bytes = int(2 * shape.num_layers * shape.hidden_size * act_bytes * 2 * (world - 1) / world)
    link = Link(gbps, boundary, link_tokens, flop / 1e9, stage_tokens, tp_bytes, 2 * shape.num_layers, gpus)
    if link_tokens < stage_tokens:
        raise PlanRefused(
            f"a {gbps:g} Gbit/s link carries {link_tokens:,.0f} tokens/s across a stage boundary ({boundary:,} B per "
            f"token: hidden_states + residual, 2 x {shape.hidden_size} x {act_bytes} B), below the {stage_tokens:,.0f} "
            f"tokens/s one stage's {gpus} can prefill at fp16 peak (~{flop / 1e9:.1f} GFLOP per token): the link, "
            "not the GPUs, would bound every prompt",
            f"link the members at {gbps * stage_tokens / link_tokens:.1f} Gbit/s or more (10/25 GbE), and set "
            "qwen27b_interconnect_gbps to the slowest hop")
    return link


@dataclass(frozen=True)
class Pipeline:
    """Handed to the gate (decide(pipeline=...)): plans every stage, keeps the tightest."""

    size: int
    parts: tuple[Stage, ...]
    link: Link
    cite: object  # ResolvedStack.cite

    def plan(self, inp: ServeInputs) -> ServePlan:
        plans = []
        for stage in self.parts:
            try:
                plans.append((plan_serve(replace(inp, target=stage_shape(inp.target, stage), draft=None)), stage))
            except PlanRefused as refused:
                raise PlanRefused(f"stage {stage.index + 1} of {self.size} ({stage.span}): {refused.cause}",
                                  refused.fix) from None

        def tightness(item):
            serve = item[0]
            return (int(serve.value("--max-model-len")), int(serve.value("--max-num-batched-tokens")),
                    int(serve.value("--max-num-seqs")), serve.memory.kv_tokens)
        serve, stage = min(plans, key=tightness)
        flags: list[Flag] = []
        for flag in serve.flags:
            flags.append(flag)
            if flag.name == "--tensor-parallel-size":
                flags.append(Flag("--pipeline-parallel-size", str(self.size),
                                  f"one stage per member: a boundary carries {self.link.boundary_bytes:,} B per token, "
                                  f"TP across the link {self.link.tp_bytes / 2**20:.1f} MiB in {self.link.allreduces} "
                                  f"all-reduces {self.cite(['vllm-multinode', 'vllm-pp-tensors'])}"))
                flags.append(Flag("--distributed-executor-backend", "ray",
                                  f"vLLM's executor across hosts: the head's engine drives the members' Ray workers "
                                  f"{self.cite('vllm-multinode')}"))
        notes = [f"memory plan of stage {stage.index + 1} of {self.size} ({stage.span}, {stage.full_attention} "
                 f"full-attention): the tightest; vLLM sizes every stage's KV cache to the smallest"] + serve.notes
        return replace(serve, flags=flags, notes=notes)


@dataclass(frozen=True)
class NodeGroup:
    """A member's place in its serving group, on its Decision (render, firewall and roles read it)."""

    name: str
    role: str  # head | worker
    address: str
    interface: str
    head_address: str
    members: tuple[tuple[str, str, str], ...]  # (host, address, role), head first
    stage: Stage
    tp: int
    pp: int
    link: Link
    why: str  # why one member is not enough
    multinode: dict  # the stack's multinode section (ports, Ray requirement)
    cite: object
    engine: str  # what is known of the vLLM build's multi-node path

    @property
    def peers(self) -> list[str]:
        return [address for _, address, _ in self.members if address != self.address]

    def rows(self) -> list[list[str]]:
        cite, link = self.cite, self.link
        others = ", ".join(f"{host} ({address}, {role})" for host, address, role in self.members)
        return [
            ["group", f"{self.name}: {self.pp} members", others],
            ["this node", f"{self.role}, stage {self.stage.index + 1}",
             f"{self.stage.span} on {self.tp} GPU(s); " + (
                 "runs the Ray head, the API and the engine" if self.role == "head" else
                 f"runs a Ray worker joining {self.head_address}; no API of its own")],
            ["why", "pipeline", self.why],
            ["TP", str(self.tp), f"within a member: {link.allreduces} all-reduces per token stay on NVLink/PCIe; "
                                 f"across the link they would move {link.tp_bytes / 2**20:.1f} MiB per token per GPU "
                                 f"{cite('interconnects')}"],
            ["PP", str(self.pp), f"across members: {link.boundary_bytes:,} B per token per boundary "
                                 f"{cite('vllm-pp-tensors')}"],
            ["link", f"{link.gbps:g} Gbit/s", f"carries {link.link_tokens_s:,.0f} tokens/s per boundary, "
                                              f"{link.link_tokens_s / link.stage_tokens_s:.1f}x what one stage's "
                                              f"{link.gpus} prefill at fp16 peak ({link.stage_tokens_s:,.0f}/s, "
                                              f"~{link.stage_gflop:.1f} GFLOP per token); decode adds "
                                              f"{link.decode_us:.0f} us per token per boundary"],
            ["draft", "off", f"DFlash2 reads target layers of every stage: no relay across stages for this model "
                             f"{cite('vllm-pp-dflash')}"],
            ["ray", f"{self.interface}, GCS {self.head_address}:{self.multinode['ray_ports']['gcs']}",
             f"Ray, vLLM and NCCL ports open to the other members only (the traffic is unencrypted) "
             f"{cite(['vllm-multinode', 'ray-ports'])}"],
            ["engine", "unverified", self.engine],
        ]


@dataclass(frozen=True)
class Member:
    """One host of a serving group, as the gate has it."""

    name: str
    facts: HostFacts
    settings: Settings
    address: str
    bind_address: str | None = None


def _alone(member: Member, stack: dict, settings: Settings) -> Decision | RefusedHost:
    try:
        return decide(member.name, member.facts, stack, settings, bind_address=member.bind_address)
    except RefusedHost as refused:
        return refused


def _with_note(decision: Decision, note: str) -> Decision:
    return replace(decision, serve=replace(decision.serve, notes=decision.serve.notes + [note]))


def decide_group(name: str, members: list[Member], stack: dict) -> dict[str, Decision | RefusedHost]:
    """Every member's Decision, or every member refused (the group serves nothing without all of them).
    inventory.check_groups already checked one head, distinct addresses and shared settings."""
    members = sorted(members, key=lambda m: m.settings.node_role != "head")  # the head first
    alone = {m.name: _alone(m, stack, m.settings) for m in members}
    if all(isinstance(d, Decision) for d in alone.values()):
        return {host: _with_note(d, f"serving group '{name}': the model fits this host alone, so each member "
                                    "serves it alone (replicas double the throughput; a pipeline would not)")
                for host, d in alone.items()}
    if any(m.settings.speculative_mode != "off" for m in members):
        alone = {m.name: _alone(m, stack, replace(m.settings, speculative=False)) for m in members}
        if all(isinstance(d, Decision) for d in alone.values()):
            return {host: _with_note(d, f"serving group '{name}': the model fits this host alone without the DFlash2 "
                                        "draft, so each member serves it alone, the draft off (a pipeline could not "
                                        "keep it either [vllm-pp-dflash])") for host, d in alone.items()}
    why = next(f"alone (draft off), {host} is refused: {r.problems[0][0]}"
               for host, r in alone.items() if isinstance(r, RefusedHost))
    return plan_group(name, members, stack, why)


def _refuse_all(name: str, members: list[Member], cause: str, fix: str) -> dict[str, RefusedHost]:
    return {m.name: RefusedHost(m.name, f"serving group '{name}': {cause}", fix) for m in members}


def plan_group(name: str, members: list[Member], stack: dict, why: str) -> dict[str, Decision | RefusedHost]:
    """Step 3: the pipeline over every member, or every member refused with the numbers."""
    gpus: dict[str, list[Gpu]] = {}
    for m in members:  # what stops a member whatever the others have: OS, GPUs it cannot serve on
        try:
            _os_check(m.name, m.facts, stack, m.settings.profile == "cpu-smoke")
            cpu = m.settings.profile == "cpu-smoke"
            gpus[m.name] = [] if cpu else _select_gpus(m.name, host_gpus(m.name, m.facts, stack), m.settings)
            _choose_profile(m.name, gpus[m.name], m.settings, stack)
        except RefusedHost as refused:
            return {**_refuse_all(name, members, f"member {m.name} is refused: {refused.cause}", refused.fix),
                    m.name: refused}
    counts = {host: f"{len(g)}x {g[0].name if g else 'no GPU'} ({min((x.memory_mib for x in g), default=0)} MiB)"
              for host, g in gpus.items()}
    if len(set(counts.values())) > 1:
        return _refuse_all(name, members, "the members' GPUs differ (" + "; ".join(f"{h}: {c}" for h, c in counts.items())
                           + "): one stage per member needs the same GPUs on each",
                           "group hosts with the same GPUs, or list the same number with qwen27b_gpu_indices")
    dirs = {m.name: m.settings.models_dir or "the stack's" for m in members}
    if len(set(dirs.values())) > 1:  # one --model path for every stage: the head's, on each member
        return _refuse_all(name, members, "the members' qwen27b_models_dir differ (" + "; ".join(f"{h}: {d}" for h, d in dirs.items())
                           + "): every stage loads the model from the head's path",
                           "give every member the same qwen27b_models_dir (group data), or none")
    first = members[0]
    node_gpus = gpus[first.name]
    try:
        profile = _choose_profile(first.name, node_gpus, first.settings, stack)
        _, entry_stack = _catalog_entry(first.name, stack, profile, first.settings, node_gpus)  # its engine profile
        rs = resolve_stack(entry_stack, profile, first.settings.stack_overrides, model=first.settings.model,
                           model_source=first.settings.model_source, models_dir=first.settings.models_dir)
    except RefusedHost as refused:
        return _refuse_all(name, members, refused.cause, refused.fix)
    if not rs.build.get("ray_executor"):
        return _refuse_all(name, members, f"the {rs.profile['vllm']['build']} vLLM build cannot run the Ray executor "
                           f"a pipeline across hosts needs: {rs.source_text(rs.build['source'])}",
                           "remove qwen27b_node_group: serve each host alone")
    from qwen27b.plan.checkpoint import load_shape
    from qwen27b.plan.stack import checkpoint_metadata_dir
    target = load_shape(checkpoint_metadata_dir(rs.model))
    dtype = rs.profile["serve"]["dtype"]
    act = DTYPE_BYTES["bfloat16" if dtype == "auto" else dtype]
    pins = dict(first.settings.serve_flags or {})
    try:
        tp, _ = choose_tp(node_gpus, target, first.settings.tensor_parallel_size
                          or (int(pins["--tensor-parallel-size"]) if "--tensor-parallel-size" in pins else None))
        parts = stages(target, len(members), act)
        spec = gpu_spec(stack, name=node_gpus[0].name) or {}
        gbps = min(m.settings.interconnect_gbps for m in members)
        link = link_check(target, parts, tp, spec.get("fp16_tensor_tflops", 0) or 0, gbps, act,
                          f"{tp}x {node_gpus[0].name}")
    except PlanRefused as refused:
        return _refuse_all(name, members, refused.cause, refused.fix)
    pipeline = Pipeline(len(members), tuple(parts), link, rs.cite)
    decisions: dict[str, Decision | RefusedHost] = {}
    for m in members:
        try:
            decisions[m.name] = decide(m.name, m.facts, stack, replace(m.settings, speculative=False),
                                       bind_address=m.bind_address, pipeline=pipeline)
        except RefusedHost as refused:
            decisions[m.name] = refused
    refused = [(host, d) for host, d in decisions.items() if isinstance(d, RefusedHost)]
    if refused:
        host, first_refusal = refused[0]
        return {**_refuse_all(name, members, f"member {host} is refused: {first_refusal.problems[0][0]}",
                              first_refusal.problems[0][1]), **dict(refused)}
    listed = tuple((m.name, m.address, m.settings.node_role) for m in members)
    engine = (f"the V100 build keeps upstream's Ray and PP code; no multi-node run of it is published "
              f"{rs.cite('1cat-multinode')}" if rs.profile["vllm"]["build"] == "1cat" else
              f"vLLM's documented multi-node path {rs.cite('vllm-multinode')}; not run on GPUs by this project")
    head = members[0].address
    return {m.name: replace(decisions[m.name], group=NodeGroup(
        name=name, role=m.settings.node_role, address=m.address, interface=m.settings.node_interface,
        head_address=head, members=listed, stage=parts[i], tp=tp, pp=len(members), link=link, why=why,
        multinode=stack["multinode"], cite=rs.cite, engine=engine)) for i, m in enumerate(members)}
