"""qwen27b/controller/opsplan.py: a host's plan lists its operations in pyinfra's run order,
taken from the host's own call order (not pyinfra's whole-run sort, once per host). The goldens
(tests/plans/test_plans.py) check it on whole deploys, where pyinfra orders by the call stack."""

from __future__ import annotations

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import server

from qwen27b.controller.opsplan import planned_operations


def test_each_host_in_the_order_pyinfra_runs_it():
    state = State(Inventory((["@fake/a", "@fake/b"], {})), Config())
    state.set_stage(StateStage.Connect)
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    a, b = state.inventory.get_host("@fake/a"), state.inventory.get_host("@fake/b")
    plans = {a: ["first", "second", "third"], b: ["first", "only b", "second", "third", "last of b"]}
    with ctx_state.use(state):
        for host, names in plans.items():
            with ctx_host.use(host):
                for name in names:
                    server.shell(name=name, commands=[f"echo {name}"])
        order = state.get_op_order()
        for host in (a, b):
            with ctx_host.use(host):  # as the deploy file prints it: the commands are generated
                planned = planned_operations(state, host)
            expected = [h for h in order if h in state.ops[host]]
            assert [name for name, _, _ in planned] == [", ".join(sorted(state.op_meta[h].names)) for h in expected]
            assert len(planned) == len(plans[host]) and all(changes for _, changes, _ in planned)
