"""Supply-chain properties of every command the deploy plans for a host.

The plans come from tests/golden/<host>.txt (test_plans.py keeps them equal to the real
`pyinfra inventory/recorded.py deploy.py --dry` of the recorded hosts) and from one real dry run of
the routes no recorded host takes: NVIDIA's CUDA repo (stack key cuda.needed_by_vllm), a wheel
whose sha256 is pinned, PyPI's dflash CLI. Checked on every planned command:

- no download is piped into a shell (`curl ... | sh`, `bash <(wget ...)`, `sh -c "$(curl ...)"`);
- no `apt-key`, no unauthenticated apt; any apt source line carries signed-by=;
- every download is verified by sha256, or by the tool that fetches it (apt's signatures, uv's
  pinned hashes). Where that is not true today, the route is an xfail(strict) test that names
  the gap, so it turns red the day the gap closes (and the mark must go).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tests.support.paths import ROOT, TESTS
from tests.support.plan_text import _kind, parse_plans

GOLDEN = TESTS / "golden"
VARIANTS = """\
from inventory.recorded import _fake
hosts = [
    ('@fake/cuda-repo', {**_fake('v100x4-2204-fresh')[1], 'qwen27b_dflash_cli': True,
                         'qwen27b_stack_overrides': {'cuda': {'needed_by_vllm': True}}}),
    ('@fake/pinned-wheel', {**_fake('v100x1-2004')[1], 'qwen27b_stack_overrides': {'vllm': {'sha256': 'ab' * 32}}}),
]
"""


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, list[tuple[str, list[str]]]]:
    out = {}
    for golden in sorted(GOLDEN.glob("*.txt")):
        out.update(parse_plans(golden.read_text()))
    inventory = tmp_path_factory.mktemp("security") / "variants.py"
    inventory.write_text(VARIANTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y"], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=300)
    variants = parse_plans(result.stderr)
    assert set(variants) == {"cuda-repo", "pinned-wheel"}, result.stderr[-3000:]
    out.update(variants)
    return out


def commands(plans, hosts=None) -> list[tuple[str, str, int, list[str]]]:
    """(host, operation, index, that operation's commands) for every planned command."""
    return [(host, name, i, cmds) for host, ops in plans.items() if hosts is None or host in hosts
            for name, cmds in ops for i in range(len(cmds))]


def test_plans_are_there_to_check(plans):
    planned = {"v100x4-2204-fresh", "v100x1-2004", "v100x4-converged", "a100x2-2204", "h200", "h100", "h100-b",
               "v100x1-open-loaded",
               "v100x2-open-unloaded", "v100x2-r470", "v100x2-r470-held", "v100x2-mixed", "v100x2-mixed-32gb-only", "v100x4-pg500", "v100x4-newer-kernel", "v100x1-pg500", "v100x2-cuda-drivers",
               "v100x4-converged-8g", "v100x2-16gb",
               "cuda-repo", "pinned-wheel",
               "v100x2-16gb-pair-head", "v100x2-16gb-pair-worker", "v100x4-copies", "v100x4-copies-converged",
               "v100x4-copies-drop-b", "v100x4-copies-to-one", "v100x2-pcie", "v100x4-pcie", "v100x8-sxm2-dgx1", "mixed-3090-v100x2",
               "v100x8-dgx1-tp2-of-4", "mixed-3090-v100x2-copy", "v100x8-dgx1-copies-4x2", "v100x4-data-disk", "v100x2-lab-unit-take-over", "v100x2-ppa-580", "v100x1-secureboot-mok",
               "v100x4-wear-xid79", "v100x4-wear-warn", "v100x4-converged-nopm", "v100x4-power-cap",
               "v100x1-2004-offline", "v100x1-2004-offline-pymirror", "v100x1-2004-lab-sources", "v100x1-2004-offline-apt", "v100x1-2004-modelscope", "debian12-cpu-lab-index"}  # the refused recorded hosts plan nothing
    assert set(plans) == planned and all(plans.values())
    assert sum(len(cmds) for ops in plans.values() for _, cmds in ops) > 200


# --- no download piped into a shell --------------------------------------------------------------

_FETCH = r"(?:curl|wget|fetch)\b"
PIPE_TO_SHELL = re.compile(
    rf"\b{_FETCH}[^;&]*\|\s*(?:sudo\s+(?:-\S+\s+)*)?(?:env\s+(?:\S+=\S+\s+)*)?(?:/\S*/)?(?:ba|da|z|k)?sh\b"
    rf"|<\(\s*{_FETCH}|\$\(\s*{_FETCH}")


@pytest.mark.parametrize("command, piped", [
    ("curl -fsSL https://get.example.sh | sh", True),
    ("wget -qO- https://x.example/install | sudo -E bash", True),
    ("curl -s https://x.example/i.sh | /bin/bash -s -- --yes", True),
    ("bash <(curl -s https://x.example/i.sh)", True),
    ('sh -c "$(curl -fsSL https://x.example/i.sh)"', True),
    ("curl -sSLf https://developer.download.nvidia.com/x.deb -o /tmp/x.deb", False),
    ("( curl -sSLf https://x.example/a -o /tmp/a ) || ( wget -q https://x.example/a -O /tmp/a || ( rm -f /tmp/a ; exit 1 ) )",
     False),
])
def test_the_pipe_to_shell_pattern_itself(command, piped):
    assert bool(PIPE_TO_SHELL.search(command)) == piped


def test_no_download_is_piped_into_a_shell(plans):
    bad = [(h, op, cmds[i]) for h, op, i, cmds in commands(plans) if PIPE_TO_SHELL.search(cmds[i])]
    assert not bad


# --- apt: no apt-key, no unauthenticated sources, signed-by= on every source ------------------------

def test_no_apt_key_and_no_unauthenticated_apt(plans):
    bad = [(h, op, cmds[i]) for h, op, i, cmds in commands(plans)
           if re.search(r"\bapt-key\b|--allow-unauthenticated|trusted=yes|AllowInsecureRepositories|"
                        r"--force-yes|add-apt-repository", cmds[i])]
    assert not bad


APT_SOURCE_LINE = re.compile(r"\bdeb(?:-src)?\s+(?:\[(?P<options>[^\]]*)\]\s+)?(?:https?|ftp)://")


def test_third_party_apt_sources_use_signed_by(plans):
    written = [(h, op, cmds[i]) for h, op, i, cmds in commands(plans) if APT_SOURCE_LINE.search(cmds[i])]
    assert all("signed-by=" in (APT_SOURCE_LINE.search(c)["options"] or "") for _, _, c in written), written
    # No other source file is pushed: the one third-party repo (NVIDIA's CUDA repo) comes from NVIDIA's
    # cuda-keyring package, whose own .list names its keyring with signed-by= (not visible in a plan).
    # qwen27b_apt_mirror's list and conf are the exception, their text checked below (not in a plan either).
    mirror = ("-> /etc/apt/qwen27b-mirror.list", "-> /etc/apt/apt.conf.d/90qwen27b-mirror")
    uploads = [(h, op, cmds[i]) for h, op, i, cmds in commands(plans) if re.search(r"-> /etc/apt/", cmds[i])
               and not cmds[i].endswith(mirror)]
    assert not uploads
    keyring = [c for _, op, i, cmds in commands(plans, {"cuda-repo"}) for c in [cmds[i]]
               if "cuda-keyring_" in c and " install " in c]
    # apt-get, not dpkg -i: it waits for the dpkg lock unattended-upgrades holds on a first boot
    assert keyring == ["DEBIAN_FRONTEND=noninteractive apt-get -y -o DPkg::Lock::Timeout=600 install "
                       "/tmp/cuda-keyring_1.1-1_all.deb"]


def test_the_apt_mirrors_list_signs_nvidias_repo_and_trusts_nothing_else():
    """qwen27b_apt_mirror's list: Ubuntu's suites (signed by the archive key Ubuntu ships) and NVIDIA's
    repository with signed-by=, no trusted=yes, no login (it goes to apt_auth.conf, 0600)."""
    from qwen27b.plan import sources
    from qwen27b.plan.hostdata import settings_for
    from qwen27b.plan.stack import load_stack
    settings = settings_for("h", {"qwen27b_apt_mirror": "https://u:pw@apt.lab/m/"})
    files = sources.apt_mirror_files(settings, load_stack()["fetch_sources"], "jammy", "ubuntu2204", "/l", "/d")
    lines = files.sources.splitlines()
    assert lines[-1] == "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] " \
                        "https://apt.lab/m/compute/cuda/repos/ubuntu2204/x86_64/ /"
    assert all(line.startswith("deb https://apt.lab/m/ubuntu/ jammy") for line in lines[:-1])
    assert "pw" not in files.sources + files.conf and "trusted" not in files.sources
    assert files.auth == "machine apt.lab login u password pw\n"


# --- every download verified by sha256 -------------------------------------------------------------

def _sha256_follows(cmds: list[str], i: int) -> bool:
    return any("sha256sum" in c or "shasum -a 256" in c for c in cmds[i + 1:])


def _pip_url_pinned(cmds: list[str], i: int) -> bool:
    return all("#sha256=" in url for url in re.findall(r"https?://\S+\.whl\S*", cmds[i]))


VERIFIED_BY = {
    # kind: (how a planned command of that kind counts as verified, what verifies it)
    "hub": (_sha256_follows, "the sha256 manifest written right after the download, which later runs verify"),
    "pip-url": (_pip_url_pinned, "pip checks the URL's #sha256= fragment"),
    "pip-index": (lambda cmds, i: "--require-hashes" in cmds[i], "pip --require-hashes"),
    "pip-wheelhouse": (lambda cmds, i: True, "the wheelhouse is pushed from the controller with its sha256 manifest"),
    "uv-python": (lambda cmds, i: True, "uv checks each managed Python against its pinned sha256 (astral-sh/uv#4806)"),
    "apt": (lambda cmds, i: True, "apt verifies the repositories' signatures"),
    "mirror-fetch": (lambda cmds, i: "--manifest" in cmds[i], "qwen27b-fetch checks every file against the manifest"),
    "curl": (_sha256_follows, "a sha256sum check after the download"),
}

ROUTES = [
    pytest.param("hub", None, id="hub-download-then-sha256-manifest"),
    pytest.param("apt", None, id="apt-packages-signed-repos"),
    pytest.param("uv-python", None, id="uv-managed-python"),
    pytest.param("pip-url", {"pinned-wheel"}, id="wheel-url-with-pinned-sha256"),
    # the 1Cat-vLLM 1.5.1 wheel's sha256 is in stack.yaml (issue 49; from the vendor's runtimes.py, verified: false)
    pytest.param("pip-url", None, id="wheel-url-with-the-stacks-default"),
    pytest.param("pip-index", None, id="pip-from-an-index", marks=pytest.mark.xfail(strict=True, reason=(
        "GAP (reported): torch from the PyTorch cu128 index, upstream vllm and PyPI's dflash install by name from an "
        "index, with TLS but without --require-hashes"))),
    # 22.04: the keyring .deb's sha256 is pinned in stack.yaml (os_support); 20.04 has none known (the plan warns)
    pytest.param("curl", {"cuda-repo"}, id="cuda-keyring-deb"),
]


@pytest.mark.parametrize("kind, hosts", ROUTES)
def test_downloads_are_verified_by_sha256(plans, kind, hosts):
    found = [(h, op, i, cmds) for h, op, i, cmds in commands(plans, hosts) if _kind(cmds[i]) == kind]
    assert found, f"no planned {kind} download: this route's check would prove nothing"
    check, what = VERIFIED_BY[kind]
    unverified = [(h, op, cmds[i]) for h, op, i, cmds in found if not check(cmds, i)]
    assert not unverified, f"not verified by {what}: {unverified}"


def test_every_download_is_a_known_route(plans):
    kinds = {(h, _kind(cmds[i])) for h, op, i, cmds in commands(plans)} - {(h, None) for h in plans}
    assert {k for _, k in kinds} <= set(VERIFIED_BY), sorted(kinds)


@pytest.mark.parametrize("exit_code", [0, 1])
def test_the_hub_token_file_is_gone_once_the_download_starts(tmp_path, exit_code):
    """Issue 25: docs/security.md says the hub token is removed after the download, but its 0600 file
    stayed under /etc/qwen27b. The planned command, run by a shell with a stand-in `hf`: the download
    gets HF_TOKEN in its environment (never argv), and the file is gone whether it succeeds or not."""
    from qwen27b.plan.hubdownload import hub_download_command

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    seen = tmp_path / "seen"
    hf = venv / "bin" / "hf"
    hf.write_text(f'#!/bin/sh\necho "$HF_TOKEN|$*|$(ls {tmp_path}/etc)" > {seen}\nexit {exit_code}\n')
    hf.chmod(0o755)
    (tmp_path / "etc").mkdir()
    token = tmp_path / "etc" / "hf-token"
    token.write_text("hf_secret123\n")
    token.chmod(0o600)
    command = hub_download_command("", str(venv), {"id": "org/m", "revision": "abc"}, str(tmp_path / "m"), str(token))
    assert "hf_secret123" not in command
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert result.returncode == exit_code and not token.exists()
    got_token, argv, files_then = seen.read_text().strip().split("|")
    assert got_token == "hf_secret123" and "hf_secret123" not in argv and files_then == ""
    assert hub_download_command("", "/v", {"id": "o/m", "revision": "r"}, "/t") == \
        "HF_HUB_DISABLE_TELEMETRY=1 /v/bin/hf download o/m --revision r --local-dir /t"
