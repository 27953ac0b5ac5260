"""The engine's word against ours (issue 49 item 5): the 1Cat-vLLM wheel (1.5.1 on) packages the
profile its authors validate on 4x V100 (`python -m vllm.sm70_profiles show qwen38_27b_nvfp4_dflash2
--json`, FACTS.md "The engine vendor's validated V100 profile"); after the install, verify reads it
on the host and the report names every argument where the unit's flags differ from it, with our
flag's reason (the stack's or the planner's: e.g. the host's memory plan lowered max_num_seqs).

Pure: `show_command` builds the host read (the one builder verify runs and the tests assert),
`read_answer` turns its output into the profile or the one line why there is none (a CPU build and
wheels before 1.5.1 carry no module: said, never a failure), `compare` lines the profile's `args` up
with the flags through PROFILE_FLAGS, one table. A key missing from the table is listed as unknown,
never dropped: a new engine release that adds an argument shows up in the report.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field

PROFILE_NAME = "qwen38_27b_nvfp4_dflash2"
MODULE = "vllm.sm70_profiles"
MARK = "qwen27b-engine-profile:"  # the command's own lines (never JSON), ahead of its answer

# The profile's `args` keys -> our vLLM flags. The engine turns each key into `--` + key with dashes
# (vllm/sm70_profiles/profile.py profile_argv: a bool as the switch or its --no- form, a dict as
# compact JSON); the table is what qwen27b knows, so an argument a newer profile adds is named.
PROFILE_FLAGS: dict[str, str] = {
    "host": "--host",
    "port": "--port",
    "dtype": "--dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "attention_backend": "--attention-backend",
    "kv_cache_dtype": "--kv-cache-dtype",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "block_size": "--block-size",
    "mamba_block_size": "--mamba-block-size",
    "enable_prefix_caching": "--enable-prefix-caching",
    "mamba_cache_mode": "--mamba-cache-mode",
    "served_model_name": "--served-model-name",
    "limit_mm_per_prompt": "--limit-mm-per-prompt",
    "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "tool_call_parser": "--tool-call-parser",
    "reasoning_parser": "--reasoning-parser",
    "default_chat_template_kwargs": "--default-chat-template-kwargs",
    "seed": "--seed",
    "speculative_config": "--speculative-config",
    "trust_remote_code": "--trust-remote-code",
    "enforce_eager": "--enforce-eager",
    "disable_custom_all_reduce": "--disable-custom-all-reduce",
}
# Values vLLM takes as the same thing (its --dtype choices: "half" is float16).
SAME_VALUE: dict[str, dict[str, str]] = {"dtype": {"half": "float16", "float16": "float16"}}
# Our flags the profile cannot hold: the vendor's launcher passes the target as `vllm serve MODEL`.
OUTSIDE_PROFILE = {"--model"}
NOT_SET = "not set by qwen27b: the engine's default applies"
SPEC_OFF = "speculative decoding is off in this unit (the plan's notes say why)"

_NAME = re.compile(r"[a-z0-9_]{1,64}")


def show_command(venv: str, name: str = PROFILE_NAME) -> str:
    """The host read: the installed engine's own answer (stdout: its JSON), or one MARK line why
    none: `absent` (no vllm/sm70_profiles in the venv: a CPU build, a wheel before 1.5.1; no Python
    starts then), `failed N` and the last lines of its stderr. Always exits 0: the read is a report,
    never a reason to fail the host."""
    if not _NAME.fullmatch(name) or not venv.startswith("/"):
        raise ValueError(f"engine profile read: name {name!r} or venv {venv!r} is not allowed")
    v = shlex.quote(venv)
    return (f"if ! ls -d {v}/lib/python3*/site-packages/vllm/sm70_profiles >/dev/null 2>&1; "
            f"then echo '{MARK} absent'; "
            f"else e=$(mktemp) && if out=$({v}/bin/python -m {MODULE} show {name} --json 2>\"$e\"); "
            f"then printf '%s\\n' \"$out\"; else echo \"{MARK} failed $?\"; tail -n 2 \"$e\"; fi; rm -f \"$e\"; fi")


@dataclass(frozen=True)
class Difference:
    key: str  # the profile's key (speculative_config.<sub-key> for the draft's settings)
    flag: str  # our flag ("" for a key qwen27b does not know)
    theirs: str
    ours: str  # "(not set)" where the unit does not pass the flag
    why: str  # our flag's reason, or why it is not compared


@dataclass
class EngineWord:
    """What the host's engine says against the unit: `status` compared | absent | unreadable,
    `line` the one-line verdict, `differences` each argument that differs (none when they agree)."""

    status: str
    line: str
    profile: str = ""
    version: str = ""
    differences: list[Difference] = field(default_factory=list)

    def as_json(self) -> dict:
        return asdict(self)


def read_answer(lines: list[str]) -> dict | str:
    """The profile (a dict with `args`) from the host read's lines, or the one line why there is none."""
    if not lines:
        return "the host answered nothing (the read itself failed)"
    if lines[0].startswith(MARK):
        said = lines[0][len(MARK):].strip()
        if said == "absent":
            return f"the installed engine carries no packaged profile ({MODULE} is absent: a CPU build or a wheel before 1.5.1)"
        tail = " ".join(line.strip() for line in lines[1:] if line.strip())[-200:] or "no error output"
        return f"`python -m {MODULE} show {PROFILE_NAME} --json` {said.replace('failed', 'failed with exit')}: {tail}"
    try:
        profile = json.loads("\n".join(lines))
    except ValueError as error:
        return f"the engine's answer is not JSON ({error}): {' '.join(lines)[:120]}"
    if not isinstance(profile, dict) or not isinstance(profile.get("args"), dict):
        return f"the engine's answer has no `args` object: {' '.join(lines)[:120]}"
    return profile


def _as_flag_text(value) -> str:
    """The profile value as the engine's own launcher writes it on the command line."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _same(key: str, theirs, ours: str | None) -> bool:
    """Whether our flag value (None: a switch) says what the profile's value says."""
    if isinstance(theirs, bool):
        return ours is None and theirs  # a false switch is compared by the caller (its --no- form)
    if ours is None:
        return False
    if isinstance(theirs, (int, float)):
        try:
            return float(ours) == float(theirs)
        except ValueError:
            return False
    if isinstance(theirs, (dict, list)):
        try:
            return json.loads(ours) == theirs
        except ValueError:
            return False
    same = SAME_VALUE.get(key, {})
    return same.get(str(theirs), str(theirs)) == same.get(ours, ours)


def _speculative(theirs: dict, ours: str, why: str, draft: dict | None) -> list[Difference]:
    """Each of the draft's settings: `model` and `revision` are ours where the unit serves the local
    copy of that draft at that revision (the weights role fetched it there)."""
    try:
        mine = json.loads(ours)
    except ValueError:
        return [Difference("speculative_config", "--speculative-config", _as_flag_text(theirs), ours, why)]
    if draft and mine.get("model"):
        mine = {**mine, "model": draft.get("id"), "revision": draft.get("revision")}
    out = []
    for sub, value in theirs.items():
        if sub not in mine:
            out.append(Difference(f"speculative_config.{sub}", "--speculative-config", _as_flag_text(value),
                                  "(not set)", NOT_SET))
        elif mine[sub] != value:
            out.append(Difference(f"speculative_config.{sub}", "--speculative-config", _as_flag_text(value),
                                  _as_flag_text(mine[sub]), why))
    for sub in mine.keys() - theirs.keys():
        out.append(Difference(f"speculative_config.{sub}", "--speculative-config", "(not in the profile)",
                              _as_flag_text(mine[sub]), why))
    return out


def compare(profile: dict, flags, draft: dict | None = None) -> list[Difference]:
    """Every argument where `flags` (planner.Flag: name, value, reason) differ from the profile's
    `args`, with our reason; then our flags the profile does not have; then its unknown keys.
    `draft`: the stack's draft entry (id, revision) the unit's local draft path stands for."""
    ours = {flag.name: flag for flag in flags}
    out: list[Difference] = []
    seen = set(OUTSIDE_PROFILE)
    for key, value in profile["args"].items():
        flag = PROFILE_FLAGS.get(key)
        if flag is None:
            out.append(Difference(key, "", _as_flag_text(value), "(not compared)",
                                  "a key qwen27b does not know (engineword.PROFILE_FLAGS): read the engine's notes"))
            continue
        negated = "--no-" + flag[2:]
        seen |= {flag, negated}
        mine = ours.get(flag) or ours.get(negated)
        if key == "speculative_config" and isinstance(value, dict) and mine is not None and mine.name == flag:
            out += _speculative(value, mine.value, mine.reason, draft)
            continue
        if mine is None:
            if value is False:
                continue  # a switch off in both
            out.append(Difference(key, flag, _as_flag_text(value), "(not set)",
                                  SPEC_OFF if key == "speculative_config" else NOT_SET))
        elif mine.name == negated:
            if value is not False:
                out.append(Difference(key, flag, _as_flag_text(value), "off", mine.reason))
        elif value is False or not _same(key, value, mine.value):
            out.append(Difference(key, flag, _as_flag_text(value), "on" if mine.value is None else mine.value,
                                  mine.reason))
    for flag in flags:
        if flag.name not in seen:
            out.append(Difference("", flag.name, "(not in the profile)", "on" if flag.value is None else flag.value,
                                  flag.reason))
    return out


def judge(lines: list[str], flags, draft: dict | None = None) -> EngineWord:
    """The host read's lines against the unit's flags: never raises (a report, not a check)."""
    profile = read_answer(lines)
    if isinstance(profile, str):
        status = "absent" if "is absent" in profile else "unreadable"
        return EngineWord(status, profile)
    name, version = str(profile.get("name", "")), str(profile.get("version", ""))
    differences = compare(profile, flags, draft)
    where = f"the engine's profile {name} ({version})"
    line = (f"{where}: the unit passes every argument it names" if not differences else
            f"{where}: {len(differences)} argument(s) differ from the unit's, each with our reason")
    return EngineWord("compared", line, name, version, differences)


def report_lines(host: str, word: dict | None) -> list[str]:
    """The verify report's table for one host (`word`: EngineWord.as_json(), as the run report keeps it)."""
    if not word:
        return []
    lines = [f"{host}: {word['line']}"]
    rows = [["argument", "flag", "the engine's profile", "ours", "why ours"]]
    rows += [[d["key"] or "-", d["flag"] or "-", d["theirs"][:40], d["ours"][:40], d["why"][:100]]
             for d in word.get("differences") or []]
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        table = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        table.insert(1, "  ".join("-" * w for w in widths))
        lines += ["  " + row for row in table]
    return lines
