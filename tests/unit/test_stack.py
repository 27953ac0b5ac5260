"""The stack file: every entry has a known source, profiles match GPUs, overrides are checked."""

import pytest

from qwen27b.plan.stack import (StackError, checkpoint_metadata_dir, gpu_spec, load_stack, profile_for_compute_capability,
                           resolve_stack)
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def stack():
    return load_stack()


def _source_ids(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "source" and value is not None:
                yield from ([value] if isinstance(value, str) else value)
            else:
                yield from _source_ids(value)
    elif isinstance(node, list):
        for item in node:
            yield from _source_ids(item)


def test_every_file_a_source_names_is_in_the_repository(stack):
    """A plan prints each cited source's text: a path in it (docs/x.md, qwen27b/...) must be a file of
    this repository, where its reader can open it (issue 48: the plan cited shared/design/CPU_VLLM.md)."""
    import re

    root = ROOT
    named = {path.rstrip(".,:;)") for text in stack["sources"].values()
             for path in re.findall(r"(?<![\w/.])((?:docs|qwen27b|roles|shared|benchmarks|templates|tests)/[\w./*-]+)", text)}
    assert named, "no source names a repository path (the pattern is wrong)"
    assert {p for p in named if not list(root.glob(p))} == set()


def test_every_cited_source_id_is_defined(stack):
    cited = set(_source_ids({k: v for k, v in stack.items() if k != "sources"}))
    bare = {s for s in cited if " " not in s}  # free-text sources (with spaces) cite themselves
    assert bare, "the stack cites no source ids"
    assert bare <= set(stack["sources"]), bare - set(stack["sources"])


@pytest.mark.parametrize("cc, profile", [("7.0", "sm70"), ("7.5", "sm75plus"), ("8.0", "sm75plus"),
                                         ("9.0", "sm75plus"), ("12.0", "sm75plus"), ("6.1", None), ("12.1", None)])
def test_profile_by_compute_capability(stack, cc, profile):
    assert profile_for_compute_capability(stack, cc) == profile


def test_volta_stack_is_the_1cat_route(stack):
    p = stack["profiles"]["sm70"]
    assert p["driver"]["package"] == "nvidia-driver-580-server" and not p["driver"]["open_modules_supported"]
    assert p["cuda"]["toolkit"] == "12.8" and p["cuda"]["max_major"] == 12
    assert p["python"]["version"] == "3.12"
    assert p["vllm"]["build"] == "1cat" and p["vllm"]["dist"] == "1cat_vllm"
    assert p["vllm"]["filename"].startswith("1cat_vllm-") and p["vllm"]["filename"].endswith(".whl")
    assert "sha256" in p["vllm"] and p["vllm"]["url"].endswith(p["vllm"]["filename"])
    assert p["torch"]["index_url"].endswith("/cu128")
    assert p["serve"]["attention_backend"] == "FLASH_ATTN_V100" and p["serve"]["dtype"] == "float16"
    assert stack["vllm_builds"]["upstream"]["min_compute_capability"] == "7.5"


def test_gpu_table_finds_cards_by_name_and_pci_id(stack):
    assert gpu_spec(stack, pci_id="1DB5")["key"] == "v100-sxm2-32gb"
    assert gpu_spec(stack, name="Tesla T4")["compute_capability"] == "7.5"
    assert gpu_spec(stack, pci_id="ffff") is None


def test_every_model_has_metadata_on_disk(stack):
    for model in stack["models"].values():
        assert (checkpoint_metadata_dir(model) / "config.json").is_file()


def test_override_merges_and_changes_the_release_hash(stack):
    base = resolve_stack(stack, "sm70")
    over = resolve_stack(stack, "sm70", {"vllm": {"version": "1.5.0"}, "model_revision": "a" * 40})
    assert over.profile["vllm"]["version"] == "1.5.0" and over.profile["vllm"]["build"] == "1cat"
    assert over.model["revision"] == "a" * 40
    assert over.stack_hash != base.stack_hash
    assert resolve_stack(stack, "sm70", {"serve": {"max_num_seqs": 2}}).stack_hash == base.stack_hash


def test_unknown_override_key_says_did_you_mean(stack):
    with pytest.raises(StackError, match=r"unknown stack key 'driver.pakage' \(did you mean 'package'\?\)"):
        resolve_stack(stack, "sm70", {"driver": {"pakage": "x"}})
    with pytest.raises(StackError, match="unknown profile 'sm7'"):
        resolve_stack(stack, "sm7")
