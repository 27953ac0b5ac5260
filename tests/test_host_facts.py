"""qwen27b.host_facts: JSON fixture cases (pyinfra-testing) plus garbled-output checks.

One generated TestCase per fact; one test per tests/host_facts/<FactClassName>/<case>.json with
the keys `arg`, `command`, `output` and `fact`.
"""

import json
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinfra_testing.facts import make_fact_tests

from qwen27b.facts import FactParseError
from qwen27b.host_facts import (
    ALL_HOST_FACTS,
    DeployLock,
    FileHashes,
    Subdirectories,
    SymlinkTarget,
    VenvPackages,
    normalize_distribution_name,
)

FACT_CASES = Path(__file__).parent / "host_facts"

for _fact in ALL_HOST_FACTS:
    _test_case = make_fact_tests("qwen27b", f"host_facts.{_fact.__name__}", FACT_CASES / _fact.__name__)
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
    if fact is Subdirectories:
        return isinstance(data, list) and all(
            isinstance(n, str) and n and "/" not in n and "\n" not in n and n not in (".", "..") for n in data)
    if not isinstance(data, dict):
        return False
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
@settings(max_examples=300, deadline=None)
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
    from qwen27b.facts import ALL_FACTS

    command = fact().command(arg)
    assert fact.fake_match.search(command)
    for other in ALL_HOST_FACTS + ALL_FACTS:
        if other is not fact:
            assert not other.fake_match.search(command), other.__name__
