"""Secrets never shown: the real `pyinfra` CLI with --diff, -vvv and --debug on @fake recorded hosts
(tests/fixtures/hosts; the connector answers with recorded command output, the GPUs cannot be had
here), the one key-file parser, URL redaction, and report file modes.

Marker secrets are written to an API key file, a hub token file and the passwords of proxy and
mirror URLs; none may appear in pyinfra's output at any verbosity, in a planned command (those are
sh -c argv on the host: `ps`), or in a file under reports/.
"""

import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qwen27b.onhost.secretfile import SecretFileError, load_secret, parse_secret
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.plan.urlsecret import redact_url
from qwen27b.controller.report import write_private
from qwen27b.controller.postdeploy import HostResult, write_report
from tests.support.paths import ROOT

KEY, OLD_KEY, TOKEN = "newKEYmarker0123456789abcdef", "oldKEYmarker9876543210fedcba", "hf_TOKENmarker0123456789"
PROXY_PASS, WHEEL_PASS, PYTHON_PASS, MODEL_PASS = "proxyPASSmarker", "wheelPASSmarker", "pythonPASSmarker", "modelPASSmarker"
PYPI_PASS, TORCH_PASS = "pypiPASSmarker", "torchPASSmarker"  # issue 30's index keys
MARKERS = (KEY, OLD_KEY, TOKEN, PROXY_PASS, WHEEL_PASS, PYTHON_PASS, MODEL_PASS, PYPI_PASS, TORCH_PASS)

INVENTORY = """
import re
from pathlib import Path
from tests.support.recorded import fake_responses

HOSTS = Path({hosts!r})
OLD_KEY_STATE = {{"stdout": ["root root 600", "{old_hash}  -"]}}
common = dict(fake_delay=0, fake_delay_jitter=0, qwen27b_api_key_file={key!r}, qwen27b_hf_token_file={token!r},
              qwen27b_model_source="hub", qwen27b_http_proxy="http://lab:{proxy}@proxy.lab:3128",
              qwen27b_wheel_mirror="https://ci:{wheel}@wheels.lab/simple",
              qwen27b_python_mirror="https://py:{python}@python.lab/mirror")
hosts = [
    ("@fake/fresh", dict(fake_responses=fake_responses(HOSTS / "v100x4-2204-fresh"), **common)),
    # rotation: the host holds an older key (SecretFileState answers its hash, first match wins)
    ("@fake/rotate", dict(fake_responses={{re.compile(r"^if \\[ -f /etc/qwen27b/api-key\\.env"): OLD_KEY_STATE,
                                           **fake_responses(HOSTS / "v100x4-converged")}}, **common)),
    ("@fake/mirror", {{**common, "fake_responses": fake_responses(HOSTS / "v100x1-2004"),
                       "qwen27b_model_source": "mirror", "qwen27b_model_mirror": "http://m:{model}@127.0.0.1:9"}}),
    # the lab's own indexes with logins (no wheel mirror: uv installs from the indexes)
    ("@fake/indexes", {{**common, "fake_responses": fake_responses(HOSTS / "v100x1-2004"), "qwen27b_wheel_mirror": None,
                        "qwen27b_pypi_index": "https://pi:{pypi}@pypi.lab/simple/",
                        "qwen27b_torch_index": "https://pt:{torch}@pypi.lab/whl/cu128"}}),
]
"""


def _secret(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One dry run per verbosity, from a scratch cwd (pyinfra reads ./config.py; reports/ lands there)."""
    import hashlib
    tmp = tmp_path_factory.mktemp("secrets")
    key = _secret(tmp / "api.key", f"VLLM_API_KEY={KEY}\n")
    token = _secret(tmp / "hf.token", TOKEN + "\n")
    old_hash = hashlib.sha256(f"VLLM_API_KEY={OLD_KEY}\n".encode()).hexdigest()
    (tmp / "inv.py").write_text(textwrap.dedent(INVENTORY.format(
        hosts=str(ROOT / "tests" / "fixtures" / "hosts"), key=key, token=token, old_hash=old_hash, proxy=PROXY_PASS,
        wheel=WHEEL_PASS, python=PYTHON_PASS, model=MODEL_PASS, pypi=PYPI_PASS, torch=TORCH_PASS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B", "HF_", "VLLM"))}
    env["PYTHONPATH"] = str(ROOT)
    out = {}
    # the mirror host's manifest is unreachable (port 9): that error must be redacted too
    for flags in (("--diff",), ("--diff", "-vvv"), ("--diff", "--debug")):
        result = subprocess.run([sys.executable, "-m", "pyinfra", str(tmp / "inv.py"), str(ROOT / "deploy.py"),
                                 "--dry", "-y", *flags], cwd=tmp, capture_output=True, text=True, env=env, timeout=600)
        out[" ".join(flags)] = result
    return tmp, out


def test_no_flag_prints_a_secret(runs):
    _, out = runs
    for flags, result in out.items():
        text = result.stdout + result.stderr
        assert "== @fake/fresh:" in text, f"{flags}: no plan printed:\n{text[-3000:]}"
        for marker in MARKERS:
            assert marker not in text, f"{marker} printed with {flags}"


def test_the_plan_shows_the_secret_uploads_and_redacted_urls(runs):
    _, out = runs
    text = out["--diff"].stderr
    fresh = text.split("== @fake/fresh: ", 1)[1]
    assert "API key env file (0600)" in fresh and "Hugging Face token (0600" in fresh
    assert "umask 077" in fresh and "cat > /etc/qwen27b/.api-key.env.part" in fresh
    assert "mirror/proxy URLs with credentials" in fresh
    rotate = re.search(r"== @fake/rotate: \d+ operation.*?(?=^== |\Z)", text, re.S | re.M).group(0)
    assert re.search(r"CHANGE  API key env file \(0600\)", rotate), "rotation must rewrite the key"
    assert "https://ci:***@wheels.lab/simple" in text or "wheel_mirror" not in text


def test_no_planned_command_holds_a_password(runs):
    """Every planned command runs as sh -c argv on the host: it shows in `ps`."""
    _, out = runs
    commands = [line for line in out["--diff"].stderr.splitlines() if line.lstrip().startswith("$ ")]
    assert len(commands) > 50
    for marker in MARKERS:
        assert not [c for c in commands if marker in c], marker
    assert any("PIP_FIND_LINKS=\"$QWEN27B_WHEEL_MIRROR\"" in c or "UV_PYTHON_INSTALL_MIRROR=\"$QWEN27B_PYTHON_MIRROR\"" in c
               for c in commands)
    # an index with a login reaches uv through its environment, from the sourced root-only file
    assert any(c.lstrip().startswith("$ . ") and 'UV_INDEX_URL="$QWEN27B_TORCH_INDEX"' in c for c in commands)
    assert any('UV_INDEX_URL="$QWEN27B_PYPI_INDEX"' in c and "UV_EXTRA_INDEX_URL" not in c for c in commands)
    assert "fetch: PyPI (the other wheels) <- https://pi:***@pypi.lab/simple/" in out["--diff"].stderr


def test_reports_hold_no_secret_and_are_private(runs):
    tmp, _ = runs
    files = [p for p in (tmp / "reports").rglob("*") if p.is_file() and not p.is_symlink()]
    assert files, "the dry run writes a run report"
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        text = path.read_text()
        for marker in MARKERS:
            assert marker not in text, (marker, path)


# --------------------------------------------------------------------------- the key-file parser

@pytest.mark.parametrize("text, key", [
    ("abc123\n", "abc123"),
    ("VLLM_API_KEY=abc123\n", "abc123"),
    ("  VLLM_API_KEY=abc123  \r\n", "abc123"),
    ("dGVzdA==\n", "dGVzdA=="),  # base64 padding is part of a bare key
    ("sk-a.b_c~d+e/f\n", "sk-a.b_c~d+e/f"),
])
def test_key_file_accepted(text, key):
    assert parse_secret(text) == key


@pytest.mark.parametrize("text, problem", [
    ("", "is empty"),
    ("  \n\t\n", "is empty"),
    ("VLLM_API_KEY=\n", "empty VLLM_API_KEY="),
    ("VLLM_API_KEY=secretXYZ\nLD_PRELOAD=/tmp/evil.so\n", "has 2 lines"),
    ("LD_PRELOAD=/tmp/evil.so\n", "sets LD_PRELOAD, not VLLM_API_KEY"),
    ("export VLLM_API_KEY=secretXYZ\n", "characters other than"),
    ("VLLM_API_KEY='secretXYZ'\n", "characters other than"),
    ("secret XYZ\n", "characters other than"),
    ("secretXYZé\n", "characters other than"),
])
def test_key_file_refused_without_showing_the_key(text, problem):
    with pytest.raises(SecretFileError) as refused:
        parse_secret(text)
    assert problem in refused.value.problem and "Fix: write one line" in str(refused.value)
    assert "secretXYZ" not in str(refused.value) and "evil" not in str(refused.value)


def test_key_file_unreadable_kinds(tmp_path):
    with pytest.raises(SecretFileError, match="not a regular file"):
        load_secret(str(tmp_path))
    bad = tmp_path / "latin1.key"
    bad.write_bytes(b"secret\xe9XYZ\n")
    with pytest.raises(SecretFileError, match="non-ASCII") as refused:
        load_secret(str(bad))
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize("key, text, problem", [
    ("qwen27b_api_key_file", "", "is empty"),
    ("qwen27b_api_key_file", "VLLM_API_KEY=secretXYZ\nLD_PRELOAD=/x.so\n", "has 2 lines"),
    ("qwen27b_hf_token_file", "HF_TOKEN=hf_secretXYZ\nX=1\n", "has 2 lines"),
    ("qwen27b_hf_token_file", "VLLM_API_KEY=hf_secretXYZ\n", "sets VLLM_API_KEY, not HF_TOKEN"),
])
def test_inventory_refuses_a_bad_key_file_naming_host_key_and_fix(tmp_path, key, text, problem):
    path = _secret(tmp_path / "secret", text)
    with pytest.raises(BadHostData) as refused:
        settings_for("gpu-a", {key: path})
    message = str(refused.value)
    assert message.startswith(f"gpu-a: {key}: {path} ") and problem in message and "Fix: write one line" in message
    assert "secretXYZ" not in message


def test_inventory_refuses_a_directory_as_key_file(tmp_path):
    (tmp_path / "d").mkdir(mode=0o700)
    with pytest.raises(BadHostData, match=r"gpu-a: qwen27b_api_key_file: .* is a directory"):
        settings_for("gpu-a", {"qwen27b_api_key_file": str(tmp_path / "d")})


def test_bench_and_health_read_the_same_format(tmp_path):
    from qwen27b.tools.bench import BenchError, read_key_file
    good = _secret(tmp_path / "good", f"VLLM_API_KEY={KEY}\n")
    assert read_key_file(good) == KEY == load_secret(good)
    two = _secret(tmp_path / "two", f"{KEY}\nLD_PRELOAD=/x.so\n")
    with pytest.raises(BenchError, match="has 2 lines") as refused:
        read_key_file(two)
    assert KEY not in str(refused.value)


# --------------------------------------------------------------------------- URLs and reports

@pytest.mark.parametrize("url, shown", [
    ("http://user:pa55@proxy.lab:3128", "http://user:***@proxy.lab:3128"),
    ("https://ci:s3cr%40t@wheels.lab/simple?x=1", "https://ci:***@wheels.lab/simple?x=1"),
    ("https://TOKEN123@mirror.lab/m", "https://***@mirror.lab/m"),
    ("http://mirror.lab:8080/path", "http://mirror.lab:8080/path"),
    ("file:///srv/mirror", "file:///srv/mirror"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_write_private_is_0600_from_the_start(tmp_path):
    old = os.umask(0)
    try:
        path = write_private(tmp_path / "reports" / "r.json", "{}")
        report = write_report([HostResult("h", model="m", revision="r", served_name="s", url="u")],
                              tmp_path / "reports", "run1")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "no temp file left behind"
