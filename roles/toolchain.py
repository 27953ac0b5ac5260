"""Toolchain: base packages, the service user, the directory layout, Python and the release venv.

Python 3.12 is not in Ubuntu 20.04/22.04 (3.8/3.10): it comes from uv's managed Python, with the
uv binary pushed from the controller cache (and UV_PYTHON_INSTALL_MIRROR for air-gapped labs); every
profile gets uv, the vllm role installs the wheels with it.
The venv lives in a versioned release dir, so an upgrade never touches the running release.
"""

from __future__ import annotations

import posixpath
import shlex
import urllib.parse
from io import StringIO

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.operations import files, server

from qwen27b.controller import factcache
from qwen27b.controller import reachrecord
from qwen27b.controller.artifacts import (fetch_python_build, python_builds, python_builds_dir, uv_binary,
                                            uv_path)
from qwen27b.plan import sources
from qwen27b.plan.gate import Decision
from qwen27b.plan.installs import host_fetches
from qwen27b.plan.modelsdir import MODELS_LINK_HINT
from qwen27b.plan.lifecycle import (APT_MIRROR_AUTH, APT_MIRROR_CONF, APT_MIRROR_LIST, APT_MIRROR_PARTS, APT_PROXY_AUTH,
                                    APT_PROXY_CONF)
from qwen27b.controller.host_facts import DirectoryStates, ServiceUser
from qwen27b.controller.operations import directories, secret_file

from ._common import (apt_install, apt_lock_timeout, dry_run, fetch_prefix, note, python_to_fetch, reach_notes,
                      release_dir, release_venv, service_user, shell_word, url_env_file, url_env_text, uv_on_host)


def base_packages(decision: Decision) -> list[str]:
    packages = list(decision.stack.profile["packages"])
    if decision.driver is not None and decision.driver.header_packages:
        # DKMS builds the NVIDIA module against the running kernel's headers (the gate checked apt has them).
        packages.extend(decision.driver.header_packages)
    return packages


def owned_directories(decision: Decision) -> list[tuple[str, str, str, str]]:
    p, user = decision.stack.layout, decision.stack.layout.service_user
    return [
        (p.root, "root", "root", "0755"),
        (p.releases, "root", "root", "0755"),
        (p.bin, "root", "root", "0755"),
        (p.host_cache, "root", "root", "0755"),
        (p.state, user, user, "0750"),
        (p.models, "root", user, "0750"),  # root writes weights; the service only reads them
        (p.cache, user, user, "0750"),  # vLLM / torch / triton caches
        (p.config, "root", "root", "0755"),
    ]


def _push_uv(decision: Decision) -> None:
    uv, version = uv_on_host(decision), decision.stack.tools["uv"]["version"]
    if dry_run() and not uv_path(version).exists():
        # no cache path here: the plan reads the same on every controller ($QWEN27B_CACHE says where)
        note(f"toolchain: will fetch uv {version} from PyPI into the controller cache and push "
             f"it to {uv} (a dry run fetches nothing)")
    else:
        files.put(name="uv binary (from the controller cache)", src=str(uv_binary(version)),
                  dest=uv, user="root", group="root", mode="0755")


def _python(decision: Decision) -> str:
    """Queue what makes the profile's Python exist; return the command prefix that creates a venv."""
    py, at = decision.stack.profile["python"], decision.stack.layout
    _push_uv(decision)
    if py["route"] == "system":
        return f"{shlex.quote('python' + py['version'])} -m venv"
    uv = uv_on_host(decision)
    env = f"{fetch_prefix(decision)}UV_PYTHON_INSTALL_DIR={at.python}"
    have = decision.facts.pythons.get(py["version"])
    if not have:
        env += _python_mirror(decision)
    managed, python = _venv_python(decision, env, uv)
    return f"{env} {uv} venv {managed} --seed --python {shlex.quote(python)}"


def _python_mirror(decision: Decision) -> str:
    """UV_PYTHON_INSTALL_MIRROR as the plan's python row said (sources.python_source, asked with
    the same controller cache): the cached build pushed into a file:// dir uv reads as its mirror,
    a mirror setting, or nothing (uv's GitHub default)."""
    version = decision.stack.profile["python"]["version"]
    source = sources.python_source(decision.settings, decision.stack.fetch_sources, version, python_builds())
    _controller_python_note(decision, source)
    if source.kind == "controller":
        pushed = f"{decision.stack.layout.host_cache}/python"
        release_archive = source.archives[0]
        files.put(name="python build (from the controller cache)", src=str(python_builds_dir() / release_archive),
                  dest=f"{pushed}/{release_archive}", user="root", group="root", mode="0644")
        return f" UV_PYTHON_INSTALL_MIRROR=file://{pushed}"
    if source.kind == "python_mirror":
        return f" UV_PYTHON_INSTALL_MIRROR={shell_word(decision.settings, 'python_mirror')}"
    if source.kind == "release_mirror":  # hostdata refused a release mirror with a login
        return f" UV_PYTHON_INSTALL_MIRROR={shlex.quote(source.mirror)}"
    return ""


def _controller_python_note(decision: Decision, source: sources.PythonSource) -> None:
    """What the controller did about uv's Python build for a host that may not reach GitHub
    (_common.python_to_fetch): in a dry run, what a deploy will try; after a failed download, why,
    and the fixes. A build in the cache needs no note: the python row says where it came from."""
    version, uv_version = decision.stack.profile["python"]["version"], decision.stack.tools["uv"]["version"]
    if source.kind != "github" or not python_to_fetch(decision, tuple(reachrecord.failed_urls(host.name))):
        return
    if dry_run():
        note(f"toolchain: a deploy first downloads Python {version}'s build (the one uv {uv_version} pins, sha256 "
             f"checked) from GitHub into the controller cache and pushes it; a dry run fetches nothing. Where the "
             f"controller cannot reach GitHub either, uv fetches it on the host, as the warning says", always=True)
        return
    _, why = fetch_python_build(uv_version, version)
    note(f"toolchain: the controller could not download Python {version}'s build into its cache ({why}): uv "
         f"fetches it from GitHub on the host. Fix: put it at {sources.CACHE_LAYOUT}, or set qwen27b_python_mirror "
         f"or qwen27b_release_mirror", always=True)


def _venv_python(decision: Decision, env: str, uv: str) -> tuple[str, str]:
    """uv's flags naming the interpreter the plan's python row promised: the host's own (e.g. Ubuntu
    24.04's /usr/bin/python3.12) with --no-managed-python, so uv never downloads one instead; else
    uv's managed Python, installed first."""
    version, at = decision.stack.profile["python"]["version"], decision.stack.layout
    have = decision.facts.pythons.get(version)
    if have and not have.startswith(at.python + "/"):
        return "--no-managed-python", have
    if not have:
        server.shell(name="python (uv managed)", commands=[f"{env} {uv} python install --managed-python {shlex.quote(version)}"])
    return "--managed-python", version


def apt_proxy_files(url: str) -> tuple[str, str | None]:
    """apt's side of qwen27b_http_proxy: the apt.conf lines, with the URL stripped of any credentials
    (apt.conf files are world-readable), and for a URL with user:password the apt_auth.conf(5)
    entry that holds them (root, 0600; apt reads proxy logins there since 1.5, Ubuntu 18.04)."""
    parts = urllib.parse.urlsplit(url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    conf = f'Acquire::http::Proxy "{bare}";\nAcquire::https::Proxy "{bare}";\n'
    if not userinfo:
        return conf, None
    user, _, password = (urllib.parse.unquote(p) for p in userinfo.partition(":"))
    return conf, f"machine {hostport} login {user}" + (f" password {password}" if password else "") + "\n"


def _apt_proxy(decision: Decision) -> None:
    """apt through qwen27b_http_proxy (an apt.conf file, not the environment: pyinfra's apt
    operations take no env file, and unattended-upgrades should use the same proxy); the files go
    when the key goes."""
    proxy = decision.settings.http_proxy
    conf, auth = apt_proxy_files(proxy) if proxy else (None, None)
    if conf:
        files.put(name="apt through qwen27b_http_proxy", src=StringIO(conf), dest=APT_PROXY_CONF, user="root",
                  group="root", mode="0644", create_remote_dir=False)
    if auth:
        secret_file(name="apt's login to the proxy (apt_auth.conf, 0600)", dest=APT_PROXY_AUTH, content=auth)
    for path, wanted in ((APT_PROXY_CONF, conf), (APT_PROXY_AUTH, auth)):
        if not wanted and host.get_fact(File, path=path):
            files.file(name=f"remove {path} (no qwen27b_http_proxy)", path=path, present=False)


def _apt_mirror(decision: Decision) -> None:
    """apt from qwen27b_apt_mirror only (sources.apt_mirror_files): qwen27b's source list in place of
    the host's (Dir::Etc::SourceList and SourceParts; the host's own files are left untouched), the
    list and its empty parts dir written before the conf that names them, a login in apt_auth.conf
    (0600). The conf goes first when the key goes, then the files it named."""
    mirror, facts = decision.settings.apt_mirror, decision.facts
    if mirror and facts.os.get("id") != "ubuntu":
        note(f"apt: qwen27b_apt_mirror is for Ubuntu's archive; this host runs {facts.os.get('id')}: apt keeps its own "
             "sources", always=True)
        mirror = None
    if not mirror:
        if host.get_fact(File, path=APT_MIRROR_CONF):
            files.file(name=f"remove {APT_MIRROR_CONF} (no qwen27b_apt_mirror)", path=APT_MIRROR_CONF, present=False)
            files.file(name=f"remove {APT_MIRROR_LIST}", path=APT_MIRROR_LIST, present=False)
            files.directory(name=f"remove {APT_MIRROR_PARTS}", path=APT_MIRROR_PARTS, present=False)
            files.file(name=f"remove {APT_MIRROR_AUTH}", path=APT_MIRROR_AUTH, present=False)
            server.shell(name="apt-get update (from the host's own sources again)",
                         commands=[f"{fetch_prefix(decision)}apt-get update"])
        return
    cuda = decision.stack.profile.get("cuda") or {}
    repo = decision.os_row.get("cuda_repo") if cuda.get("needed_by_vllm") else None
    apt = sources.apt_mirror_files(decision.settings, decision.stack.fetch_sources, facts.os.get("codename") or "",
                                   repo, APT_MIRROR_LIST, APT_MIRROR_PARTS)
    changed = files.put(name="apt's sources: qwen27b_apt_mirror", src=StringIO(apt.sources), dest=APT_MIRROR_LIST,
                        user="root", group="root", mode="0644", create_remote_dir=False).will_change
    files.directory(name=f"{APT_MIRROR_PARTS} (empty: the host's other sources are not read)", path=APT_MIRROR_PARTS,
                    user="root", group="root", mode="0755")
    if apt.auth:
        secret_file(name="apt's login to qwen27b_apt_mirror (apt_auth.conf, 0600)", dest=APT_MIRROR_AUTH, content=apt.auth)
    elif host.get_fact(File, path=APT_MIRROR_AUTH):
        files.file(name=f"remove {APT_MIRROR_AUTH} (the mirror has no login now)", path=APT_MIRROR_AUTH, present=False)
    changed |= files.put(name="apt reads qwen27b_apt_mirror's list only", src=StringIO(apt.conf), dest=APT_MIRROR_CONF,
                         user="root", group="root", mode="0644", create_remote_dir=False).will_change
    if changed:  # the index of the old sources may be fresher than the apt roles' cache_time: read the mirror's now
        server.shell(name="apt-get update (from qwen27b_apt_mirror)", commands=[f"{fetch_prefix(decision)}apt-get update"])


def toolchain(decision: Decision) -> None:
    at, user = decision.stack.layout, decision.stack.layout.service_user
    factcache.prefetch([(DebPackages, {}), (ServiceUser, {"user": user}),
                        (DirectoryStates, {"paths": [posixpath.normpath(d[0]) for d in owned_directories(decision)]}),
                        (File, {"path": f"{release_venv(decision)}/bin/python"}),
                        (File, {"path": APT_PROXY_AUTH}), (File, {"path": APT_MIRROR_CONF}),
                        (File, {"path": APT_MIRROR_AUTH})]
                       + factcache.put_reads(at.uv)
                       + (factcache.put_reads(APT_PROXY_CONF, create_remote_dir=False) if decision.settings.http_proxy
                          else [(File, {"path": APT_PROXY_CONF})]))  # one round trip for what this role reads
    _apt_proxy(decision)  # before the first apt command
    _apt_mirror(decision)
    note(f"apt: every install waits up to {apt_lock_timeout()} s for the dpkg lock (unattended-upgrades holds it on "
         "a first boot; apt prints 'Waiting for cache lock'), then fails naming the process that holds it "
         f"{decision.stack.cite('apt-lock-timeout')}")
    for line in sources.fetch_lines(host_fetches(decision, python_builds())):
        note(line)  # where every fetch goes (issue 30): `qwen27b reach INVENTORY` checks each from the host
    for line in reach_notes(host.name):
        note(line, always=True)  # on --dry, the gate checked each from the host (preflight.dry_reach)
    apt_install("base packages", base_packages(decision))
    service_user(user, at.state)
    directories(name="qwen27b directories (owner, group, mode)", specs=[list(d) for d in owned_directories(decision)],
                hints={posixpath.normpath(decision.stack.layout.models): MODELS_LINK_HINT})
    if url_env_text(decision.settings):  # before the first command that sources it
        secret_file(name="mirror/proxy URLs with credentials (0600, never on a command line)",
                    dest=url_env_file(decision), content=url_env_text(decision.settings))
    make_venv = _python(decision)
    venv = release_venv(decision)
    if host.get_fact(File, path=f"{venv}/bin/python") is None:
        files.directory(name="release dir", path=release_dir(decision),
                        user="root", group="root", mode="0755")
        server.shell(name="release venv", commands=[f"{make_venv} {shlex.quote(venv)}"])
    else:
        note(f"toolchain: release venv {venv} exists")
