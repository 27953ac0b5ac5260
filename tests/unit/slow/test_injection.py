"""No injection from inventory data: every value that reaches a host's commands, units, env file or
config files is allow-listed (qwen27b/plan/allowlist.py, hostdata) and quoted where it is used.

Hosts are recorded @fake hosts (tests/fixtures/hosts): V100s, their driver and secure boot cannot
be had here. Three tiers:
- unit tests of the refusals (each names host, key and fix) and of the quoting helpers;
- the real `pyinfra <inventory> deploy.py --dry` on ad-hoc inventories of recorded hosts: a bad
  value stops the run before any fact is read, with no traceback;
- a property test (hypothesis): fuzzed host data and stack overrides drawn from valid and hostile
  alphabets are either refused cleanly, or every command the roles plan for the recorded host
  parses with shlex.split with each value inside one argv word, and every rendered unit passes
  `systemd-analyze verify` with no bare `%`. It plans in-process (the roles under a pyinfra State
  of one @fake host, ~0.1 s an example), not by spawning pyinfra per example.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qwen27b.plan import allowlist
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.controller.unitwords import env_value, systemd_quote, unit_text
from qwen27b.plan.stack import StackError, resolve_stack
from recordings import recorded_facts
from tests.support.paths import ROOT
from tests.support.inprocess import STACK, check_units, needs_systemd, planner  # noqa: F401 (planner: fixture)


def refusal(data: dict, host: str = "h") -> BadHostData:
    with pytest.raises(BadHostData) as caught:
        settings_for(host, data)
    error = caught.value
    assert str(error).startswith(f"{host}: qwen27b_") and error.fix and str(error).endswith(f"Fix: {error.fix}")
    return error


# --- serve flags: one spelling (vLLM reads _ as -), no secrets ------------------------------------

@pytest.mark.parametrize("flag", ["--api-key", "--api_key", "--hf-token", "--hf_token", "--ssl-key-password",
                                  "--some_secret"])
def test_a_secret_as_a_flag_is_refused_in_any_spelling(flag):
    error = refusal({"qwen27b_serve_flags": {flag: "sk-abc"}})
    assert error.key == f"qwen27b_serve_flags.{flag}" and "secret" in error.problem
    assert "qwen27b_api_key_file" in error.fix and "qwen27b_hf_token_file" in error.fix
    assert "sk-abc" not in str(error)


@pytest.mark.parametrize("flag, canonical", [("--max_model_len", "--max-model-len"), ("--port", "--port"),
                                             ("--served_model_name", "--served-model-name"),
                                             ("--tensor_parallel_size", "--tensor-parallel-size")])
def test_underscored_flags_get_the_dashed_flags_checks(flag, canonical):
    bad = {"--max-model-len": -1, "--port": 9000, "--served-model-name": "x", "--tensor-parallel-size": "two"}[canonical]
    assert refusal({"qwen27b_serve_flags": {flag: bad}}).key == f"qwen27b_serve_flags.{canonical}"


@pytest.mark.parametrize("flag, value", [("--return-tokens-as-token-ids", True), ("--tokenizer", "org/tok"),
                                         ("--max-num-batched-tokens", 4096), ("--tokenizer_revision", "v1")])
def test_flags_that_only_mention_tokens_are_not_secrets(flag, value):
    assert settings_for("h", {"qwen27b_serve_flags": {flag: value}}).serve_flags


def test_underscored_flags_reach_the_plan_dashed():
    s = settings_for("h", {"qwen27b_serve_flags": {"--max_num_seqs": 2, "--enable_chunked_prefill": True}})
    assert s.serve_flags == {"--max-num-seqs": 2, "--enable-chunked-prefill": True}
    d = decide("v100x4-2204-fresh", recorded_facts("v100x4-2204-fresh"), STACK, s)
    argv = d.serve.argv()
    assert argv[argv.index("--max-num-seqs") + 1] == "2" and argv.count("--max-num-seqs") == 1
    assert "--enable-chunked-prefill" in argv and not any("_" in a for a in argv if a.startswith("--"))


def test_a_flag_in_two_spellings_is_refused():
    error = refusal({"qwen27b_serve_flags": {"--max-model-len": 4096, "--max_model_len": 8192}})
    assert "are one flag" in error.problem


@pytest.mark.parametrize("flags, cause", [
    ({"--tensor_parallel_size": 3}, "--tensor-parallel-size 3 does not divide the 4 GPUs"),
    ({"--max_model_len": 999999}, "pinned --max-model-len 999999 is beyond the model's"),
])
def test_underscored_pins_meet_the_gate_and_planner(flags, cause):
    with pytest.raises(RefusedHost, match=re.escape(cause)):
        decide("v100x4-2204-fresh", recorded_facts("v100x4-2204-fresh"), STACK,
               settings_for("v100x4-2204-fresh", {"qwen27b_serve_flags": flags}))


@pytest.mark.parametrize("value", ["４０９６", "٤٠٩٦", "۴۰۹۶", "4096\u0663", "²"])
def test_non_ascii_digits_in_a_numeric_flag_are_refused(value):
    assert value.strip().isdigit() or value[-1].isdigit()  # what str.isdigit() (and int()) would have taken
    error = refusal({"qwen27b_serve_flags": {"--max-model-len": value}})
    assert error.key == "qwen27b_serve_flags.--max-model-len" and "positive whole number" in error.problem


@pytest.mark.parametrize("value", ["０.８", "0.8'", "x\\y", "ok'; rm -rf /"])
def test_flag_values_a_unit_word_cannot_hold_are_refused(value):
    flag = "--gpu-memory-utilization" if value.startswith("０") else "--tool-call-parser"
    assert refusal({"qwen27b_serve_flags": {flag: value}}).key == f"qwen27b_serve_flags.{flag}"


# --- stack overrides: one spelling, known keys of the right type, allow-listed values ---------------

def test_model_revision_in_two_spellings_is_refused_not_one_silently_winning():
    error = refusal({"qwen27b_stack_overrides": {"model_revision": "x;touch FILE", "model": {"revision": "abc1234"}}})
    assert error.key == "qwen27b_stack_overrides.model_revision" and "given twice" in error.problem
    with pytest.raises(StackError, match="given twice"):
        resolve_stack(STACK, "sm70", {"model_revision": "abc1234", "model": {"revision": "abc1234"}})


@pytest.mark.parametrize("overrides, key", [
    ({"vllm": {"version": "1.5.0; touch /tmp/x"}}, "vllm.version"),
    ({"vllm": {"dist": "vllm --pre"}}, "vllm.dist"),
    ({"vllm": {"url": "https://x.org/a.whl#$(id)"}}, "vllm.url"),
    ({"vllm": {"smoke_imports": ["torch", "os; os.system('id')"]}}, "vllm.smoke_imports"),
    ({"torch": {"index_url": "https://x.org/whl --trusted-host evil"}}, "torch.index_url"),
    ({"torch": {"index_url": "http://x.org/whl"}}, "torch.index_url"),
    ({"torch": {"requirement": "torch @ file:///tmp/x"}}, "torch.requirement"),
    ({"torch": {"required_arch": "sm_70'; import os; '"}}, "torch.required_arch"),
    ({"python": {"version": "3.12 && id"}}, "python.version"),
    ({"cuda": {"toolkit": "12.8/bin:$(id)"}}, "cuda.toolkit"),
    ({"cuda": {"keyring_deb": "../../etc/x.deb"}}, "cuda.keyring_deb"),
    ({"cuda": {"keyring_deb": "x.deb; id"}}, "cuda.keyring_deb"),
    ({"driver": {"package": "nvidia-driver-580 evil"}}, "driver.package"),
    ({"packages": ["curl", "-oAPT::x"]}, "packages"),
    ({"serve": {"dtype": "float16 --trust-remote-code"}}, "serve.dtype"),
    ({"serve": {"dtype": "0"}}, "serve.dtype"),  # found by the property test: a KeyError in the planner
    ({"serve": {"env": {"LD_PRELOAD": "/tmp/x.so"}}}, "serve.env"),
    ({"serve": {"env": {"PYTHONPATH": "/tmp"}}}, "serve.env"),
    ({"serve": {"env": {"VLLM_API_KEY": "sk-x"}}}, "serve.env"),
    ({"serve": {"env": {"A": "1\nLD_PRELOAD=/x"}}}, "serve.env"),
    ({"serve": {"env": {"A": "$HOME"}}}, "serve.env"),
    ({"serve": {"env": {"a b": "1"}}}, "serve.env"),
    ({"serve": {"quiet_endpoints": ["/health", "/x --trust-remote-code"]}}, "serve.quiet_endpoints"),
    ({"serve": {"quiet_endpoints": ["/health,/v1"]}}, "serve.quiet_endpoints"),  # one path each: the join is ours
    ({"model": {"served_name": "x %n"}}, "model.served_name"),
    ({"model": {"revision": "-rf"}}, "model.revision"),
    ({"model": {"metadata": "../../etc"}}, "model.metadata"),
    ({"draft": {"speculative": {"method": "dflash --x"}}}, "draft.speculative.method"),
])
def test_override_values_outside_their_allow_list_are_refused(overrides, key):
    error = refusal({"qwen27b_stack_overrides": overrides})
    assert error.key.startswith(f"qwen27b_stack_overrides.{key.split('.')[0]}") and error.fix, error
    # the merged stack is held to the same patterns (defence in depth, and for stack.yaml itself)
    if key not in ("serve.env",) or "\n" not in str(overrides):
        with pytest.raises(StackError):
            resolve_stack(STACK, "sm70", overrides)


@pytest.mark.parametrize("overrides, key, expected", [
    ({"serve": ["--max-model-len", "4096"]}, "serve", "expected dict"),
    ({"driver": "nvidia-driver-580-server"}, "driver", "expected dict or null"),
    ({"cuda": {"toolkit": 12.8}}, "cuda.toolkit", "expected str"),
    ({"vllm": {"version": {"pin": "1.5.0"}}}, "vllm.version", "expected str"),
    ({"serve": {"enforce_eager": "yes"}}, "serve.enforce_eager", "expected bool"),
    ({"packages": "curl"}, "packages", "expected list"),
    ({"serve": {"env": ["A=1"]}}, "serve.env", "expected dict"),
    ({"servee": {}}, "servee", "unknown stack key"),
    ({"serve": {"max_model_length": 1}}, "serve.max_model_length", "unknown stack key"),
])
def test_wrong_typed_or_unknown_overrides_are_refused_not_a_traceback(overrides, key, expected):
    error = refusal({"qwen27b_stack_overrides": overrides})
    assert error.key == f"qwen27b_stack_overrides.{key}" and expected in error.problem, error


def test_good_overrides_still_pass():
    s = settings_for("h", {"qwen27b_stack_overrides": {
        "vllm": {"version": "1.5.1", "sha256": "ab" * 32}, "torch": {"index_url": "https://mirror.lab/whl/cu128"},
        "cuda": {"toolkit": "12.9", "needed_by_vllm": True}, "serve": {"env": {"NCCL_P2P_DISABLE": "1"}, "dtype": "bfloat16"},
        "model": {"revision": "0123abcd", "served_name": "qwen/27b:v1"}, "draft": {"revision": "v1.2"}}})
    rs = resolve_stack(STACK, "sm70", s.stack_overrides)
    assert rs.model["revision"] == "0123abcd" and rs.profile["serve"]["env"]["NCCL_P2P_DISABLE"] == "1"


def test_the_stack_file_meets_its_own_allow_lists_and_every_string_has_one():
    for name in STACK["profiles"]:
        resolve_stack(STACK, name)  # raises StackError on a value outside its pattern
    untyped = set()
    for profile in STACK["profiles"].values():
        for path, value in allowlist.walk(profile):
            if isinstance(value, (str, list)) and allowlist.rule_for(path) is None and path != "serve.env":
                untyped.add(path)
    for entry in STACK["models"].values():
        for path, value in allowlist.walk(entry, "model."):
            if isinstance(value, str) and allowlist.rule_for(path) is None:
                untyped.add(path)
    assert not untyped, f"stack keys holding text with no allow-list in qwen27b/plan/allowlist.py: {sorted(untyped)}"
    assert all(rule.why and rule.ok(rule.example) for rule in allowlist.STACK_RULES.values())


# --- host data paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ['/root/mok/MOK.priv"; touch /x; "', "relative/MOK.priv", "/root/../etc/shadow",
                                  "/root/mok $(id)"])
def test_mok_key_paths_that_would_break_the_dkms_config_are_refused(path):
    assert refusal({"qwen27b_mok_key_path": path}).key == "qwen27b_mok_key_path"


def test_a_wheelhouse_folder_name_with_shell_characters_is_refused(tmp_path):
    bad = tmp_path / "wheels;id"
    bad.mkdir()
    assert refusal({"qwen27b_wheelhouse_dir": str(bad)}).key == "qwen27b_wheelhouse_dir"


@pytest.mark.parametrize("key", ["qwen27b_api_key_file", "qwen27b_hf_token_file"])
def test_a_directory_as_the_key_file_is_refused(tmp_path, key):
    (tmp_path / "keys").mkdir(mode=0o700)
    error = refusal({key: str(tmp_path / "keys")})
    assert error.key == key and "directory" in error.problem


# --- quoting where used -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["plain-1.0", "a b", 'q"uote', "back\\slash", "$HOME", "`id`", "100%"])
def test_env_values_stay_one_value(value):
    quoted = env_value(value)
    assert "\n" not in quoted
    if re.fullmatch(r"[A-Za-z0-9_.,:/@+=-]*", value):
        assert quoted == value
    else:  # systemd's EnvironmentFile= reads double quotes with backslash escapes, as sh does
        assert shlex.split(quoted) == [value] or "$" in value or "`" in value
        assert quoted.startswith('"') and quoted.endswith('"') and re.search(r'(?<!\\)"', quoted[1:-1]) is None


def test_unit_text_and_exec_words_escape_specifiers():
    assert unit_text("50%n") == "50%%n"
    assert systemd_quote("a%b $X") == "'a%%b $$X'"


# --- the real pyinfra dry run on recorded hosts ------------------------------------------------------

def run_pyinfra(inventory: Path, cache: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)


KEY_DIR = "KEYDIR"  # replaced by a real directory in the test
DRY_CASES = [
    pytest.param("qwen27b_stack_overrides={'serve': ['--max-model-len', '4096']}",
                 "qwen27b_stack_overrides.serve: expected dict", id="serve-as-a-list"),
    pytest.param("qwen27b_stack_overrides={'driver': 'nvidia-driver-580-server'}",
                 "qwen27b_stack_overrides.driver: expected dict or null", id="driver-as-a-string"),
    pytest.param(f"qwen27b_api_key_file={KEY_DIR!r}", "qwen27b_api_key_file: ", id="key-file-is-a-directory"),
    pytest.param("qwen27b_serve_flags={'--max-model-len': '\\uff14\\uff10\\uff19\\uff16'}",
                 "qwen27b_serve_flags.--max-model-len: must be a positive whole number", id="fullwidth-digits"),
    pytest.param("qwen27b_serve_flags={'--max_num_seqs': '\\u0664'}",
                 "qwen27b_serve_flags.--max-num-seqs: must be a positive whole number", id="arabic-indic-digit"),
    pytest.param("qwen27b_serve_flags={'--api_key': 'sk-not-shown'}",
                 "qwen27b_serve_flags.--api_key: --api_key passes a secret on the command line", id="api-key-flag"),
    pytest.param("qwen27b_stack_overrides={'model_revision': 'x;touch FILE', 'model': {'revision': 'abc1234'}}",
                 "qwen27b_stack_overrides.model_revision: given twice", id="revision-two-spellings"),
    pytest.param("qwen27b_stack_overrides={'cuda': {'needed_by_vllm': True, 'keyring_deb': 'k.deb;id'}}",
                 "qwen27b_stack_overrides.cuda.keyring_deb: 'k.deb;id' is not allowed here", id="keyring-deb"),
    pytest.param("qwen27b_wheelhouse_dir='/nonexistent/whelhouse'",
                 "qwen27b_wheelhouse_dir: /nonexistent/whelhouse is not a directory", id="wheelhouse-typo"),
]


@pytest.mark.parametrize("data, expected", DRY_CASES)
def test_pyinfra_dry_run_refuses_before_any_host_is_touched(tmp_path, data, expected):
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    inventory = tmp_path / "inventory.py"
    inventory.write_text("from inventory.recorded import _fake\n"
                         f"hosts = [_fake('v100x4-2204-fresh', {data.replace(repr(KEY_DIR), repr(str(keys)))}),"
                         " _fake('v100x1-2004')]\n")
    result = run_pyinfra(inventory, tmp_path / "cache")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-2000:]
    assert f"bad inventory data, no host was touched: @fake/v100x4-2204-fresh: {expected}" in out, out[-2000:]
    assert re.search(r"Fix: \S", out), out[-2000:]
    assert "Traceback" not in out and "Loaded fact" not in out and "operation(s) planned" not in out, out[-2000:]
    assert "sk-not-shown" not in out


def test_pyinfra_dry_run_refuses_underscored_pins_at_the_gate(tmp_path):
    """TP 3 and an absurd length, spelled with underscores, meet the gate's and planner's checks."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "from inventory.recorded import _fake\n"
        "hosts = [('@fake/tp3', _fake('v100x4-2204-fresh', qwen27b_serve_flags={'--tensor_parallel_size': 3})[1]),\n"
        "         ('@fake/len', _fake('v100x4-2204-fresh', qwen27b_serve_flags={'--max_model_len': 999999})[1])]\n")
    result = run_pyinfra(inventory, tmp_path / "cache")
    out = result.stderr
    assert result.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert re.search(r"== @fake/tp3: REFUSED.*--tensor-parallel-size 3 does not divide the 4 GPUs", out, re.S), out[-3000:]
    assert re.search(r"== @fake/len: REFUSED.*pinned --max-model-len 999999 is beyond", out, re.S), out[-3000:]
    assert "operation(s) planned" not in out


# --- property: fuzzed data is refused cleanly, or planned as the intended argv ------------------------

SAFE = "abcXYZ0189._-/:@+="
HOSTILE = " ;|&$()`'\"\\%*?[]~#!{}<>\n\t"
UNICODE = ["４", "٤", "é", "\u200b", "\x00"]
CHARS = st.sampled_from(list(SAFE) + list(HOSTILE) + UNICODE)
WORD = st.text(alphabet=CHARS, min_size=1, max_size=14)


def mostly(valid: list[str], hostile=WORD):
    """A valid value most of the time (so plans get made), a hostile or valid-plus-hostile one otherwise."""
    good = st.sampled_from(valid)
    mixed = st.builds(lambda v, h: v + h, good, hostile)
    return st.integers(0, 7).flatmap(lambda n: hostile if n == 0 else mixed if n == 1 else good)


OVERRIDES = st.fixed_dictionaries({}, optional={
    "model": st.fixed_dictionaries({}, optional={"revision": mostly(["abc1234", "v1.2", "main"]),
                                                 "served_name": mostly(["qwen3.8-27b", "lab/qwen:1"])}),
    "model_revision": mostly(["0123abcd"]),
    "vllm": st.fixed_dictionaries({}, optional={"version": mostly(["1.5.0", "1.5.1rc1"])}),
    "torch": st.fixed_dictionaries({}, optional={"index_url": mostly(["https://mirror.lab/whl/cu128"])}),
    "python": st.fixed_dictionaries({}, optional={"version": mostly(["3.12", "3.11"])}),
    "cuda": st.fixed_dictionaries({"needed_by_vllm": st.booleans()}, optional={
        "toolkit": mostly(["12.8", "12.6"]), "keyring_deb": mostly(["cuda-keyring_1.1-1_all.deb"])}),
    "serve": st.fixed_dictionaries({}, optional={"dtype": mostly(["float16", "bfloat16"]),
                                                 "env": st.dictionaries(mostly(["NCCL_DEBUG", "X_1"]),
                                                                        mostly(["INFO", "1", "a,b:c"]), max_size=2)}),
})
FLAG_NAMES = mostly(["--tool_call_parser", "--enable-auto-tool-choice", "--max_num_seqs", "--seed"],
                    st.builds(lambda w: "--" + w, WORD))
HOST_DATA = st.fixed_dictionaries({}, optional={
    "qwen27b_stack_overrides": OVERRIDES,
    "qwen27b_served_model_name": mostly(["qwen", "org/name@v1"]),
    "qwen27b_serve_flags": st.dictionaries(FLAG_NAMES, st.one_of(mostly(["hermes", "2", '{"a":1}', "x y%z$w"]),
                                                                  st.just(True), st.integers(1, 8)), max_size=2),
    "qwen27b_mok_key_path": mostly(["/var/lib/shim-signed/mok/MOK.priv"]),
})
FUZZ_HOSTS = ["v100x4-2204-fresh", "v100x1-secureboot", "a100x2-2204"]


def strings(value) -> list[str]:
    """Every string a host's data holds (keys included): the values to find in the plan."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


@needs_systemd
# QWEN27B_FUZZ_EXAMPLES=600 for a longer hunt (~50 s); 50 keep the unit tier fast (~6 s)
@settings(max_examples=int(os.environ.get("QWEN27B_FUZZ_EXAMPLES", "50")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(host=st.sampled_from(FUZZ_HOSTS), data=HOST_DATA)
def test_fuzzed_data_is_refused_cleanly_or_planned_as_the_intended_argv(planner, host, data):
    try:
        decision = decide(host, recorded_facts(host), STACK, settings_for(host, data))
    except BadHostData as error:
        assert str(error).startswith(f"{host}: qwen27b_") and error.fix
        event("refused by hostdata")
        return
    except RefusedHost as refused:  # the gate's refusal (a pin that does not fit, an unknown build, ...)
        assert refused.problems and all(cause and fix for cause, fix in refused.problems)
        event("refused by the gate")
        return
    event("planned")  # `pytest --hypothesis-show-statistics` shows how many examples got this far
    values = [v for v in strings(data) if v]
    ops = planner(host, data, decision)
    assert ops
    for op, commands in ops:
        for command in commands:
            if command.startswith(("python: ", "upload")):
                continue
            argv = shlex.split(command)  # parses: no unbalanced quote from a value
            for value in values:
                if value in command:  # a value in the command stays inside one word
                    assert any(value in word for word in argv), (op, command, value)
            if op == "download from the hub" and "--revision" in argv:
                revision = argv[argv.index("--revision") + 1]
                assert revision in (decision.stack.model["revision"], (decision.stack.draft or {}).get("revision"))
    with tempfile.TemporaryDirectory() as scratch:
        check_units(decision, Path(scratch))
    served = decision.serve.value("--served-model-name")
    assert served == (data.get("qwen27b_served_model_name") or decision.stack.model["served_name"])


def test_plain_urls_with_glob_characters_are_one_quoted_word(planner):
    """hostdata allows ? # ~ [ ] in URLs (percent-encoding aside): the commands quote them."""
    host, data = "v100x4-2204-fresh", {"qwen27b_python_mirror": "https://m.lab/py?v=[3]~x",
                                       "qwen27b_http_proxy": "http://proxy.lab:3128/?a=~b",
                                       "qwen27b_model_source": "hub"}
    decision = decide(host, recorded_facts(host), STACK, settings_for(host, data))
    commands = [c for _, cmds in planner(host, data, decision) for c in cmds]
    python = [c for c in commands if "uv python install" in c]
    assert python and "UV_PYTHON_INSTALL_MIRROR='https://m.lab/py?v=[3]~x'" in python[0]
    assert "UV_PYTHON_INSTALL_MIRROR=https://m.lab/py?v=[3]~x" in shlex.split(python[0])
