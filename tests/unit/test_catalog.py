"""The engine profile catalog (issue 49 items 2, 3, 7): stack.yaml `catalog:`, qwen27b/plan/catalog.py,
host data qwen27b_engine_profile and `qwen27b profiles`, on the recorded hosts."""

from __future__ import annotations

import json

import pytest

from qwen27b.controller.report import format_decision
from qwen27b.plan import catalog
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.stack import load_stack
from qwen27b.tools import cli, profiles
from recordings import recorded_facts

STACK = load_stack()


def plan(host, data=None, **replace):
    return decide(host, recorded_facts(host, **replace), STACK, settings_for(host, data or {}))


def flag(d, name):
    return next((f.value for f in d.serve.flags if f.name == name), None)


def test_the_catalog_is_whole_one_default_per_generation():
    assert catalog.check_catalog(STACK) == []
    assert {p: catalog.default_for(STACK, p) for p in STACK["profiles"]} == {
        "sm70": "quasar-nvfp4-dflash2", "sm75plus": "modelopt-sm75", "cpu-smoke": "cpu-smoke"}
    for name in ("quasar-nvfp4-dflash2", "unsloth-nvfp4", "radixark-mtp", "modelopt-sm75", "cpu-smoke"):
        entry = catalog.entries(STACK)[name]
        assert entry["source"] and "validated_on" in entry and "figures" in entry


def test_check_catalog_finds_a_second_default_and_an_unknown_model():
    broken = {**STACK, "catalog": {**STACK["catalog"],
                                   "extra": {**STACK["catalog"]["unsloth-nvfp4"], "default": True, "model": "nope",
                                             "figures": [{"tok_s": 1, "what": "x", "by": "vendor", "source": "nowhere"}]}}}
    problems = catalog.check_catalog(broken)
    assert "extra: source 'nowhere' is not under sources:" in problems
    assert any("profile 'sm70' has 2 default" in p for p in problems)
    assert any("extra: model 'nope'" in p for p in problems)


def test_each_default_is_its_generation_profile_exactly():
    """The sm70 default is today's sm70 route, unchanged: the goldens gain only the entry's line."""
    for name, profile in (("quasar-nvfp4-dflash2", "sm70"), ("modelopt-sm75", "sm75plus"), ("cpu-smoke", "cpu-smoke")):
        assert catalog.profile_of(STACK, name) == STACK["profiles"][profile]


def test_the_vendor_figures_are_labelled_as_theirs():
    figures = catalog.entries(STACK)["quasar-nvfp4-dflash2"]["figures"]
    assert [(f["tok_s"], f["by"]) for f in figures] == [(206, "vendor"), (251.6, "vendor"), ("222-263", "independent")]
    assert all(f["source"] == "1cat-vendor-speed" for f in figures)
    assert "206 tok/s (vendor:" in catalog.figures_text(catalog.entries(STACK)["quasar-nvfp4-dflash2"])


def test_radixark_mtp_is_the_route_before_the_first_slice():
    p = catalog.profile_of(STACK, "radixark-mtp")
    assert p["model"] == "qwen3.8-27b-nvfp4-radixark" and p["speculative_auto"] == ["mtp", "dflash2"]
    assert p["vllm"]["version"] == "1.5.0" and len(p["vllm"]["sha256"]) == 64 and "v1.5.0" in p["vllm"]["url"]
    assert p["serve"]["kv_cache_dtype"] == "float16" and p["serve"]["max_model_len"] == 8192
    assert p["serve"]["block_size"] is None and p["serve"]["gpu_memory_utilization"] == 0.88
    d = plan("v100x4-2204-fresh", {"qwen27b_engine_profile": "radixark-mtp"})
    assert d.serve.spec.method == "mtp" and d.stack.model["id"] == "RadixArk/Qwen3.8-27B-NVFP4"
    assert flag(d, "--kv-cache-dtype") == "float16" and flag(d, "--max-model-len") == "8192"
    assert flag(d, "--block-size") is None and d.choice("vllm").value == "1cat_vllm==1.5.0"


def test_a_catalog_change_to_a_key_its_profile_lacks_is_refused():
    broken = {**STACK, "catalog": {**STACK["catalog"], "x": {**STACK["catalog"]["radixark-mtp"],
                                                            "serve": {"max_model_lenn": 4096}}}}
    with pytest.raises(catalog.CatalogError, match="max_model_lenn.*did you mean 'max_model_len'"):
        catalog.profile_of(broken, "x")


def test_the_plan_names_the_entry_and_why():
    text = format_decision(plan("v100x4-2204-fresh"))
    assert ("   engine profile quasar-nvfp4-dflash2: the sm70 profile's default (compute capability 7.0; no "
            "qwen27b_engine_profile) [catalog-ours]") in text.splitlines()
    assert "[catalog-ours] qwen27b's own catalog" in text
    chosen = plan("v100x4-2204-fresh", {"qwen27b_engine_profile": "unsloth-nvfp4"}).entry
    assert chosen.line() == ("engine profile unsloth-nvfp4: qwen27b_engine_profile (the sm70 default is "
                             "quasar-nvfp4-dflash2) [catalog-ours]")


def test_a_wrong_name_is_refused_before_any_host_with_the_list():
    with pytest.raises(BadHostData) as caught:
        settings_for("h", {"qwen27b_engine_profile": "quasar-nvfp4-dflash"})
    assert caught.value.key == "qwen27b_engine_profile"
    assert "did you mean 'quasar-nvfp4-dflash2'?" in caught.value.fix
    for name in catalog.entries(STACK):
        assert name in caught.value.fix


def test_an_entry_beside_another_qwen27b_profile_is_refused():
    with pytest.raises(BadHostData, match="an entry of the sm70 profile, and qwen27b_profile is 'cpu-smoke'"):
        settings_for("h", {"qwen27b_profile": "cpu-smoke", "qwen27b_engine_profile": "radixark-mtp"})


def test_the_cpu_profile_resolves_through_the_catalog():
    """qwen27b_profile cpu-smoke (every existing inventory, the e2e tier's) and qwen27b_engine_profile
    cpu-smoke are one choice: the catalog's cpu-smoke entry."""
    assert settings_for("h", {"qwen27b_engine_profile": "cpu-smoke"}).profile == "cpu-smoke"
    for data in ({"qwen27b_profile": "cpu-smoke"}, {"qwen27b_engine_profile": "cpu-smoke"}):
        d = plan("debian12-cpu", data)
        assert d.entry.name == "cpu-smoke" and d.profile == "cpu-smoke"


def test_an_entry_of_another_generation_is_refused_naming_the_gpus():
    with pytest.raises(RefusedHost) as caught:
        plan("v100x4-2204-fresh", {"qwen27b_engine_profile": "modelopt-sm75"})
    text = str(caught.value)
    assert "'modelopt-sm75' is an entry of the sm75plus profile (compute capability 7.5-12.0)" in text
    assert "Tesla V100-SXM2-32GB is compute capability 7.0, the sm70 generation" in text
    assert "quasar-nvfp4-dflash2, unsloth-nvfp4, radixark-mtp" in text
    with pytest.raises(RefusedHost, match="A100-SXM4-80GB is compute capability 8.0, the sm75plus generation"):
        plan("a100x2-2204", {"qwen27b_engine_profile": "quasar-nvfp4-dflash2"})


# Item 3: the planner adapts the chosen entry to the host, and says how.

def test_4x_v100_32gb_gets_the_entry_as_validated():
    d = plan("v100x4-2204-fresh")
    assert d.entry.name == "quasar-nvfp4-dflash2" and d.serve.spec.method == "dflash2"
    assert flag(d, "--max-model-len") == "262144" and flag(d, "--kv-cache-dtype") == "fp8_e5m2"


def test_2x_v100_16gb_drops_the_draft_copied_onto_each_card_and_lowers_the_context():
    d = plan("v100x2-16gb")
    assert d.serve.spec.method == "off" and d.draft_path is None
    assert "draft (3.58 GiB whole on every card [1cat-draft-per-card]) does not fit" in d.serve.spec.reason
    assert flag(d, "--max-model-len") == "32768"
    assert "lowered from 262144 to fit memory; KV room holds 40,343 tokens per GPU" in next(
        f.reason for f in d.serve.flags if f.name == "--max-model-len")


def test_an_entry_with_mtp_weights_falls_to_mtp_where_the_draft_does_not_fit():
    d = plan("v100x1-2004", {"qwen27b_engine_profile": "unsloth-nvfp4"})
    assert d.serve.spec.method == "mtp"
    assert d.serve.spec.reason.startswith("fallback: the DFlash2 draft (3.58 GiB whole on every card")
    assert d.draft_path is None  # nothing to fetch for a draft that is not served


def test_more_gpus_than_validated_is_a_stated_choice():
    d = plan("v100x8-sxm2-dgx1")
    assert flag(d, "--tensor-parallel-size") == "8"
    assert "one TP group over every GPU" in next(f.reason for f in d.serve.flags if f.name == "--tensor-parallel-size")
    assert any("2 copies of TP 4 (qwen27b_instances)" in n for n in d.serve.notes)


# `qwen27b profiles`

def fits(host):
    return {f.entry: f for f in profiles.host_fits(host, recorded_facts(host), settings_for(host, {}), STACK)}


def test_profiles_4x_v100_32gb_fits_the_vendor_route():
    f = fits("v100x4-2204-fresh")
    assert f["quasar-nvfp4-dflash2"].fits and f["quasar-nvfp4-dflash2"].serves == "dflash2, context 262144, TP 4"
    assert f["quasar-nvfp4-dflash2"].why == ("links: validated on NVLink with custom all-reduce; here it is off (TP 4, "
                                             "GPU links not read (nvidia-smi topo -m answered nothing: no driver yet))")
    assert fits("v100x4-converged")["quasar-nvfp4-dflash2"].why == "as validated"  # NVLink read, custom all-reduce on
    pcie = fits("v100x4-pcie")["quasar-nvfp4-dflash2"]
    assert pcie.why.startswith("validated on 4x Tesla V100-SXM2-32GB 32 GiB (vendor), this plan uses 4x 32 GiB "
                               "(Tesla V100-PCIE-32GB); ")
    assert pcie.fits and "links: validated on NVLink with custom all-reduce; here it is off (TP 4, not every pair on " \
        "NVLink (0-1 NODE, 0-2 SYS" in pcie.why
    assert not f["modelopt-sm75"].fits and "compute capability 7.0, the sm70 generation" in f["modelopt-sm75"].why
    assert "validated on 4x Tesla V100-SXM2-16GB 16 GiB (owners)" in f["radixark-mtp"].why


def test_profiles_2x_v100_16gb_says_why_dflash2_does_not_fit():
    f = fits("v100x2-16gb")
    quasar = f["quasar-nvfp4-dflash2"]
    assert quasar.fits and quasar.serves == "no speculation, context 32768, TP 2"
    assert "the DFlash2 draft (3.58 GiB whole on every card [1cat-draft-per-card]) does not fit" in quasar.why
    assert "context 32768, not the entry's 262144" in quasar.why
    assert "validated on 4x Tesla V100-SXM2-32GB 32 GiB (vendor), this plan uses 2x 16 GiB" in quasar.why
    assert not f["unsloth-nvfp4"].fits and f["unsloth-nvfp4"].why.startswith("too little memory on 2x Tesla V100-SXM2-16GB")
    assert f["radixark-mtp"].fits and f["radixark-mtp"].serves == "mtp, context 8192, TP 2"


def test_profiles_prints_the_catalog_and_json(capsys):
    assert cli.main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["entry", "engine", "target", "draft", "methods", "validated", "on",
                                           "measured", "(by", "whom)"]
    for name in catalog.entries(STACK):
        assert name in out
    assert "206 tok/s (vendor:" in out
    assert cli.main(["profiles", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["catalog"]}
    assert rows["quasar-nvfp4-dflash2"]["engine"] == "1cat_vllm==1.5.1" and rows["quasar-nvfp4-dflash2"]["default"]
    assert rows["unsloth-nvfp4"]["target"] == "unsloth/Qwen3.8-27B-NVFP4" and rows["unsloth-nvfp4"]["methods"] == ["dflash2", "mtp"]
    assert rows["cpu-smoke"]["draft"] is None and rows["cpu-smoke"]["methods"] == ["mtp"]


def test_profiles_limit_needs_an_inventory(capsys):
    assert cli.main(["profiles", "--limit", "x"]) == 2
    assert "--limit needs an INVENTORY" in capsys.readouterr().err


def test_profiles_reads_an_inventorys_hosts_through_pyinfra():
    """The command itself on the recorded inventory (pyinfra's @fake connector answering with the
    recordings): read-only gate facts, every entry planned, the host's own entry marked."""
    import subprocess
    import sys

    from tests.support.paths import ROOT as root
    run = subprocess.run([sys.executable, "-m", "qwen27b.tools.cli", "profiles", "inventory/recorded.py", "--limit",
                          "@fake/v100x4-2204-fresh", "@fake/v100x2-16gb", "--json"], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {(r["host"], r["entry"]): r for r in json.loads(run.stdout)["hosts"]}
    assert len(rows) == 2 * len(catalog.entries(STACK))
    fresh = rows[("@fake/v100x4-2204-fresh", "quasar-nvfp4-dflash2")]
    assert fresh["fits"] and fresh["chosen"] and fresh["serves"] == "dflash2, context 262144, TP 4"
    small = rows[("@fake/v100x2-16gb", "quasar-nvfp4-dflash2")]
    assert small["chosen"] and small["serves"].startswith("no speculation") and "whole on every card" in small["why"]
    assert not rows[("@fake/v100x2-16gb", "unsloth-nvfp4")]["fits"]
    assert not rows[("@fake/v100x2-16gb", "radixark-mtp")]["chosen"]


def test_qwen27b_model_beside_an_entry_is_said_on_the_entry_line():
    d = plan("v100x4-2204-fresh", {"qwen27b_model": "qwen3.8-27b-nvfp4-radixark"})
    assert d.entry.name == "quasar-nvfp4-dflash2" and d.stack.model["id"] == "RadixArk/Qwen3.8-27B-NVFP4"
    assert d.entry.reason.endswith("; its target qwen3.8-27b-nvfp4-quasar replaced by qwen27b_model "
                                   "qwen3.8-27b-nvfp4-radixark, a checkpoint this entry was not validated with")
    assert plan("v100x4-2204-fresh", {"qwen27b_model": "qwen3.8-27b-nvfp4-quasar"}).entry.reason.endswith("[catalog-ours]")


def test_profiles_says_a_group_member_is_planned_alone():
    data = {"qwen27b_node_group": "pair-a", "qwen27b_node_role": "head", "qwen27b_node_address": "10.10.0.1",
            "qwen27b_node_interface": "enp65s0f0", "qwen27b_interconnect_gbps": 10}
    fit = profiles.host_fits("head", recorded_facts("v100x2-16gb"), settings_for("head", data), STACK)[0]
    assert fit.why.startswith("planned alone (qwen27b_node_group pair-a: the group's pipeline is not planned here); ")
