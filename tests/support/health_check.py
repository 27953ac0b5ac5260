"""The health check as a host runs it, for its tests: the installed release venv's `qwen27b-health` wrapper
(`venv`, `cli`) with systemctl and journalctl stand-ins (`fakebin`), and NVML stand-ins fed the recorded
H200's readings (`_fake_driver`)."""

import json
import subprocess
import sys

import pytest

from qwen27b.onhost import contract
from tests.support import onhost_lib
from tests.support.paths import TESTS


H200_GENUINE = TESTS / "fixtures" / "hosts" / "h200" / "genuine"  # recorded on a real H200 (its README names where)


def _h200_reading():
    """The genuine H200 NVML output (tests/fixtures/hosts/h200/genuine/pynvml.txt, in the repository)."""
    vals = {"name": "NVIDIA H200", "mem": (150754820096, 644939776, 150109880320), "temp": 32,
            "throttle": 0x1, "ecc": 0}
    src = H200_GENUINE / "pynvml.txt"
    for line in src.read_text().splitlines():
        key, _, rest = line.partition(" ")
        if key == "name":
            vals["name"] = rest
        elif key == "mem":
            vals["mem"] = tuple(int(v) for v in rest.split())
        elif key in ("temp", "ecc"):
            vals[key] = int(rest)
        elif key == "throttle":
            vals["throttle"] = int(rest, 16)
    return vals


def _fake_driver(monkeypatch, count=1, lost=(), init_error=None):
    pynvml = pytest.importorskip("pynvml")
    v = _h200_reading()
    total, used, free = v["mem"]

    def not_supported(*_):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def handle(i):
        if i in lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i

    def init():
        if init_error is not None:
            raise pynvml.NVMLError(init_error)

    fakes = {
        "nvmlInit": init, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": handle, "nvmlDeviceGetName": lambda h: v["name"],
        "nvmlDeviceGetMemoryInfo": lambda h: type("M", (), {"total": total, "used": used, "free": free}),
        "nvmlDeviceGetPciInfo": lambda h: type("P", (), {"busId": f"00000000:{0x18 + h:02X}:00.0"}),
        "nvmlDeviceGetTemperature": lambda h, sensor: v["temp"],
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: v["ecc"],
        "nvmlDeviceGetRetiredPagesPendingStatus": not_supported,  # Hopper remaps rows instead
        "nvmlDeviceGetRetiredPages": not_supported,  # nvidia-smi -q: "Retired Pages ... N/A" on the H200
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: v["throttle"],
    }
    for name, fn in fakes.items():
        monkeypatch.setattr(pynvml, name, fn)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A real release venv built the way the vllm role builds one on a host: ``python3 -m venv``,
    then the stack's host packages (httpx, nvidia-ml-py) installed offline from the controller
    wheelhouse, then lib/qwen27b_onhost/ and the wrapper. Nothing comes from this machine's
    own site-packages (issue 10: a linked interpreter without pyvenv.cfg ran the system Python,
    which had httpx only where someone installed it by hand)."""
    import os

    from qwen27b.controller import cpu_build as cb
    from qwen27b.tools import cpu_smoke as cs
    wheelhouse = cs.default_wheelhouse(cs.cache_root())
    if not wheelhouse.is_dir():
        from setupcheck import skip_or_fail_setup
        skip_or_fail_setup(f"no controller wheelhouse at {wheelhouse}: `./run tests` builds it "
                    "(python -m qwen27b.tools.cpu_smoke wheelhouse)")
    root = tmp_path_factory.mktemp("release") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheelhouse), *cs.host_packages()],
                   check=True, env=cb.offline_pip_env(os.environ))
    onhost_lib.install(root / "lib")
    wrapper = root / "bin" / "qwen27b-health"
    wrapper.write_text(contract.wrapper_script(str(root)))
    wrapper.chmod(0o755)
    return root


@pytest.fixture(scope="module")
def fakebin(tmp_path_factory):
    """systemctl / journalctl stand-ins: record argv, answer `show` with ActiveState=$FAKE_STATE and
    MainPID=$FAKE_MAINPID (0: no process; `cli.main_pid` sets it), print $FAKE_KERNEL."""
    d = tmp_path_factory.mktemp("fakebin")
    (d / "systemctl").write_text('#!/bin/sh\necho "$*" >> "$FAKE_CALLS"\n'
                                 'case "$1" in show) echo "ActiveState=${FAKE_STATE:-active}"; echo "MainPID=${FAKE_MAINPID:-0}";; esac\n'
                                 'exit "${FAKE_SYSTEMCTL_RC:-0}"\n')
    (d / "journalctl").write_text('#!/bin/sh\necho "$*" >> "$FAKE_CALLS"\n'
                                  '[ -n "$FAKE_KERNEL" ] && cat "$FAKE_KERNEL"\nexit 0\n')
    for f in d.iterdir():
        f.chmod(0o755)
    return d


@pytest.fixture
def cli(venv, fakebin, tmp_path):
    """Run the installed wrapper; returns (rc, stdout, stderr, status dict or None)."""
    calls = tmp_path / "calls.log"
    calls.touch()
    status = tmp_path / "state" / "health.json"
    textfile = tmp_path / "textfile"  # never the machine's own node_exporter dir
    textfile.mkdir()

    def run(*args, env=None, status_file=True):
        argv = [str(venv / "bin" / "qwen27b-health"), *args]
        if "--textfile-dir" not in args:
            argv += ["--textfile-dir", str(textfile)]
        if status_file:
            argv += ["--status-file", str(status)]
        e = {"PATH": f"{fakebin}:/usr/bin:/bin", "FAKE_CALLS": str(calls), "HOME": str(tmp_path)}
        if run.main_pid:
            e["FAKE_MAINPID"] = str(run.main_pid)
        e.update(env or {})
        p = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=120)
        data = json.loads(status.read_text()) if status.exists() else None
        return p.returncode, p.stdout, p.stderr, data

    run.calls = calls
    run.main_pid = None  # the unit's MainPID the fake systemctl reports (the process that holds the port)
    run.status = status
    run.textfile = textfile
    run.venv = venv
    return run
