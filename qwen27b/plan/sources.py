"""Where every fetch of a host goes (issue 30): the default sources in the stack file's
`fetch_sources`, and the host data that points each at a source a lab can reach.

Pure: the plan's rows and notes, the roles' commands and `qwen27b reach` ask the same functions,
so the plan says where a fetch goes and the command fetches from there. The controller cache's
Python builds are read by the caller (controller/artifacts.python_builds) and passed in.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from qwen27b.plan.hostdata import Settings
from qwen27b.plan.urlsecret import redact_url

# uv's Python download URLs: <github>/<python_builds.path>/<release>/<archive>; an archive name
# cpython-3.12.12+20251014-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz
PYTHON_ARCHIVE = re.compile(r"^cpython-(\d+\.\d+)\.\d+\+(\d{8})-x86_64-unknown-linux-gnu-install_only(?:_stripped)?\.tar\.gz$")
CACHE_LAYOUT = "$QWEN27B_CACHE/python/<release>/<archive>"  # as `qwen27b mirror --python` lays a mirror out


@dataclass(frozen=True)
class PythonSource:
    """Where uv's Python build comes from. `kind`: controller | python_mirror | release_mirror |
    github; `mirror`: UV_PYTHON_INSTALL_MIRROR's value when a setting gives it (else None: the
    controller kind's is the pushed dir, github's is uv's own default); `archives`: the cached
    builds pushed (<release>/<archive>)."""

    kind: str
    shown: str
    mirror: str | None = None
    archives: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fetch:
    """One source a host fetches from: what comes from it, the URL (credentials included: show
    it with redact_url), and the key that points it elsewhere."""

    what: str
    url: str
    fix: str


def github_url(url: str, settings: Settings, src: dict) -> str:
    """A github.com URL as fetched: under qwen27b_release_mirror when set (hostdata refused one
    carrying a login, since this URL reaches argv)."""
    base = src["github"]["base"]
    if settings.release_mirror and url.startswith(base):
        return settings.release_mirror.rstrip("/") + "/" + url[len(base):]
    return url


def cached_archives(paths: list[str], version: str) -> tuple[str, ...]:
    """The controller cache's builds of this Python (`<release>/<archive>` relative to its python
    dir), newest release first: what the host's uv finds under the pushed mirror dir."""
    out = []
    for rel in paths:
        release, _, name = rel.partition("/")
        match = PYTHON_ARCHIVE.match(name)
        if match and match[1] == version and match[2] == release:
            out.append(rel)
    return tuple(sorted(out, reverse=True))


def python_source(settings: Settings, src: dict, version: str, cached: tuple[str, ...] = (),
                  downloaded: tuple[str, ...] = ()) -> PythonSource:
    """The controller cache when it holds this version's build (pushed, then uv reads it from a
    file:// dir); else qwen27b_python_mirror; else the release mirror; else GitHub. `downloaded`:
    the cached builds the controller fetched itself (artifacts.python_downloaded), said so."""
    archives = cached_archives(list(cached), version)
    if archives:
        how = "downloaded by the controller" if archives[0] in downloaded else "put there by hand"
        return PythonSource("controller", f"from the controller cache ({archives[0]}, {how}, pushed)", archives=archives)
    if settings.python_mirror:
        return PythonSource("python_mirror", f"from qwen27b_python_mirror {redact_url(settings.python_mirror)}",
                            settings.python_mirror)
    if settings.release_mirror:
        url = github_url(src["github"]["base"] + src["python_builds"]["path"],
                         settings, src)
        return PythonSource("release_mirror", f"from qwen27b_release_mirror {url}", url)
    return PythonSource("github", "from GitHub (python-build-standalone, downloaded by uv on the host)")


def lab_mirrors(settings: Settings) -> list[str]:
    """The keys that send this host's other fetches to lab sources: the sign of a lab that cannot
    reach the internet (the issue's host: wheel and model mirrors set, no Python mirror)."""
    keys = [k for k in ("wheel_mirror", "hf_endpoint", "modelscope_endpoint", "pypi_index", "torch_index")
            if getattr(settings, k)]
    if settings.model_source in ("mirror", "controller"):
        keys.append(f"model_source: {settings.model_source}")
    return ["qwen27b_" + k for k in keys]


def python_warning(settings: Settings, source: PythonSource, version: str, unreachable: bool = False) -> str | None:
    """The gate's warning when uv will download Python from GitHub on a host that has shown it
    cannot reach it (`unreachable`, from `qwen27b reach`) or whose data sends everything else to
    lab mirrors."""
    if source.kind != "github":
        return None
    mirrors = lab_mirrors(settings)
    if not unreachable and not mirrors:
        return None
    why = ("this host could not reach github.com" if unreachable else
           f"{', '.join(mirrors)} send{'s' if len(mirrors) == 1 else ''} the other fetches to lab sources")
    return (f"Python {version} comes from GitHub (uv downloads python-build-standalone on the host), but {why}: the "
            f"toolchain stops there if GitHub is out of reach. Fix: set qwen27b_python_mirror or qwen27b_release_mirror, "
            f"or put the build in the controller cache at {CACHE_LAYOUT} (`uv python list --show-urls` names it)")


def controller_fetches_python(settings: Settings, source: PythonSource, version: str, unreachable: bool = False) -> bool:
    """Whether the controller downloads uv's Python build into its cache for this host (once per
    run, artifacts.fetch_python_build): only where the host would fetch it from GitHub and the gate
    warns it may not reach it (python_warning). A host that reaches GitHub is left as before."""
    return python_warning(settings, source, version, unreachable) is not None


def github_failed(failed: tuple[str, ...], src: dict) -> bool:
    """Whether a host's last reach check failed on a GitHub URL (the wheel's or Python's)."""
    return any(url.startswith(src["github"]["base"]) for url in failed)


def torch_index(profile: dict, settings: Settings) -> str | None:
    """torch's index as fetched: qwen27b_torch_index in place of the stack's, where the stack has one."""
    url = (profile.get("torch") or {}).get("index_url")
    return (settings.torch_index or url) if url else None


def model_source(entry: dict, settings: Settings) -> str:
    return settings.model_source or entry.get("default_source", "hub")


def hub_base(settings: Settings, src: dict) -> str:
    return settings.hf_endpoint or src["hub"]["base"]


def modelscope_base(settings: Settings, src: dict) -> str:
    return (settings.modelscope_endpoint or src["modelscope"]["base"]).rstrip("/")


def fetch_clients(rs, settings: Settings) -> list[str]:
    """The download clients the release venv needs besides vLLM for the source of the checkpoints a
    resolved stack `rs` serves (model and draft; the `modelscope` CLI; `hf` comes with vLLM):
    requirements as the stack pins them."""
    clients = rs.tools.get("fetch_clients") or {}
    models = [rs.model] + ([rs.draft] if rs.draft else [])
    if any(model_source(entry, settings) == "modelscope" for entry in models):
        return [clients["modelscope"]["requirement"]]
    return []


def apt_url(default: str, settings: Settings) -> str:
    """An apt source's URL as fetched: qwen27b_apt_mirror in place of the default's scheme and host
    (the path kept: <mirror>/ubuntu/, <mirror>/compute/cuda/repos/...), login included."""
    if not settings.apt_mirror:
        return default
    return settings.apt_mirror.rstrip("/") + "/" + urllib.parse.urlsplit(default).path.lstrip("/")


def cuda_repo_url(src: dict, repo: str, settings: Settings) -> str:
    """NVIDIA's CUDA repository for an OS row (`ubuntu2204`), under qwen27b_apt_mirror when set."""
    return apt_url(f"{src['cuda_repo']['base']}{repo}/x86_64/", settings)


@dataclass(frozen=True)
class AptMirror:
    """What the toolchain role writes for qwen27b_apt_mirror: apt.conf lines that make apt read
    only qwen27b's source list (and an empty parts dir), that list (no login: the file is
    world-readable), and the apt_auth.conf(5) entry holding a login (None without one)."""

    conf: str
    sources: str
    auth: str | None


def apt_mirror_files(settings: Settings, src: dict, codename: str, cuda_repo: str | None,
                     source_list: str, source_parts: str) -> AptMirror:
    """The Ubuntu archive's suites for `codename` (the stack's pockets and components), and NVIDIA's
    repository (signed by the key cuda-keyring installs) where a toolkit is installed, all from the
    mirror. hostdata allowed a plain base URL only (no `#`, `[`, quotes or spaces)."""
    ubuntu = src["ubuntu_archive"]
    parts = urllib.parse.urlsplit(apt_url(ubuntu["base"], settings))
    userinfo, _, hostport = parts.netloc.rpartition("@")

    def bare(url: str) -> str:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(netloc=hostport))

    components = " ".join(ubuntu["components"])
    lines = [f"deb {bare(apt_url(ubuntu['base'], settings))} {codename}{pocket} {components}" for pocket in ubuntu["pockets"]]
    if cuda_repo:
        lines.append(f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                     f"{bare(cuda_repo_url(src, cuda_repo, settings))} /")
    conf = f'Dir::Etc::SourceList "{source_list}";\nDir::Etc::SourceParts "{source_parts}";\n'
    auth = None
    if userinfo:
        user, _, password = (urllib.parse.unquote(p) for p in userinfo.partition(":"))
        auth = f"machine {hostport} login {user}" + (f" password {password}" if password else "") + "\n"
    return AptMirror(conf, "".join(line + "\n" for line in lines), auth)


def fetches(src: dict, profile: dict, settings: Settings, python: PythonSource | None,
            models: list[dict], cuda_repo: str | None = None, wheels: bool = True) -> list[Fetch]:
    """Every source this host's deploy fetches from over the network, in the order it does (the
    controller's pushes aside): what `qwen27b reach` checks and the plan lists. `python`: None
    when the host already has it; `models`: the checkpoints to download; `cuda_repo`: the OS
    row's, when a toolkit is installed; `wheels`: False when the release venv holds the build."""
    out = []
    if settings.apt_mirror:
        out.append(Fetch("Ubuntu archive (apt)", apt_url(src["ubuntu_archive"]["base"], settings), "qwen27b_apt_mirror"))
    if cuda_repo:
        out.append(Fetch("CUDA apt repository", cuda_repo_url(src, cuda_repo, settings), "qwen27b_apt_mirror"))
    if python is not None and python.kind != "controller":
        base = python.mirror or src["github"]["base"] + src["python_builds"]["path"]
        out.append(Fetch(f"Python {profile['python']['version']} (uv)", base.rstrip("/") + "/",
                         "qwen27b_python_mirror, qwen27b_release_mirror or the controller cache"))
    vllm = profile["vllm"]
    if wheels and settings.wheel_mirror:
        out.append(Fetch("wheels (lab mirror)", settings.wheel_mirror, "qwen27b_wheel_mirror"))
    elif wheels and not settings.wheelhouse_dir and (vllm["build"] != "cpu" or settings.pypi_index):
        index = torch_index(profile, settings)
        if index:
            out.append(Fetch("torch index", index.rstrip("/") + "/", src["torch"]["key"]))
        if vllm.get("url"):
            out.append(Fetch(f"{vllm['dist']} wheel", github_url(vllm["url"], settings, src), src["github"]["key"]))
        out.append(Fetch("PyPI (the other wheels)", settings.pypi_index or src["pypi"]["base"], src["pypi"]["key"]))
    for entry in models:
        where = model_source(entry, settings)
        if where == "hub":
            out.append(Fetch(f"{entry['id']} (hub)", hub_base(settings, src).rstrip("/") + f"/api/models/{entry['id']}",
                             src["hub"]["key"]))
        elif where == "modelscope":
            out.append(Fetch(f"{entry['id']} (ModelScope)", modelscope_base(settings, src) + f"/api/v1/models/{entry['id']}",
                             src["modelscope"]["key"]))
        elif where == "mirror" and settings.model_mirror:
            out.append(Fetch(f"{entry['id']} (mirror)", settings.model_mirror, "qwen27b_model_mirror"))
    return out


def fetch_lines(fetches_: list[Fetch]) -> list[str]:
    """The plan's "where every fetch goes" lines (URLs without their passwords)."""
    return [f"fetch: {f.what} <- {redact_url(f.url)}" for f in fetches_]
