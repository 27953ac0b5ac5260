"""CUDA toolkit from NVIDIA's repo (cuda-keyring, pinned toolkit, PATH file), only where the vLLM
build needs a compiler (the V100 build 1Cat 1.5.1 does: its TileLang kernels are built at first use;
the service's CUDA_HOME names the toolkit, planner.py).
"""

from __future__ import annotations

import shlex
import urllib.parse
from io import StringIO

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, server

from qwen27b.plan import sources
from qwen27b.plan.gate import Decision
from qwen27b.plan.urlsecret import url_has_password
from qwen27b.plan.lifecycle import APT_MIRROR_AUTH

from ._common import fetch_prefix, note
from ._common import apt_install, apt_lock_option


CUDA_PROFILE = "/etc/profile.d/qwen27b-cuda.sh"


def cuda_profile_script(cuda_entry: dict) -> str:
    """The login shells' PATH file for the stack's toolkit."""
    cuda_dir = shlex.quote(f"/usr/local/cuda-{cuda_entry['toolkit']}")  # allow-listed: digits and a dot
    return (f"export PATH={cuda_dir}/bin:$PATH\n"
            f"export LD_LIBRARY_PATH={cuda_dir}/lib64${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n")


def cuda(decision: Decision) -> None:
    cuda_entry = decision.stack.profile.get("cuda")
    if not cuda_entry:
        note("cuda: skipped - this profile uses no GPU")
        return
    if not cuda_entry.get("needed_by_vllm"):
        note(f"cuda: {cuda_entry['package']} not installed - the {decision.stack.profile['vllm']['build']} vLLM build "
             f"ships its CUDA {cuda_entry['toolkit']} runtime in its wheels and needs no compiler "
             "(stack key cuda.needed_by_vllm)")
        return
    # NVIDIA's repository, or qwen27b_apt_mirror's copy (its login from apt's 0600 auth file, never argv)
    url = sources.cuda_repo_url(decision.stack.fetch_sources, decision.os_row["cuda_repo"], decision.settings)
    repo, netrc = url.rstrip("/"), ""
    if url_has_password(url):
        parts = urllib.parse.urlsplit(url)
        repo = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
        netrc = f"--netrc-file {APT_MIRROR_AUTH} "
    keyring = cuda_entry["keyring_deb"]
    if "cuda-keyring" not in (host.get_fact(DebPackages) or {}):
        # curl, not files.download: the proxy (with its password) must go in the environment, not argv
        digest = decision.os_row.get("cuda_keyring_sha256")
        local = shlex.quote(f"/tmp/{keyring}")
        server.shell(name=f"download {keyring}", commands=[
            f"{fetch_prefix(decision)}curl -fsSL {netrc}{shlex.quote(repo + '/' + keyring)} -o {local}",
            *([f"echo {shlex.quote(digest + '  /tmp/' + keyring)} | sha256sum -c --quiet -"] if digest else [])])
        server.shell(name="install cuda-keyring (signed-by keyring for NVIDIA's repo)",
                     # apt-get, not dpkg -i: dpkg fails at once on the lock unattended-upgrades holds
                     commands=[f"DEBIAN_FRONTEND=noninteractive apt-get -y {apt_lock_option()} install "
                               f"{shlex.quote('/tmp/' + keyring)}"])
    apt_install("CUDA toolkit", [cuda_entry["package"]])
    files.put(name="CUDA on PATH for login shells", dest=CUDA_PROFILE, mode="0644",
              src=StringIO(cuda_profile_script(cuda_entry)))

