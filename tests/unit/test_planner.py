"""The memory and flag planner with the real Qwen3.8-27B shape on V100 boxes, and the tiny model."""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from qwen27b.plan.checkpoint import load_shape
from qwen27b.plan.planner import GiB, MiB, Gpu, PlanRefused, ServeInputs, plan_serve
from qwen27b.plan.stack import checkpoint_metadata_dir, gpu_spec, load_stack, resolve_stack

STACK = load_stack()


def v100s(n, gb=32):
    """V100s as nvidia-smi reports them under R580 (stack.yaml's gpus table, [v100-reported-memory])."""
    name = f"Tesla V100-SXM2-{gb}GB"
    return [Gpu(i, name, gpu_spec(STACK, name=name)["memory_mib"], "7.0") for i in range(n)]


# The memory mechanics below were written against these serve values (fp16 KV, an 8k context, a 0.88
# cap); they keep them, so each figure stays a hand-checkable one. The vendor's release profile, the
# sm70 default since issue 49, is planned by test_the_vendors_release_profile_* below.
MECHANICS = {"serve": {"kv_cache_dtype": "float16", "max_model_len": 8192, "gpu_memory_utilization": 0.88}}


def inputs(profile="sm70", gpus=None, pins=None, speculative=True, prefix=True, overrides=None, ram=None,
           model="qwen3.8-27b-nvfp4"):
    """The memory tests plan the ModelOpt checkpoint with its DFlash2 draft (a ServeInputs without
    `spec`); the sm70 default checkpoint and the method choice are tested in test_engine.py."""
    if profile == "sm70" and overrides is None:
        overrides = MECHANICS
    rs = resolve_stack(STACK, profile, overrides, model=None if profile == "cpu-smoke" else model)
    target = load_shape(checkpoint_metadata_dir(rs.model))
    draft = load_shape(checkpoint_metadata_dir(rs.draft)) if rs.draft and speculative else None
    return ServeInputs(stack=rs, gpus=gpus if gpus is not None else v100s(4), target=target, draft=draft,
                       model_path="/var/lib/qwen27b/models/current", draft_path="/var/lib/qwen27b/models/draft",
                       served_name="qwen3.8-27b", bind_address="10.0.0.5", bind_reason="test", port=8000, speculative=speculative,
                       prefix_caching=prefix, pins=pins or {}, ram_bytes=ram)


def test_4x_v100_32gb_uses_tp4_and_the_stack_defaults():
    plan = plan_serve(inputs())
    assert plan.value("--tensor-parallel-size") == "4"
    assert plan.value("--dtype") == "float16"
    assert plan.value("--attention-backend") == "FLASH_ATTN_V100"
    assert plan.value("--gpu-memory-utilization") == "0.88"
    assert (plan.value("--max-model-len"), plan.value("--max-num-seqs"), plan.value("--max-num-batched-tokens")) == ("8192", "4", "8192")
    spec = json.loads(plan.value("--speculative-config"))
    assert spec == {"method": "dflash", "model": "/var/lib/qwen27b/models/draft", "num_speculative_tokens": 7,
                    "draft_sample_method": "probabilistic", "kv_cache_dtype": "auto", "attention_backend": "FLASH_ATTN_V100"}
    assert json.loads(plan.value("--limit-mm-per-prompt")) == {"image": 0, "video": 0}
    assert plan.value("--mamba-cache-mode") == "align" and plan.has("--enable-prefix-caching")
    m = plan.memory
    assert m.weights == round(20.4 * GiB) // 4
    # the target's full-attention KV split by TP, the draft's whole: 1Cat loads the drafter on every card
    assert m.kv_bytes_per_token == 16 * 1024 + 5 * 4 * 256 * 2 * 2
    assert m.draft == plan_serve(inputs(gpus=v100s(1))).memory.draft == 3_848_817_896
    assert m.kv_tokens > 450_000
    assert all(f.reason for f in plan.flags), "every flag says why"
    assert "--api-key" not in plan.argv()


def test_the_vendors_release_profile_on_4x_v100_32gb():
    """Issue 49: the sm70 default as 1Cat's release profile has it; the one knob our KV rule moves
    (every admitted sequence at the full context: 4 x 262,144 tokens do not fit) is lowered and says so."""
    rs = resolve_stack(STACK, "sm70")
    target, draft = load_shape(checkpoint_metadata_dir(rs.model)), load_shape(checkpoint_metadata_dir(rs.draft))
    plan = plan_serve(ServeInputs(stack=rs, gpus=v100s(4), target=target, draft=draft, model_path="/m", draft_path="/d",
                                  served_name="qwen3.8-27b", bind_address="10.0.0.5", bind_reason="test", port=8000,
                                  speculative=True, prefix_caching=True, pins={}))
    values = {f: plan.value(f) for f in ("--tensor-parallel-size", "--dtype", "--kv-cache-dtype", "--max-model-len",
                                         "--gpu-memory-utilization", "--max-num-batched-tokens", "--block-size",
                                         "--mamba-block-size", "--default-chat-template-kwargs")}
    assert values == {"--tensor-parallel-size": "4", "--dtype": "float16", "--kv-cache-dtype": "fp8_e5m2",
                      "--max-model-len": "262144", "--gpu-memory-utilization": "0.8", "--max-num-batched-tokens": "8192",
                      "--block-size": "2048", "--mamba-block-size": "8192",
                      "--default-chat-template-kwargs": '{"enable_thinking":false}'}
    assert plan.has("--trust-remote-code") and plan.has("--mamba-cache-mode")
    seqs = {f.name: f for f in plan.flags}["--max-num-seqs"]
    assert seqs.value == "2" and seqs.reason.startswith("lowered from 4 to fit memory")
    # the target's fp8 KV split by TP; the draft's whole, at fp16 (its `auto`: counted large)
    assert plan.memory.kv_tokens >= 2 * 262144 and plan.memory.kv_bytes_per_token == 16 * 256 * 2 + 5 * 4 * 256 * 2 * 2
    assert plan.memory.draft == draft.weight_bytes  # whole on every card
    assert json.loads(plan.value("--speculative-config"))["attention_backend"] == "FLASH_ATTN_V100"


def test_1x_v100_32gb_fits_at_the_default_length_with_a_small_kv():
    plan = plan_serve(inputs(gpus=v100s(1)))
    assert plan.value("--tensor-parallel-size") == "1" and plan.value("--max-model-len") == "8192"
    assert 8192 <= plan.memory.kv_tokens < 20_000


def test_2x_v100_16gb_with_the_draft_is_refused_with_the_numbers():
    """16160 MiB reported, minus the 616 MiB driver reserve, at 0.88: 13.4 GiB usable per GPU."""
    with pytest.raises(PlanRefused) as refused:
        plan_serve(inputs(gpus=v100s(2, 16)))
    assert "too little memory on 2x Tesla V100-SXM2-16GB at TP 2" in refused.value.cause
    assert "(of 13.4 GiB usable)" in refused.value.cause and "qwen27b_speculative=False" in refused.value.fix


def test_memory_plan_starts_from_the_reported_figure_minus_the_driver_reserve():
    budget = plan_serve(inputs()).memory
    assert budget.total == 32510 * MiB and budget.reserved == 616 * MiB
    assert budget.usable == int((32510 - 616) * MiB * 0.88) and budget.headroom == (32510 - 616) * MiB - budget.usable
    rows = dict(budget.rows())
    assert "per-GPU memory (nvidia-smi)" in rows and "driver reserve" in rows and "headroom outside the cap" in rows


def test_a_cap_leaving_less_than_the_minimum_headroom_is_refused():
    with pytest.raises(PlanRefused) as refused:
        plan_serve(inputs(pins={"--gpu-memory-utilization": 0.98}))
    cause = refused.value.cause
    assert "leaves 638 MiB per GPU outside vLLM's cap (32510 MiB reported - 616 MiB driver reserve = 31894 MiB)" in cause
    assert "below the 1024 MiB minimum" in cause and "at most 0.96" in refused.value.fix


def test_1x_v100_16gb_is_refused_with_the_numbers():
    with pytest.raises(PlanRefused) as refused:
        plan_serve(inputs(gpus=v100s(1, 16)))
    assert "too little memory on 1x Tesla V100-SXM2-16GB at TP 1: weights 20.4 GiB" in refused.value.cause
    assert "higher TP size" in refused.value.fix


def test_without_speculation_the_draft_costs_nothing():
    plan = plan_serve(inputs(gpus=v100s(2, 16), speculative=False))
    assert not plan.has("--speculative-config") and plan.memory.draft == 0
    assert plan.value("--max-model-len") == "8192"  # the draft's 1.7 GiB per GPU was what did not fit


def test_pins_are_kept_and_checked():
    plan = plan_serve(inputs(pins={"--max-model-len": 16384, "--enforce-eager": True, "--seed": 7}))
    flags = {f.name: f for f in plan.flags}
    assert flags["--max-model-len"].value == "16384" and flags["--max-model-len"].pinned
    assert flags["--seed"].reason == "pinned in host data (qwen27b_serve_flags)" and flags["--seed"].value == "7"
    assert flags["--max-model-len"].reason.startswith("pinned in host data") and "KV room holds" in flags["--max-model-len"].reason
    assert flags["--enforce-eager"].value is None
    with pytest.raises(PlanRefused, match=r"pinned --max-model-len do not fit on 1x .*KV room holds"):
        plan_serve(inputs(gpus=v100s(1), pins={"--max-model-len": 65536}))
    with pytest.raises(PlanRefused, match="is not a int"):
        plan_serve(inputs(pins={"--max-model-len": "long"}))


@pytest.mark.parametrize("tp, text", [(8, "more than the 4 GPU"), (3, "does not divide the 4 GPUs")])
def test_bad_tp_pins(tp, text):
    with pytest.raises(PlanRefused, match=text):
        plan_serve(inputs(pins={"--tensor-parallel-size": tp}))


def test_tp_follows_the_heads_when_gpus_do_not_divide_them():
    # 6 GPUs: 6 and 3 divide the 24 query heads but not the 4 KV heads, so the largest usable group is 2
    plan = plan_serve(inputs(gpus=v100s(6)))
    assert plan.value("--tensor-parallel-size") == "2"
    assert "does not divide the model's heads" in {f.name: f.reason for f in plan.flags}["--tensor-parallel-size"]


def test_no_prefix_caching_drops_the_mamba_mode():
    plan = plan_serve(inputs(prefix=False))
    assert plan.has("--no-enable-prefix-caching") and not plan.has("--mamba-cache-mode")


def test_tiny_model_on_cpu():
    plan = plan_serve(inputs(profile="cpu-smoke", gpus=[], ram=8 * GiB))
    assert not plan.has("--tensor-parallel-size") and not plan.has("--speculative-config")
    assert plan.value("--dtype") == "bfloat16" and plan.has("--enforce-eager")
    assert plan.value("--max-model-len") == "2048" and not plan.has("--mamba-cache-mode")
    assert plan.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    assert any(n.startswith("OMP_NUM_THREADS=1:") and n.endswith("[cpu-one-omp-thread]") for n in plan.notes)
    assert plan.memory.kv_room == 1 * GiB  # the fixed CPU KV space
    # the worker in the engine core's process: vLLM's CPU platform keeps `uni` only with the variable 0
    executor = {f.name: f for f in plan.flags}["--distributed-executor-backend"]
    assert executor.value == "uni" and executor.reason.endswith("[cpu-uni-executor]")


@pytest.mark.parametrize("profile", ["sm70", "sm75plus"])
def test_gpu_profiles_leave_vllms_executor_to_vllm(profile):
    """One GPU: vLLM's own uni executor; a TP group: its multiprocess one. Neither profile pins it."""
    plan = plan_serve(inputs(profile=profile))
    assert not plan.has("--distributed-executor-backend") and "VLLM_ENABLE_V1_MULTIPROCESSING" not in plan.env


@pytest.mark.parametrize("profile", ["sm70", "sm75plus"])
def test_probes_and_scrapes_stay_out_of_vllms_access_log(profile):
    """A gateway pool probes each backend every second and Prometheus scrapes /metrics: one journal
    line each without this flag, which every build takes [vllm-quiet-probes]."""
    for plan in plan_serve(inputs(profile=profile)), plan_serve(inputs(profile="cpu-smoke", gpus=[], ram=8 * GiB)):
        flag = {f.name: f for f in plan.flags}["--disable-access-log-for-endpoints"]
        assert flag.value == "/health,/metrics,/ping" and flag.reason.endswith("[vllm-quiet-probes]")


def test_tiny_model_refused_on_a_small_box():
    with pytest.raises(PlanRefused, match="too little memory on host RAM"):
        plan_serve(inputs(profile="cpu-smoke", gpus=[], ram=3 * GiB))


def _plan_at(mib: int, n: int, speculative: bool):
    try:
        return plan_serve(inputs(gpus=[Gpu(i, "Tesla V100-SXM2-32GB", mib, "7.0") for i in range(n)],
                                 speculative=speculative))
    except PlanRefused:
        return None


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("speculative", [True, False])
def test_more_memory_never_plans_worse(n, speculative):
    """Issue 24: 32768 MiB planned 2 sequences on KV for 1.07 of them, 32510 MiB 1 on a larger KV.
    Over every memory size (a 97 MiB sweep across 16 and 32 GB cards): once a plan fits, more memory
    keeps fitting; sequences, context and prefill chunk never go down; the KV always holds every
    planned sequence at --max-model-len."""
    before = None
    for mib in range(14_000, 34_500, 97):
        plan = _plan_at(mib, n, speculative)
        if plan is None:
            assert before is None, f"{mib} MiB refused after {before[0]} MiB fitted"
            continue
        knobs = tuple(int(plan.value(f)) for f in ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens"))
        assert plan.memory.kv_tokens >= knobs[0] * knobs[1], (mib, knobs, plan.memory.kv_tokens)
        if before is not None:
            assert all(now >= was for now, was in zip(knobs, before[1])), (before, (mib, knobs))
        before = (mib, knobs)
    assert before is not None and before[1][0] >= 1


def test_the_issue_24_pair_plans_one_sequence_each_and_its_kv_holds_it():
    small, large = _plan_at(32510, 1, True), _plan_at(32768, 1, True)
    assert small.value("--max-num-seqs") == large.value("--max-num-seqs") == "1"
    assert large.memory.kv_tokens >= int(large.value("--max-model-len"))
    # a pinned count keeps vLLM's own rule (room for one sequence): the admin chose the concurrency
    pinned = plan_serve(inputs(gpus=[Gpu(0, "Tesla V100-SXM2-32GB", 32768, "7.0")], pins={"--max-num-seqs": 2}))
    assert pinned.value("--max-num-seqs") == "2" and pinned.value("--max-model-len") == "8192"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.sampled_from([1, 2, 4, 8]), speculative=st.booleans(),
       small=st.integers(8_000, 81_000), more=st.integers(1, 50_000))
def test_property_more_memory_never_plans_fewer_seqs_or_shorter_context(n, speculative, small, more):
    """Issue 24 as a property (hypothesis): for any two memory sizes, the larger never refuses where the
    smaller fits, never plans fewer sequences, a shorter context or a smaller prefill chunk, and its KV
    holds every planned sequence at --max-model-len."""
    low, high = _plan_at(small, n, speculative), _plan_at(small + more, n, speculative)
    if low is None:
        return
    assert high is not None, f"{small + more} MiB refused where {small} MiB fitted"
    knobs = [tuple(int(p.value(f)) for f in ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens"))
             for p in (low, high)]
    assert all(h >= lo for h, lo in zip(knobs[1], knobs[0])), (small, knobs[0], small + more, knobs[1])
    assert high.memory.kv_tokens >= knobs[1][0] * knobs[1][1]
