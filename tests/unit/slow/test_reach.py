"""`qwen27b reach` (issue 30): the sources a host is probed for (from its recorded gate facts), the
probe run for real on this machine (@local: the same python3 -c and stdin a host gets) against a
local HTTP server, and the table.

No test host is booted: the probe is the host side, run here as a subprocess, as on a host.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading

import pytest

from qwen27b.plan import sources
from qwen27b.plan.stack import load_stack
from qwen27b.tools import reach
from tests.support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "hosts"


def recorded_outputs(name: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in (FIXTURES / name).iterdir() if p.is_file()}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/huge")
        elif self.path == "/huge":
            raise AssertionError("a redirect was followed")
        else:
            self.send_response(200 if self.path == "/simple/" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_probe_heads_each_url_from_stdin_and_follows_no_redirect(server):
    fetches = [sources.Fetch("PyPI", f"{server}/simple/", "qwen27b_pypi_index"),
               sources.Fetch("wheel", f"{server}/moved", "qwen27b_release_mirror"),
               sources.Fetch("mirror base", f"http://u:pw@{server[7:]}/python/", "qwen27b_python_mirror"),
               sources.Fetch("hub", f"http://127.0.0.1:{closed_port()}/api/models/o/m", "qwen27b_hf_endpoint")]
    stdin = reach.probe_input(fetches, None, 3)
    assert "pw" not in reach.PROBE_COMMAND and "127.0.0.1" not in reach.PROBE_COMMAND  # URLs only on stdin
    done = subprocess.run(["sh", "-c", reach.PROBE_COMMAND], input=stdin, capture_output=True, text=True, timeout=60)
    rows = reach.rows_for("@local", fetches, done.stdout)
    got = {r.source: (r.ok, r.result, r.fix) for r in rows}
    assert got["PyPI"] == (True, "reached (HTTP 200)", "")
    assert got["wheel"] == (True, "reached (HTTP 302)", "")
    assert got["mirror base"] == (True, "reached (HTTP 404)", "")
    assert got["hub"][0] is False and "refused" in got["hub"][1].lower() and got["hub"][2] == "qwen27b_hf_endpoint"
    assert "u:***@" in next(r.url for r in rows if r.source == "mirror base")


def test_a_proxys_refusal_and_a_host_not_reached_are_failures():
    f = [sources.Fetch("torch index", "https://download.pytorch.org/whl/cu128/", "qwen27b_torch_index")]
    assert reach.rows_for("h", f, json.dumps({"name": "torch index", "status": 407}))[0].result.endswith("asks for a login)")
    assert not reach.rows_for("h", f, json.dumps({"name": "torch index", "status": 503}))[0].ok
    down = reach.rows_for("h", f, "", error="ConnectError: timed out")[0]
    assert (down.ok, down.result, down.fix) == (False, "ConnectError: timed out", "qwen27b_torch_index")
    assert reach.rows_for("h", f, "")[0].result.startswith("no answer")


def test_the_sources_probed_are_the_plans_for_a_recorded_host():
    stack = load_stack()
    data = {"qwen27b_wheel_mirror": "http://192.168.10.5:8800/wheels/", "qwen27b_hf_endpoint": "http://192.168.10.5:8090"}
    fetches, note = reach.host_fetches_of("v100x1-2004", data, stack, recorded_outputs("v100x1-2004"))
    assert note is None
    assert [f.url for f in fetches] == [
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64/",  # 1.5.1's JIT needs nvcc 12.8
        "https://github.com/astral-sh/python-build-standalone/releases/download/",  # 20.04 ships 3.8: uv installs 3.12
        "http://192.168.10.5:8800/wheels/",
        "http://192.168.10.5:8090/api/models/QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4"]  # one 32 GB card: no draft fits
    rows = reach.rows_for("v100x1-2004", fetches, "", error="unreachable")
    assert [r.fix for r in rows] == ["qwen27b_apt_mirror", "qwen27b_python_mirror, qwen27b_release_mirror or the controller cache",
                                     "qwen27b_wheel_mirror", "qwen27b_hf_endpoint"]
    table = reach.reach_table(rows).splitlines()
    assert table[0].split() == ["source", "host", "result", "fix", "(setting)"]
    assert sum("v100x1-2004  unreachable" in line for line in table) == 4


def test_a_refused_host_is_probed_for_every_gpu_profiles_sources():
    fetches, note = reach.host_fetches_of("centos7", {}, load_stack(), recorded_outputs("centos7"))
    assert note and "gate refuses" in note
    urls = [f.url for f in fetches]
    assert len(urls) == len(set(urls)) and "https://pypi.org/simple/" in urls
    assert any("1Cat-vLLM" in u for u in urls)  # sm70's wheel, and the upstream build's sources too


def test_reach_is_a_qwen27b_command():
    from qwen27b.tools.cli import COMMANDS
    assert COMMANDS["reach"][0] == "qwen27b.tools.reach"


def test_the_apt_mirror_is_probed_first():
    data = {"qwen27b_apt_mirror": "http://u:pw@192.168.10.5:8800/", "qwen27b_wheel_mirror": "http://192.168.10.5:8800/wheels/"}
    fetches, note = reach.host_fetches_of("v100x1-2004", data, load_stack(), recorded_outputs("v100x1-2004"))
    assert note is None and fetches[0].url == "http://u:pw@192.168.10.5:8800/ubuntu/"
    row = reach.rows_for("v100x1-2004", fetches, "", error="unreachable")[0]
    assert row.fix == "qwen27b_apt_mirror" and "pw" not in reach.reach_table([row])


def test_the_gates_dry_probe_is_the_same_probe_as_a_fact(server):
    """controller/reachprobe.dry_reach runs the probe as a pyinfra fact (host_facts.ReachProbe): its command,
    run here as a host's shell would, answers as `qwen27b reach` does."""
    from qwen27b.controller.host_facts import ReachProbe
    fetches = [sources.Fetch("PyPI", f"{server}/simple/", "qwen27b_pypi_index"),
               sources.Fetch("wheel", f"{server}/moved", "qwen27b_release_mirror"),
               sources.Fetch("hub", f"http://127.0.0.1:{closed_port()}/api/models/o/m", "qwen27b_hf_endpoint")]
    fact = ReachProbe()
    out = subprocess.run(["sh", "-c", fact.command(reach.probe_input(fetches, None, 3))], capture_output=True,
                         text=True, timeout=60).stdout
    rows = reach.rows_for("h", fetches, "\n".join(fact.process(out.splitlines())))
    assert [(r.ok, r.result.split(" (")[0]) for r in rows][:2] == [(True, "reached"), (True, "reached")]
    assert rows[2].ok is False and "refused" in rows[2].result.lower() and rows[2].fix == "qwen27b_hf_endpoint"


DRY_INVENTORY = """\
from inventory.recorded import _fake
name, data = _fake('v100x1-2004', qwen27b_apt_mirror='http://apt:apt-pw-9@192.168.10.5:8800/',
                   qwen27b_wheel_mirror='http://192.168.10.5:8800/wheels/', qwen27b_hf_endpoint='http://192.168.10.5:8090')
hosts = [('@fake/lab', {**data, 'fake_responses': {'HTTPRedirectHandler': {ANSWERS!r}, **data['fake_responses']}})]
"""


def test_a_dry_run_checks_each_source_from_the_host_before_anything_is_installed(tmp_path):
    """`pyinfra INVENTORY deploy.py --dry` (issue 30): the gate probes the plan's sources from the host
    (a @fake host answers with the probe's lines, QWEN27B_DRY_REACH=1; a real host always does), the
    plan prints a reach line per source with its fix before the first install, a source whose URL
    has a login is not sent (said so), GitHub out of reach is warned about, the failures recorded."""
    from tests.support.dryrun import run_pyinfra
    answers = [json.dumps({"name": "Python 3.12 (uv)", "error": "URLError: [Errno 101] Network is unreachable"}),
               json.dumps({"name": "wheels (lab mirror)", "status": 200}),
               json.dumps({"name": "QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 (hub)", "status": 404})]
    (tmp_path / "inv.py").write_text(DRY_INVENTORY.replace("{ANSWERS!r}", repr(answers)))
    result = run_pyinfra(str(tmp_path / "inv.py"), "deploy.py", "--dry", "-y", QWEN27B_DRY_REACH="1",
                         QWEN27B_REPORTS=str(tmp_path / "reports"))
    out = result.stderr
    assert "apt-pw-9" not in out, out[-3000:]
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("reach: ")]
    assert lines == [
        "reach: Ubuntu archive (apt) <- http://apt:***@192.168.10.5:8800/ubuntu/: not checked: its login would reach "
        "the probe's command line; run `qwen27b reach`",
        "reach: CUDA apt repository <- http://apt:***@192.168.10.5:8800/compute/cuda/repos/ubuntu2004/x86_64/: not "
        "checked: its login would reach the probe's command line; run `qwen27b reach`",
        "reach: Python 3.12 (uv) <- https://github.com/astral-sh/python-build-standalone/releases/download/: URLError: "
        "[Errno 101] Network is unreachable (fix: qwen27b_python_mirror, qwen27b_release_mirror or the controller cache)",
        "reach: wheels (lab mirror) <- http://192.168.10.5:8800/wheels/: reached (HTTP 200)",
        "reach: QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 (hub) <- http://192.168.10.5:8090/api/models/QUASAR-QAT/"
        "Qwen3.8-27B-QUASAR-NVFP4: reached (HTTP 404)"], out[-3000:]
    assert out.index("reach: Python 3.12") < out.index("base packages")
    assert "this host could not reach github.com" in " ".join(out.split())
    record = json.loads((tmp_path / "reports" / "reach.json").read_text())["hosts"]["@fake/lab"]
    assert record["failed"] == ["https://github.com/astral-sh/python-build-standalone/releases/download/"]


def test_a_dry_run_sends_nothing_through_a_proxy_with_a_login(monkeypatch):
    """The proxy's login would be in the fact's command line: no probe, every row says why."""
    from qwen27b.controller import reachprobe
    from qwen27b.plan.hostdata import settings_for

    class Decision:
        settings = settings_for("h", {"qwen27b_http_proxy": "http://u:pw@proxy.lab:3128"})

    class Host:
        name = "h"

        def get_fact(self, *args, **kwargs):
            raise AssertionError("probed through a proxy with a login")

    monkeypatch.setattr(reachprobe, "host_fetches", lambda d, c: [sources.Fetch("PyPI", "https://pypi.org/simple/", "k")])
    rows = reachprobe.dry_reach(Host(), Decision())
    assert [(r.ok, r.result.split(":")[0]) for r in rows] == [(None, "not checked")]
