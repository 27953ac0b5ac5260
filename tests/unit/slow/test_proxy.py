"""One proxy setting, qwen27b_http_proxy, for every fetch a host makes: the exact commands planned.

Recorded @fake hosts (V100s and the NVIDIA repo cannot be had here), the real
`pyinfra INVENTORY deploy.py --dry -y -v`: a fresh 22.04 V100 host with every fetching route on
(the hub download, the PyTorch index and the 1Cat wheel URL through uv, uv's managed Python, the
CUDA keyring with curl, PyPI's dflash CLI, apt) and the same host fetching its weights from a lab
mirror. Each fetching command must carry the proxy in its environment (with a password: from the
root-only URL env file, never in argv); apt gets it from an apt.conf file, its login from
apt_auth.conf (0600). The password appears nowhere in the output. Through a real proxy, on a real
host: tests/e2e/test_deploy.py::test_one_proxy_setting_reaches_apt_uv_and_the_fetch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from qwen27b.controller.artifacts import dir_manifest
from qwen27b.onhost.mirror import serve
from roles.toolchain import APT_PROXY_AUTH, APT_PROXY_CONF, apt_proxy_files
from tests.support.plan_text import _kind, parse_plans
from tests.support.paths import ROOT

PASSWORD = "s3cret-proxy-pass"
INVENTORY = """\
from inventory.recorded import _fake
every_route = {{'qwen27b_dflash_cli': True, 'qwen27b_model_source': 'hub',
               'qwen27b_stack_overrides': {{'cuda': {{'needed_by_vllm': True}}}}}}
hosts = [
    ('@fake/with-password', {{**_fake('v100x4-2204-fresh')[1], **every_route, 'qwen27b_http_proxy': {secret!r}}}),
    ('@fake/plain', {{**_fake('v100x4-2204-fresh')[1], **every_route, 'qwen27b_http_proxy': 'http://proxy.lab:3128'}}),
    ('@fake/mirror', {{**_fake('v100x1-2004')[1], 'qwen27b_http_proxy': 'http://proxy.lab:3128',
                       'qwen27b_model_source': 'mirror', 'qwen27b_model_mirror': {mirror!r},
                       # made-up files: a revision of their own (the stack's sha256 pin the real ones)
                       'qwen27b_stack_overrides': {{'model_revision': 'proxy-test', 'draft_revision': 'proxy-test'}}}}),
]
"""
FROM_ENV_FILE = ('. /etc/qwen27b/urls.env && http_proxy="$QWEN27B_HTTP_PROXY" https_proxy="$QWEN27B_HTTP_PROXY" '
                 'HTTP_PROXY="$QWEN27B_HTTP_PROXY" HTTPS_PROXY="$QWEN27B_HTTP_PROXY" no_proxy= NO_PROXY= ')
PLAIN = ("http_proxy=http://proxy.lab:3128 https_proxy=http://proxy.lab:3128 HTTP_PROXY=http://proxy.lab:3128 "
         "HTTPS_PROXY=http://proxy.lab:3128 no_proxy= NO_PROXY= ")


@pytest.fixture(scope="module")
def run():
    work = Path(tempfile.mkdtemp(prefix="qwen27b-proxy-"))
    for name in ("QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@proxy-test",  # the mirror's manifests (the sm70 default, issue 49)
                 "incoai--Qwen3.8-27B-DFlash2@proxy-test"):
        (work / "mirror" / name).mkdir(parents=True)
        (work / "mirror" / name / "model.safetensors").write_bytes(b"w" * 1000)
        dir_manifest(work / "mirror" / name)
    server, _ = serve(str(work / "mirror"))
    (work / "inv.py").write_text(INVENTORY.format(secret=f"http://lab:{PASSWORD}@proxy.lab:3128",
                                                  mirror=f"http://127.0.0.1:{server.server_address[1]}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_CACHE=str(work / "cache"), QWEN27B_REPORTS=str(work / "reports"))
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(work / "inv.py"), "deploy.py", "--dry", "-y", "-v"],
                            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    server.shutdown()
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def fetches(plan):
    """(operation, command) of every planned command that downloads something."""
    return [(op, cmd) for op, cmds in plan for cmd in cmds if _kind(cmd) not in (None, "apt", "pip-wheelhouse")]


def test_every_fetch_carries_the_proxy_and_a_password_only_from_the_env_file(run):
    plans = parse_plans(run.stderr)
    routes = {_kind(cmd) for _, cmd in fetches(plans["with-password"])}
    assert routes >= {"hub", "pip-index", "pip-url", "uv-python", "curl"}, routes  # each route is there to check
    for host, prefix in (("with-password", FROM_ENV_FILE), ("plain", PLAIN)):
        unproxied = [(op, cmd) for op, cmd in fetches(plans[host]) if not cmd.startswith(prefix)]
        assert not unproxied, unproxied
    fetch = [cmd for _, cmd in fetches(plans["mirror"]) if _kind(cmd) == "mirror-fetch"]
    assert fetch and fetch[0].startswith(PLAIN), fetch
    assert PASSWORD not in run.stdout + run.stderr


def test_apt_reads_the_proxy_from_its_own_config_and_the_login_from_apt_auth_conf(run):
    plans = parse_plans(run.stderr)
    for host in ("with-password", "plain"):
        names = [op for op, _ in plans[host]]
        apt_conf = names.index("apt through qwen27b_http_proxy")
        assert apt_conf < names.index("base packages")  # before the first apt command
    assert "apt's login to the proxy (apt_auth.conf, 0600)" in [op for op, _ in plans["with-password"]]
    assert "apt's login to the proxy (apt_auth.conf, 0600)" not in [op for op, _ in plans["plain"]]
    conf, auth = apt_proxy_files(f"http://lab:{PASSWORD}@proxy.lab:3128")
    assert conf == 'Acquire::http::Proxy "http://proxy.lab:3128";\nAcquire::https::Proxy "http://proxy.lab:3128";\n'
    assert auth == f"machine proxy.lab:3128 login lab password {PASSWORD}\n"
    assert apt_proxy_files("socks5h://proxy.lab:1080")[1] is None
    assert APT_PROXY_CONF.startswith("/etc/apt/apt.conf.d/") and APT_PROXY_AUTH.startswith("/etc/apt/auth.conf.d/")


def test_without_the_key_no_fetch_gets_a_proxy():
    """The recorded plans (tests/golden, no qwen27b_http_proxy): no proxy variable, no apt proxy file."""
    for golden in (ROOT / "tests" / "golden").glob("*.txt"):
        text = golden.read_text()
        assert "http_proxy=" not in text and "90qwen27b-proxy" not in text, golden.name
    assert re.search(r"no_proxy= NO_PROXY= $", PLAIN)
