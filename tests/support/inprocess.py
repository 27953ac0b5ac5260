"""A plan made in this process (pyinfra's State on @fake hosts answering with their recordings in
tests/fixtures/hosts) and the check that its rendered units pass `systemd-analyze verify`: shared by the
injection, address, firewall, multinode and node_exporter tests."""

import os
import shlex
import shutil
import subprocess
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest

from qwen27b.controller.render import render
from qwen27b.controller.render_firewall import firewall_contexts
from qwen27b.onhost.contract import FIREWALL_UNIT
from qwen27b.plan.stack import load_stack
from tests.support.paths import ROOT
from tests.support.rendering import UNIT_NAMES, rendered

HOSTS_DIR = ROOT / "tests" / "fixtures" / "hosts"
STACK = load_stack()
needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


class InProcessPlan:
    """The roles of deploy.py for one @fake recorded host, queued in this process (no pyinfra CLI):
    the operations and their commands, as the dry run's plan prints them."""

    def __init__(self, cache: Path):
        os.environ["QWEN27B_CACHE"] = str(cache)  # empty: nothing fetched, nothing cached leaks in

    def __call__(self, name: str, data: dict, decision) -> list[tuple[str, list[str]]]:
        from pyinfra.api import Config, Inventory, State
        from pyinfra.api.connect import connect_all
        from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

        import roles._common
        import roles.toolchain
        from qwen27b.controller.opsplan import planned_operations
        from tests.support.recorded import fake_responses
        from roles import cuda, dflash, firewall, multinode, node_exporter, nvidia, service, toolchain, vllm, weights

        inventory = Inventory(([(f"@fake/{name}", {"fake_responses": fake_responses(HOSTS_DIR / name), "fake_delay": 0,
                                                   "fake_delay_jitter": 0, **data})], {}))
        state = State(inventory, Config())
        connect_all(state)
        host = inventory.get_host(f"@fake/{name}")
        with ExitStack() as stack:
            for ctx, value in ((ctx_state, state), (ctx_host, host), (ctx_config, state.config),
                               (ctx_inventory, inventory)):
                stack.enter_context(ctx.use(value))
            dry = roles.toolchain.dry_run
            roles.toolchain.dry_run = lambda: True  # plan only: fetch no uv
            try:
                for role in (toolchain.toolchain, nvidia.nvidia, cuda.cuda, vllm.vllm, dflash.dflash, weights.weights,
                             firewall.firewall, node_exporter.node_exporter, multinode.multinode, service.service):
                    role(decision)
            finally:
                roles.toolchain.dry_run = dry
                roles._common.take_notes()
                roles._common.restart_needed()
                roles._common.previous_links()
            return [(op, cmds) for op, _, cmds in planned_operations(state, host)]


@pytest.fixture(scope="module")
def planner():
    saved = os.environ.get("QWEN27B_CACHE")
    with tempfile.TemporaryDirectory(prefix="qwen27b-inject-") as cache:
        yield InProcessPlan(Path(cache))
    if saved is None:
        os.environ.pop("QWEN27B_CACHE", None)
    else:
        os.environ["QWEN27B_CACHE"] = saved


def check_units(decision, root: Path) -> None:
    files = rendered(root, decision)  # test_templates' helper: the units' executables exist
    units = root / "units"
    units.mkdir(exist_ok=True)
    names = UNIT_NAMES
    for template, name in names.items():
        text = files[template]
        assert "%" not in text.replace("%%", ""), f"a bare % (systemd specifier) in {name}:\n{text}"
        (units / name).write_text(text)
    firewall = firewall_contexts(decision)  # the service then Requires= it: verify loads it too
    if firewall:
        (units / FIREWALL_UNIT).write_text(render("qwen27b-firewall.service.j2", firewall["qwen27b-firewall.service.j2"]))
        names = {**names, "firewall": FIREWALL_UNIT}
    assert exec_start_argv(files["qwen27b.service.j2"])[3:] == decision.serve.argv()
    env_lines = [line for line in files["qwen27b.env.j2"].splitlines() if line and not line.startswith("#")]
    assert len(env_lines) == len({name for name, _ in decision.serve.env.items()} | {line.split("=", 1)[0]
                                                                                     for line in env_lines})
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *[str(units / n) for n in names.values()]],
                            capture_output=True, text=True, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"}, cwd=units)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def exec_start_argv(unit: str) -> list[str]:
    """ExecStart= as systemd splits it, for the values allow-listed here (no ' or \\ inside quotes,
    where systemd and sh agree): continuation lines joined, %% and $$ unescaped."""
    line = unit.split("\nExecStart=", 1)[1].split("\nExecStartPost=", 1)[0].replace("\\\n", " ")
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(line)]
