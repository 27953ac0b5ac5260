"""qwen27b.controller.host_facts: JSON fixture cases (pyinfra-testing) plus garbled-output checks.

One generated TestCase per fact; one test per tests/host_facts/<FactClassName>/<case>.json with
the keys `arg`, `command`, `output` and `fact`.
"""

import hashlib
import json
import os
import shlex
import string
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinfra_testing.facts import make_fact_tests

from qwen27b.controller.facts import FactParseError
from qwen27b.controller.host_facts import (
    ALL_HOST_FACTS,
    DeployLock,
    DeployedState,
    DirectoryStates,
    HASH_CACHE,
    SecretFileState,
    FileHashes,
    InstalledCopies,
    ServiceUser,
    Subdirectories,
    SymlinkTarget,
    VenvPackages,
    ReleaseRecords,
)
from qwen27b.plan.distname import normalize as normalize_distribution_name
from fuzz_budget import examples
from tests.support.paths import TESTS

FACT_CASES = TESTS / "host_facts"

for _fact in ALL_HOST_FACTS:
    _test_case = make_fact_tests("qwen27b.controller", f"host_facts.{_fact.__name__}", FACT_CASES / _fact.__name__)
    globals()[f"TestHostFact{_fact.__name__}"] = _test_case

del _fact, _test_case

HASH = "ab" * 32

GARBLED = [
    (FileHashes, [f"{HASH}  wheel.whl"]),  # no ./ (find's output not what we ran)
    (FileHashes, [f"{HASH[:63]}  ./wheel.whl"]),  # truncated hash
    (FileHashes, [f"{HASH.upper()}  ./wheel.whl"]),
    (FileHashes, [f"{HASH}  ./sub/wheel.whl"]),  # not directly in the directory
    (FileHashes, [f"{HASH}  ./"]),
    (FileHashes, [f"\\{HASH}  ./bad\\escape"]),
    (FileHashes, [f"{HASH}  ./a.whl", f"{HASH}  ./a.whl"]),
    (FileHashes, ["sha256sum: ./model.safetensors: Input/output error"]),
    (FileHashes, ["xargs: sha256sum: No such file or directory"]),
    (VenvPackages, ["vllm 0.11.0"]),
    (VenvPackages, ["vllm==0.11.0 extra"]),
    (VenvPackages, ["vllm=="]),
    (VenvPackages, ["==0.11.0"]),
    (VenvPackages, ["None==1.0 x"]),
    (VenvPackages, ["Traceback (most recent call last):"]),
    (VenvPackages, ["-vllm==1.0"]),
    (SymlinkTarget, ["/opt/a", "/opt/b"]),
    (DeployLock, ["controller=a pid=1", "controller=b pid=2"]),
    (SecretFileState, ["root root 600"]),  # stat answered, sha256sum did not
    (SecretFileState, ["root root 600", "VLLM_API_KEY=abc"]),  # never anything but a hash
    (ReleaseRecords, ["{\"current\": null}"]),  # python3 answered, but not our script's shape
    (ReleaseRecords, ["Traceback (most recent call last):"]),
    (DeployedState, ["path /opt/qwen27b"]),  # no owner
    (DeployedState, ["bash: nft: command not found"]),
]


@pytest.mark.parametrize(("fact", "output"), GARBLED, ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_garbled_output_is_refused(fact, output):
    with pytest.raises(FactParseError):
        fact().process(output)


def _valid_shape(fact, data) -> bool:
    json.dumps(data)
    if fact is SymlinkTarget:
        return data is None or (isinstance(data, str) and data != "" and "\n" not in data)
    if fact is DeployLock:  # any one line is a holder (hostlock.parse names even an unreadable one)
        return data is None or (isinstance(data, str) and data.strip() and "\n" not in data)
    if fact is DirectoryStates:
        return data is None or (isinstance(data, list) and all(
            d is None or (set(d) == {"mode", "user", "group", "type"} and all(d.values())) for d in data))
    if fact is ServiceUser:
        return data is None or (set(data) == {"uid", "home", "shell", "group"} and isinstance(data["uid"], int))
    if fact is SecretFileState:
        return data is None or (set(data) == {"user", "group", "mode", "sha256"} and len(data["sha256"]) == 64)
    if fact is InstalledCopies:  # only copy names: they reach the removal commands
        from qwen27b.plan.copykeys import INSTANCE_NAME
        return isinstance(data, list) and data == sorted(set(data)) and all(INSTANCE_NAME.match(n) for n in data)
    if fact is Subdirectories:
        return isinstance(data, list) and all(
            isinstance(n, str) and n and "/" not in n and "\n" not in n and n not in (".", "..") for n in data)
    if not isinstance(data, dict):
        return False
    if fact is ReleaseRecords:
        return set(data) == {"current", "previous", "kept", "missing"} and isinstance(data["kept"], list)
    if fact is DeployedState:
        return (set(data) == {"paths", "units", "users", "groups", "nft"}
                and all(p.startswith("/") and ":" in owner for p, owner in data["paths"].items())
                and all(u and " " not in u for u in data["units"]))
    if fact is FileHashes:
        return all(
            name and "/" not in name and name not in (".", "..") and len(h) == 64 and set(h) <= set("0123456789abcdef")
            for name, h in data.items()
        )
    return all(
        name == normalize_distribution_name(name) and version and not any(c.isspace() for c in version)
        for name, version in data.items()
    )


_TEXT = st.text(alphabet=string.printable + "\\./=-_* ", max_size=120)
_REALISTIC = st.sampled_from(
    [
        f"{HASH}  ./1cat_vllm-1.5.0-cp312-cp312-linux_x86_64.whl",
        f"\\{HASH}  ./back\\\\slash",
        "1Cat_vLLM==1.5.0",
        "torch==2.8.0+cu128",
        "/opt/qwen27b/releases/1.5.0",
        "",
    ]
)


@st.composite
def _garbled(draw):
    lines = draw(st.lists(st.one_of(_REALISTIC, _TEXT), max_size=6))
    if lines and draw(st.booleans()):
        i = draw(st.integers(0, len(lines) - 1))
        cut = draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:cut]  # truncated mid-line
    return lines


@pytest.mark.parametrize("fact", ALL_HOST_FACTS, ids=lambda f: f.__name__)
@settings(max_examples=examples(300), deadline=None)
@given(output=_garbled())
def test_garbled_output_raises_or_has_a_valid_shape(fact, output):
    try:
        data = fact().process(output)
    except FactParseError:
        return
    assert _valid_shape(fact, data), data


@given(name=st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", fullmatch=True))
def test_normalized_names_are_fixed_points(name):
    once = normalize_distribution_name(name)
    assert normalize_distribution_name(once) == once
    assert once == once.lower() and "_" not in once and "." not in once and "--" not in once


@pytest.mark.parametrize("fact", ALL_HOST_FACTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("arg", ["/opt/qwen27b/wheelhouse", "/srv/it's a dir/", "-odd"])
def test_fake_match_matches_only_its_own_fact(fact, arg):
    """The @fake connector takes the first matching key: a recorded host must answer the right fact."""
    from qwen27b.controller.facts import ALL_FACTS
    from tests.support.recorded import fake_match

    args = {ReleaseRecords: (arg, arg + "/rollback"),
            DeployedState: ([arg], ["qwen27b.service"], ["qwen27b"], "inet qwen27b"),
            InstalledCopies: (arg, arg + "/etc")}.get(fact, (arg,))
    command = fact().command(*args)
    assert fake_match(fact).search(command)
    for other in ALL_HOST_FACTS + ALL_FACTS:
        if other is not fact:
            assert not fake_match(other).search(command), other.__name__


def _run_fact(command: str) -> list[str]:
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_file_hashes_runs_for_real_and_agrees_with_sha256sum(tmp_path):
    """The command as a host runs it (sh + python3), on awkward names, against GNU sha256sum."""
    for name, body in (("model.safetensors", b"w" * 3_000_000), ("we ird", b"a"), ("new\nline", b"b"),
                       ("back\\slash", b"c"), (".hidden", b"d")):
        (tmp_path / name).write_bytes(body)
    (tmp_path / "link").symlink_to(tmp_path / "we ird")
    (tmp_path / "sub").mkdir()
    ours = FileHashes().process(_run_fact(FileHashes().command(str(tmp_path))))
    theirs = FileHashes().process(_run_fact(
        f"cd {shlex.quote(str(tmp_path))} && find . -maxdepth 1 -type f ! -name '.*' -print0 | xargs -0 -r sha256sum"))
    assert ours == theirs and set(ours) == {"model.safetensors", "we ird", "new\nline", "back\\slash"}
    assert FileHashes().process(_run_fact(FileHashes().command(str(tmp_path / "missing")))) == {}


def test_file_hashes_reuses_a_hash_only_while_the_file_is_unchanged(tmp_path):
    """The stat cache: a file older than 2 s is cached; the cached hash is used while size, mtime,
    ctime and inode match (proved by planting a wrong one), and any write re-hashes it."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"v1")
    command = FileHashes().command(str(tmp_path))
    FileHashes().process(_run_fact(command))
    assert not (tmp_path / HASH_CACHE).exists()  # changed in the last 2 s: not cached yet
    past = time.time() - 60
    os.utime(weights, (past, past))
    time.sleep(2.1)  # ctime (set by utime itself) must age too
    first = FileHashes().process(_run_fact(command))
    cache = json.loads((tmp_path / HASH_CACHE).read_text())
    assert cache["model.safetensors"][4] == first["model.safetensors"] == hashlib.sha256(b"v1").hexdigest()
    cache["model.safetensors"][4] = "0" * 64  # a planted hash is believed while the stat matches
    (tmp_path / HASH_CACHE).write_text(json.dumps(cache))
    assert FileHashes().process(_run_fact(command))["model.safetensors"] == "0" * 64
    weights.write_bytes(b"v2")  # same size; new mtime and ctime
    os.utime(weights, (past, past))  # even with the old mtime put back, ctime moved
    assert FileHashes().process(_run_fact(command))["model.safetensors"] == hashlib.sha256(b"v2").hexdigest()
    (tmp_path / HASH_CACHE).write_text("not json")
    assert FileHashes().process(_run_fact(command))["model.safetensors"] == hashlib.sha256(b"v2").hexdigest()


def test_installed_copies_runs_for_real(tmp_path):
    """Each copy found by what the deploy leaves (its enabled unit, its health timer, its env file, a
    dangling enable link included); a key file is not a copy, nor the template or the one service."""
    units, config = tmp_path / "units", tmp_path / "etc"
    (units / "multi-user.target.wants").mkdir(parents=True)
    config.mkdir()
    for path in ("multi-user.target.wants/qwen27b@a.service", "qwen27b-health@b.timer", "qwen27b@.service",
                 "qwen27b-health.timer"):
        (units / path).write_text("")
    for name in ("qwen27b@c.env", "qwen27b@c-api-key.env", "qwen27b@x-api-key.env", "qwen27b.env"):
        (config / name).write_text("")
    (units / "multi-user.target.wants/qwen27b@d.service").symlink_to(tmp_path / "gone")
    command = InstalledCopies().command(str(units), str(config))
    assert InstalledCopies().process(_run_fact(command)) == ["a", "b", "c", "d"]
    assert InstalledCopies().process(_run_fact(InstalledCopies().command(str(tmp_path / "no"), str(tmp_path / "no")))) == []
