"""Sources a lab can reach (issue 30): where uv's Python build comes from, the new source keys, and
the plan's `fetch:` lines, as pure functions and through the real `pyinfra ... --dry` on a recorded
20.04 host (tests/fixtures/hosts/v100x1-2004) with the controller cache holding a Python build.

Real parts: the stack file, hostdata's checks, the gate and the roles' planned commands.
"""

from __future__ import annotations

import shlex

import pytest

from qwen27b.plan import sources
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.stack import NoModelScopeId, load_stack, resolve_stack
from roles.vllm import index_words
from tests.support.dryrun import run_pyinfra

SRC = load_stack()["fetch_sources"]
ARCHIVE = "20251014/cpython-3.12.12+20251014-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz"
OFFLINE = {"qwen27b_hf_endpoint": "http://192.168.10.5:8090", "qwen27b_wheel_mirror": "http://192.168.10.5:8800/wheels/"}


def settings(**data):
    return settings_for("h", {f"qwen27b_{k}": v for k, v in data.items()})


def test_python_comes_from_the_cache_only_when_it_holds_this_versions_build():
    other = ["20251014/cpython-3.11.14+20251014-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz",
             "20250101/cpython-3.12.12+20251014-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz",  # wrong dir
             "20251014/notes.tar.gz"]
    assert sources.python_source(settings(), SRC, "3.12", tuple(other)).kind == "github"
    cached = sources.python_source(settings(python_mirror="http://m/py"), SRC, "3.12", tuple(other + [ARCHIVE]))
    assert (cached.kind, cached.archives) == ("controller", (ARCHIVE,)) and "controller cache" in cached.shown


@pytest.mark.parametrize("data, kind, mirror", [
    ({}, "github", None),
    ({"python_mirror": "http://192.168.10.5:8800/python"}, "python_mirror", "http://192.168.10.5:8800/python"),
    ({"release_mirror": "https://gh.lab/"}, "release_mirror", "https://gh.lab/astral-sh/python-build-standalone/releases/download"),
    ({"release_mirror": "https://gh.lab", "python_mirror": "http://m/py"}, "python_mirror", "http://m/py"),
])
def test_python_source_without_a_cached_build(data, kind, mirror):
    source = sources.python_source(settings(**data), SRC, "3.12")
    assert (source.kind, source.mirror) == (kind, mirror)
    assert ("GitHub" in source.shown) == (kind == "github") and "controller cache" not in source.shown


def test_a_python_mirror_with_a_login_is_shown_without_its_password():
    source = sources.python_source(settings(python_mirror="https://u:pw@m.lab/py"), SRC, "3.12")
    assert "pw" not in source.shown and source.mirror == "https://u:pw@m.lab/py"


def test_github_from_an_offline_hosts_data_is_warned_with_the_fix():
    github = sources.python_source(settings(**{k[8:]: v for k, v in OFFLINE.items()}), SRC, "3.12")
    warning = sources.python_warning(settings(**{k[8:]: v for k, v in OFFLINE.items()}), github, "3.12")
    assert "qwen27b_wheel_mirror, qwen27b_hf_endpoint" in warning and "qwen27b_python_mirror" in warning
    assert sources.python_warning(settings(), github, "3.12") is None  # a connected host: nothing to warn
    assert "could not reach github.com" in sources.python_warning(settings(), github, "3.12", unreachable=True)
    mirrored = sources.python_source(settings(python_mirror="http://m/py", wheel_mirror="http://m/w/"), SRC, "3.12")
    assert sources.python_warning(settings(wheel_mirror="http://m/w/"), mirrored, "3.12") is None


def test_the_release_mirror_replaces_github_only():
    s = settings(release_mirror="https://gh.lab/mirror/")
    assert sources.github_url("https://github.com/o/r/releases/download/v1/x.whl", s, SRC) == \
        "https://gh.lab/mirror/o/r/releases/download/v1/x.whl"
    assert sources.github_url("https://download.pytorch.org/whl/cu128", s, SRC) == "https://download.pytorch.org/whl/cu128"


def fetched(data: dict, python=True, models=None) -> dict[str, str]:
    stack = load_stack()
    profile = stack["profiles"]["sm70"]
    py = sources.python_source(settings(**data), SRC, "3.12") if python else None
    entry = {"id": "org/m", "revision": "r"}
    return {f.what: f.url for f in sources.fetches(SRC, profile, settings(**data), py, models or [entry])}


def test_fetches_by_default_and_with_every_lab_key():
    assert fetched({}) == {
        "Python 3.12 (uv)": "https://github.com/astral-sh/python-build-standalone/releases/download/",
        "torch index": "https://download.pytorch.org/whl/cu128/",
        "1cat_vllm wheel": load_stack()["profiles"]["sm70"]["vllm"]["url"],
        "PyPI (the other wheels)": "https://pypi.org/simple/",
        "org/m (hub)": "https://huggingface.co/api/models/org/m"}
    lab = fetched({"release_mirror": "https://gh.lab", "hf_endpoint": "https://hf.lab/", "pypi_index": "https://pi.lab/simple/",
                   "torch_index": "https://pi.lab/cu128"})
    assert all(url.startswith(("https://gh.lab/", "https://hf.lab/", "https://pi.lab/")) for url in lab.values()), lab
    kept = sources.fetches(SRC, load_stack()["profiles"]["sm70"], settings(), None, [], wheels=False)
    assert kept == []  # the release venv holds the build, the model is verified on disk, Python is there
    offline = fetched({"wheel_mirror": "http://m/w/", "model_source": "mirror", "model_mirror": "http://m"}, python=False)
    assert offline == {"wheels (lab mirror)": "http://m/w/", "org/m (mirror)": "http://m"}


def test_a_modelscope_host_fetches_modelscopes_ids_with_its_client():
    """ModelScope names checkpoints its own way: the stack's `modelscope` id and revision replace the
    Hub's in everything the host does (the dir name too), the plan's fetch row points at ModelScope
    (or qwen27b_modelscope_endpoint), and the release venv gets the pinned `modelscope` client."""
    stack = load_stack()
    hub = resolve_stack(stack, "sm70")
    ms = resolve_stack(stack, "sm70", {"model_revision": "abc123"}, model_source="modelscope")
    assert (ms.model["id"], ms.model["hub_id"]) == (stack["models"][hub.profile["model"]]["modelscope"]["id"], hub.model["id"])
    assert ms.model["revision"] == "abc123"  # the host's pin applies to the source it fetches from
    assert resolve_stack(stack, "sm70", model_source="hub").model == hub.model
    s = settings(model_source="modelscope", modelscope_endpoint="http://ms.lab:8900/")
    rows = {f.what: (f.url, f.fix) for f in sources.fetches(SRC, hub.profile, s, None, [ms.model], wheels=False)}
    assert rows == {f"{ms.model['id']} (ModelScope)": (f"http://ms.lab:8900/api/v1/models/{ms.model['id']}",
                                                       "qwen27b_modelscope_endpoint")}
    default = sources.fetches(SRC, hub.profile, settings(model_source="modelscope"), None, [ms.model], wheels=False)
    assert default[0].url.startswith("https://www.modelscope.cn/api/v1/models/")
    assert sources.fetch_clients(ms, s) == [stack["tools"]["fetch_clients"]["modelscope"]["requirement"]]
    assert sources.fetch_clients(hub, settings()) == []


def test_a_checkpoint_without_a_modelscope_id_is_refused_for_that_source():
    stack = load_stack()
    stack["models"]["qwen3.8-27b-nvfp4-quasar"] = {k: v for k, v in stack["models"]["qwen3.8-27b-nvfp4-quasar"].items()
                                                   if k != "modelscope"}
    with pytest.raises(NoModelScopeId, match="QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 has no ModelScope id"):
        resolve_stack(stack, "sm70", model_source="modelscope")
    assert resolve_stack(stack, "sm70", model_source="mirror").model["id"] == "QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4"


def test_fetch_lines_hide_passwords():
    lines = sources.fetch_lines(sources.fetches(SRC, load_stack()["profiles"]["sm70"],
                                                settings(pypi_index="https://u:pw@pi.lab/simple/"), None, []))
    assert "fetch: PyPI (the other wheels) <- https://u:***@pi.lab/simple/" in lines and "pw" not in str(lines)


@pytest.mark.parametrize("key, value, problem", [
    ("release_mirror", "https://u:pw@gh.lab/", "carries a login"),
    ("hf_endpoint", "https://tok@hf.lab", "carries a login"),
    ("hf_endpoint", "file:///srv/hf", "not a http/https URL"),
    ("modelscope_endpoint", "https://tok@ms.lab", "carries a login"),
    ("modelscope_endpoint", "ms.lab:8900", "not a http/https URL"),
    ("model_source", "modelscop", "is not a model source"),
    ("pypi_index", "https://pi.lab/simple/ --index-url x", "not a http/https URL"),
    ("torch_index", "ftp://pi.lab/cu128", "not a http/https URL"),
    ("apt_mirror", "file:///srv/apt", "not a http/https URL"),
    ("apt_mirror", "http://apt.lab/ubuntu jammy main", "not a http/https URL"),  # a whole sources line
    ("apt_mirror", "http://u:pw@apt.lab/m#x", "has a query, fragment or brackets"),  # '#' starts a comment in a sources line
    ("apt_mirror", "http://apt.lab/m?a=1", "has a query, fragment or brackets"),
    ("apt_mirror", "http://apt.lab/[trusted=yes]", "has a query, fragment or brackets"),
])
def test_bad_source_keys_are_refused_naming_host_key_and_fix(key, value, problem):
    with pytest.raises(BadHostData) as refused:
        settings(**{key: value})
    assert refused.value.key == f"qwen27b_{key}" and problem in refused.value.problem and refused.value.fix
    assert "pw" not in str(refused.value)


def test_an_index_with_a_login_goes_to_uv_through_its_environment():
    plain, secret = settings(pypi_index="https://pi.lab/simple/"), settings(pypi_index="https://u:pw@pi.lab/simple/")
    assert index_words(plain, "pypi_index", "--index-url", "UV_INDEX_URL") == ("", " --index-url https://pi.lab/simple/")
    assert index_words(secret, "pypi_index", "--index-url", "UV_INDEX_URL") == ('UV_INDEX_URL="$QWEN27B_PYPI_INDEX" ', "")
    assert index_words(settings(), None, "--index-url", "UV_INDEX_URL", "https://x/cu128") == ("", " --index-url https://x/cu128")


def _host_block(stderr: str, host: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if host in line or line.startswith((" ", "WARNING")))


def test_a_cached_python_build_is_what_the_plan_says_and_the_commands_use(tmp_path):
    """The bug: the plan said 'from the controller cache' while uv downloaded from GitHub. With the
    build in the cache it is pushed and uv reads it from a file:// mirror; without it, the plan says GitHub."""
    build = tmp_path / "python" / ARCHIVE
    build.parent.mkdir(parents=True)
    build.write_bytes(b"not really a tarball")
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "-v", "--limit", "@fake/v100x1-2004-offline",
                         QWEN27B_CACHE=str(tmp_path))
    out = result.stderr
    assert "managed Python from the controller cache" in " ".join(out.split()), out[-3000:]
    assert "Python 3.12 comes from GitHub" not in out and "fetch: Python" not in out
    install = next(line for line in out.splitlines() if "uv python install" in line)
    assert "UV_PYTHON_INSTALL_MIRROR=file:///opt/qwen27b/" in install
    mirror = shlex.split(install.split("$ ", 1)[1])[1].split("=", 1)[1]
    assert "python build (from the controller cache)" in out and f"{mirror[len('file://'):]}/{ARCHIVE}" in out


def test_without_a_cached_build_the_plan_says_github_and_uv_gets_no_mirror():
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "-v", "--limit", "@fake/v100x1-2004-offline")
    out = " ".join(result.stderr.split())
    assert "uv's managed Python from GitHub" in out and "controller cache [" not in out
    assert "WARNING: Python 3.12 comes from GitHub" in out
    install = next(line for line in result.stderr.splitlines() if "uv python install" in line)
    assert "UV_PYTHON_INSTALL_MIRROR" not in install


def test_a_host_that_showed_it_cannot_reach_github_is_warned(tmp_path):
    """`qwen27b reach` records what failed (reports/reach.json, logins stripped); the gate warns
    that host when uv would fetch Python from GitHub, with no lab mirror in its data."""
    from qwen27b.controller import reachrecord
    record = reachrecord.save({"@fake/v100x1-2004": ["https://github.com/1CatAI/x.whl", "https://u:pw@pi.lab/simple/"],
                               "@fake/other": []}, tmp_path / "reach.json")
    assert reachrecord.failed_urls("@fake/v100x1-2004", record) == ["https://github.com/1CatAI/x.whl",
                                                                    "https://u:***@pi.lab/simple/"]
    assert reachrecord.failed_urls("@fake/other", record) == [] and "pw" not in record.read_text()
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "-v", "--limit", "@fake/v100x1-2004",
                         QWEN27B_REPORTS=str(tmp_path))
    assert "WARNING: Python 3.12 comes from GitHub (uv downloads python-build-standalone on the host), but this host " \
           "could not reach github.com" in result.stderr, result.stderr[-3000:]


def test_the_apt_mirror_stands_for_both_apt_hosts_and_is_fetched_first():
    """qwen27b_apt_mirror replaces archive.ubuntu.com's and developer.download.nvidia.com's scheme and
    host (their paths kept); the plan and `qwen27b reach` list it before the other fetches; its login
    shown as ***. Without it the Ubuntu archive is the host's own business (not listed)."""
    s = settings(apt_mirror="http://u:pw@apt.lab:8800/m")
    assert sources.apt_url(SRC["ubuntu_archive"]["base"], s) == "http://u:pw@apt.lab:8800/m/ubuntu/"
    assert sources.cuda_repo_url(SRC, "ubuntu2204", s) == "http://u:pw@apt.lab:8800/m/compute/cuda/repos/ubuntu2204/x86_64/"
    assert sources.cuda_repo_url(SRC, "ubuntu2204", settings()) == \
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
    profile = load_stack()["profiles"]["sm70"]
    lines = sources.fetch_lines(sources.fetches(SRC, profile, s, None, [], "ubuntu2204"))
    assert lines[:2] == ["fetch: Ubuntu archive (apt) <- http://u:***@apt.lab:8800/m/ubuntu/",
                         "fetch: CUDA apt repository <- http://u:***@apt.lab:8800/m/compute/cuda/repos/ubuntu2204/x86_64/"]
    assert not any("apt" in f.what.lower() for f in sources.fetches(SRC, profile, settings(), None, []))
    files = sources.apt_mirror_files(s, SRC, "focal", None, "/etc/apt/qwen27b-mirror.list", "/etc/apt/qwen27b-mirror.list.d")
    assert files.sources == ("deb http://apt.lab:8800/m/ubuntu/ focal main restricted universe multiverse\n"
                             "deb http://apt.lab:8800/m/ubuntu/ focal-updates main restricted universe multiverse\n"
                             "deb http://apt.lab:8800/m/ubuntu/ focal-security main restricted universe multiverse\n")
    assert files.conf == ('Dir::Etc::SourceList "/etc/apt/qwen27b-mirror.list";\n'
                          'Dir::Etc::SourceParts "/etc/apt/qwen27b-mirror.list.d";\n')
    assert files.auth == "machine apt.lab:8800 login u password pw\n"
    assert sources.apt_mirror_files(settings(apt_mirror="https://apt.lab/"), SRC, "jammy", None, "/l", "/d").auth is None


def test_the_apt_mirror_plan_writes_its_files_and_keeps_its_login_off_the_plan():
    """The golden host v100x1-2004-offline-apt through the real dry run: the list, the empty parts dir,
    the 0600 login, then the conf naming them, then `apt-get update`, all before the first install."""
    result = run_pyinfra("inventory/recorded.py", "deploy.py", "--dry", "-y", "--limit", "@fake/v100x1-2004-offline-apt")
    out = result.stderr
    assert "lab-apt-pw" not in out and "fetch: Ubuntu archive (apt) <- http://apt:***@192.168.10.5:8800/ubuntu/" in out
    order = [out.index(text) for text in ("apt's sources: qwen27b_apt_mirror", "/etc/apt/qwen27b-mirror.list.d (empty",
                                          "apt's login to qwen27b_apt_mirror (apt_auth.conf, 0600)",
                                          "apt reads qwen27b_apt_mirror's list only", "apt-get update (from qwen27b_apt_mirror)",
                                          "base packages")]
    assert order == sorted(order), out[-3000:]


def test_a_failed_download_ends_with_one_line_naming_the_source_and_the_key(tmp_path):
    """The command as planned, run for real by a shell: a client that fails (here a stand-in `hf` that
    prints a proxy's error page and exits 7) leaves the deploy a last line the run summary shows."""
    import subprocess
    from qwen27b.plan.hubdownload import failed_download, hub_download_command
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hf").write_text("#!/bin/sh\necho '<html>500 Unable to connect</html>' >&2\nexit 7\n")
    (tmp_path / "bin" / "hf").chmod(0o755)
    entry = {"id": "org/m", "revision": "r1"}
    command = hub_download_command("", str(tmp_path), entry, str(tmp_path / "m")) + " || " + \
        failed_download("the hub at http://hf.lab:8090", "qwen27b_hf_endpoint", entry)
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("qwen27b: the download of org/m@r1 from the hub at http://hf.lab:8090 failed") and \
        "point qwen27b_hf_endpoint" in last
