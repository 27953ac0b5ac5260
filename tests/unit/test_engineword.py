"""Issue 49 item 5, the engine's word against ours: the 1Cat 1.5.1 wheel packages its validated V100
profile (`python -m vllm.sm70_profiles show qwen38_27b_nvfp4_dflash2 --json`); verify reads it on the
host after the install and the report names every argument where the unit's flags differ, with our
reason. The recorded answer (tests/fixtures/sm70-profile/, built from the published profile: its
README says how) stands in for a 1.5.1 host; the host read itself runs for real on pyinfra's @local
connector against a venv laid out as the wheel lays it out."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import pytest

from qwen27b.controller import engineword_read, remote
from qwen27b.controller import postdeploy as V
from qwen27b.plan import engineword as E
from qwen27b.plan.planner import Flag
from tests.support.gate_run import run
from tests.support.paths import TESTS

ANSWER = TESTS / "fixtures" / "sm70-profile" / "show-qwen38_27b_nvfp4_dflash2.json"
VENV = "/var/lib/qwen27b/current/venv"
COMMAND = ("if ! ls -d /var/lib/qwen27b/current/venv/lib/python3*/site-packages/vllm/sm70_profiles >/dev/null 2>&1; "
           "then echo 'qwen27b-engine-profile: absent'; else e=$(mktemp) && if out=$(/var/lib/qwen27b/current/venv/"
           "bin/python -m vllm.sm70_profiles show qwen38_27b_nvfp4_dflash2 --json 2>\"$e\"); then printf '%s\\n' "
           "\"$out\"; else echo \"qwen27b-engine-profile: failed $?\"; tail -n 2 \"$e\"; fi; rm -f \"$e\"; fi")


def answer() -> list[str]:
    return ANSWER.read_text().splitlines()


def profile() -> dict:
    return json.loads(ANSWER.read_text())


def as_flags(args: dict) -> list[Flag]:
    """The profile's args as the engine's own launcher turns them into argv (profile_argv), as Flags."""
    flags = []
    for key, value in args.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(Flag(name if value else "--no-" + name[2:], None, f"why {key}"))
        else:
            text = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)
            flags.append(Flag(name, text, f"why {key}"))
    return flags


def test_the_recorded_answer_is_the_published_profile_as_the_engine_prints_it():
    """`show --json` prints json.dumps(profile, indent=2): the fixture is exactly that shape."""
    data = profile()
    assert ANSWER.read_text() == json.dumps(data, indent=2) + "\n"
    assert data["name"] == E.PROFILE_NAME and data["version"] == "1.5.1"
    assert data["args"]["max_model_len"] == 262144 and data["args"]["kv_cache_dtype"] == "fp8_e5m2"


def test_flags_identical_to_the_profile_differ_in_nothing():
    data = profile()
    word = E.judge(answer(), as_flags(data["args"]))
    assert word.status == "compared" and word.differences == []
    assert word.line == "the engine's profile qwen38_27b_nvfp4_dflash2 (1.5.1): the unit passes every argument it names"
    assert E.report_lines("gpu-a", word.as_json()) == [f"gpu-a: {word.line}"]


def test_every_differing_argument_is_named_with_our_reason():
    data = profile()
    flags = [f for f in as_flags(data["args"]) if f.name not in ("--seed", "--enable-prefix-caching")]
    flags = [Flag("--max-num-seqs", "2", "lowered from 4 to fit memory") if f.name == "--max-num-seqs" else f
             for f in flags]
    flags += [Flag("--no-enable-prefix-caching", None, "qwen27b_prefix_caching is off"),
              Flag("--enforce-eager", None, "start-up in under a minute")]
    found = {d.key or d.flag: d for d in E.compare(data, flags)}
    assert set(found) == {"max_num_seqs", "seed", "enable_prefix_caching", "--enforce-eager"}
    assert found["max_num_seqs"] == E.Difference("max_num_seqs", "--max-num-seqs", "4", "2", "lowered from 4 to fit memory")
    assert found["seed"] == E.Difference("seed", "--seed", "0", "(not set)", E.NOT_SET)
    assert found["enable_prefix_caching"] == E.Difference("enable_prefix_caching", "--enable-prefix-caching", "on",
                                                          "off", "qwen27b_prefix_caching is off")
    assert found["--enforce-eager"] == E.Difference("", "--enforce-eager", "(not in the profile)", "on",
                                                    "start-up in under a minute")


def test_unknown_keys_are_listed_not_dropped():
    data = profile()
    flags = as_flags(data["args"])
    data["args"]["sm70_new_knob"] = {"x": 1}
    (unknown,) = E.compare(data, flags)
    assert (unknown.key, unknown.flag, unknown.theirs, unknown.ours) == ("sm70_new_knob", "", '{"x":1}', "(not compared)")
    assert "engineword.PROFILE_FLAGS" in unknown.why


def test_same_values_in_other_words_agree_and_the_draft_path_stands_for_its_pinned_revision():
    """vLLM's --dtype half is float16; the unit serves the local copy of the profile's draft."""
    data = profile()
    flags = [Flag("--dtype", "float16", "V100 has no bf16") if f.name == "--dtype" else f for f in as_flags(data["args"])]
    spec = dict(data["args"]["speculative_config"], model="/var/lib/qwen27b/models/draft")
    del spec["revision"]
    flags = [Flag(f.name, json.dumps(spec), "auto: dflash2") if f.name == "--speculative-config" else f for f in flags]
    draft = {"id": "incoai/Qwen3.8-27B-DFlash2", "revision": "dedf8df68adfb1afeaf7b7480c0a0243108177b4"}
    assert E.compare(data, flags, draft) == []
    (revision,) = E.compare(data, flags, dict(draft, revision="main"))
    assert (revision.key, revision.theirs, revision.ours, revision.why) == (
        "speculative_config.revision", "dedf8df68adfb1afeaf7b7480c0a0243108177b4", "main", "auto: dflash2")


def test_speculation_off_is_one_row_with_why():
    data = profile()
    flags = [f for f in as_flags(data["args"]) if f.name != "--speculative-config"]
    (off,) = E.compare(data, flags)
    assert (off.key, off.ours, off.why) == ("speculative_config", "(not set)", E.SPEC_OFF)


def test_the_recorded_v100_plan_against_the_engines_word():
    """The 4x V100-32GB fresh host's unit: what differs is what the plan changed on purpose, each
    with the planner's own reason (the memory plan's max_num_seqs among them)."""
    d = run("v100x4-2204-fresh")
    word = E.judge(answer(), d.serve.flags, d.stack.draft)
    found = {d.key or d.flag: d for d in word.differences}
    assert set(found) == {"max_num_seqs", "served_model_name", "seed", "speculative_config.enforce_eager",
                          "--disable-custom-all-reduce", "--disable-access-log-for-endpoints"}
    assert found["max_num_seqs"].ours == "2" and found["max_num_seqs"].why.startswith("lowered from 4 to fit memory")
    assert found["served_model_name"].why == "the name clients send as 'model'"
    assert word.line.endswith("6 argument(s) differ from the unit's, each with our reason")
    table = E.report_lines("v100x4-2204-fresh", word.as_json())
    assert table[1].split() == ["argument", "flag", "the", "engine's", "profile", "ours", "why", "ours"]
    assert any(line.split()[:4] == ["max_num_seqs", "--max-num-seqs", "4", "2"] for line in table)


@pytest.mark.parametrize("lines, status, said", [
    (["qwen27b-engine-profile: absent"], "absent", "the installed engine carries no packaged profile "
     "(vllm.sm70_profiles is absent: a CPU build or a wheel before 1.5.1)"),
    (["qwen27b-engine-profile: failed 1", "  raise ValueError", "ValueError: Unknown SM70 profile: x"], "unreadable",
     "`python -m vllm.sm70_profiles show qwen38_27b_nvfp4_dflash2 --json` failed with exit 1: raise ValueError "
     "ValueError: Unknown SM70 profile: x"),
    ([], "unreadable", "the host answered nothing (the read itself failed)"),
    (["{\"name\": 1"], "unreadable", None),
    (["[1, 2]"], "unreadable", "the engine's answer has no `args` object: [1, 2]"),
])
def test_no_profile_is_one_line_never_a_failure(lines, status, said):
    word = E.judge(lines, [Flag("--dtype", "float16", "x")])
    assert word.status == status and word.differences == []
    if said is not None:
        assert word.line == said
    assert E.report_lines("h", word.as_json()) == [f"h: {word.line}"]


def test_the_read_refuses_a_name_or_path_that_is_not_allowed():
    with pytest.raises(ValueError):
        E.show_command(VENV, "x; reboot")
    with pytest.raises(ValueError):
        E.show_command("relative/venv")


def test_the_host_read_plans_the_exact_command_and_keeps_the_comparison(monkeypatch):
    """A fake host answering the recorded 1.5.1 output: the one command, with the host's connector
    (on_host), and the verify report's section from the row it fills."""
    sent = []

    def fake_on_host(host, command, state=None):
        sent.append((host, command))
        return True, types.SimpleNamespace(stdout_lines=answer())

    monkeypatch.setattr(engineword_read, "on_host", fake_on_host)
    d = run("v100x4-2204-fresh")
    word = engineword_read.read("gpu-a", VENV, d.serve.flags, d.stack.draft)
    assert sent == [("gpu-a", COMMAND)] and E.show_command(VENV) == COMMAND
    assert word["status"] == "compared" and len(word["differences"]) == 6
    text = engineword_read.report_text([V.HostResult("gpu-a", engine_word=word), V.HostResult("gpu-b")])
    assert text.splitlines()[:2] == ["--> the engine's packaged profile against each unit's flags",
                                     f"gpu-a: {word['line']}"] and text.endswith("\n")
    assert engineword_read.report_text([V.HostResult("gpu-b")]) == ""


def _venv(tmp_path: Path, main: str | None) -> str:
    """A venv laid out as uv lays out the 1Cat wheel's: bin/python, lib/python3.X/site-packages/vllm;
    `main`: the body of vllm/sm70_profiles/__main__.py (None: a wheel without the module)."""
    venv = tmp_path / "venv"
    site = venv / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    if main is not None:
        (site / "vllm" / "sm70_profiles").mkdir()
        (site / "vllm" / "sm70_profiles" / "__init__.py").write_text("")
        (site / "vllm" / "sm70_profiles" / "__main__.py").write_text(textwrap.dedent(main))
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(venv)


# the wheel's `show NAME --json`: json.dumps(load_profile(name), indent=2), an unknown name a ValueError
ENGINE_MAIN = f"""
import json, sys
if sys.argv[1:] != ["show", "qwen38_27b_nvfp4_dflash2", "--json"]:
    raise ValueError("Unknown SM70 profile: " + " ".join(sys.argv[1:]))
print(json.dumps(json.loads(open({str(ANSWER)!r}).read()), indent=2))
"""


@pytest.mark.parametrize("main, status", [(ENGINE_MAIN, "compared"), (None, "absent"),
                                          ("raise ValueError('Unknown SM70 profile: qwen38')", "unreadable")])
def test_the_read_runs_on_a_host(tmp_path, main, status):
    """The real command through pyinfra's @local connector and on_host: the module's answer, its
    absence (no Python started) and its failure, each as the report says it."""
    venv = _venv(tmp_path, main)
    inventory = tmp_path / "inventory.py"
    inventory.write_text("hosts = [('@local', {})]\n")
    state, (host,) = remote.load_inventory(str(inventory), cwd=str(tmp_path))
    host.connect(raise_exceptions=True)
    d = run("v100x4-2204-fresh")
    word = engineword_read.read(host, venv, d.serve.flags, d.stack.draft, state=state)
    assert word["status"] == status
    if status == "compared":
        assert word["profile"] == E.PROFILE_NAME and len(word["differences"]) == 6
    if status == "unreadable":
        assert word["line"].startswith("`python -m vllm.sm70_profiles show qwen38_27b_nvfp4_dflash2 --json` failed "
                                       "with exit 1: ") and "ValueError: Unknown SM70 profile: qwen38" in word["line"]
