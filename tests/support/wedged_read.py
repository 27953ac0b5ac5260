"""Read the NvidiaGpus fact over pyinfra's @local connector with a fake `nvidia-smi` first on PATH
(issue 52 item 2), in its own process: gevent patched as pyinfra's CLI patches it (the deploy's
reads run so), the fact cache installed as the deploy installs it, the preflight's batch
(factcache.prefetch) before the fact's own read. Prints one JSON line:
{"seconds", "failed", "value"}. `python -m tests.support.wedged_read BIN_DIR [CONTROLLER_BOUND_S]`:
with a bound, the controller's wait for a bounded fact is that many seconds (factcache.BOUND)."""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from pyinfra.api import Config, Inventory, State  # noqa: E402
from pyinfra.api.connect import connect_all  # noqa: E402
from pyinfra.api.exceptions import PyinfraError  # noqa: E402
from pyinfra.api.state import StateStage  # noqa: E402
from pyinfra.context import ctx_state  # noqa: E402

from qwen27b.controller import factcache  # noqa: E402
from qwen27b.controller import facts as F  # noqa: E402
from qwen27b.plan.gpubound import Bound  # noqa: E402


def main() -> None:
    os.environ["PATH"] = f"{sys.argv[1]}:{os.environ['PATH']}"
    if len(sys.argv) > 2:  # the controller's bound alone: seconds 1, margin the rest
        factcache.BOUND = Bound(1, 1, int(sys.argv[2]) - 2)
    state = State(Inventory(([("@local", {})], {})), Config())
    state.set_stage(StateStage.Connect)
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    factcache.install(state)
    host = next(iter(state.inventory))
    started = time.monotonic()
    with ctx_state.use(state):  # the preflight's batch first, as the deploy reads (a stopped batch is read again)
        factcache.prefetch([(F.NvidiaGpus, {}), (F.OsRelease, {})], on=host)
    try:
        value = host.get_fact(F.NvidiaGpus)
    except PyinfraError:  # "No hosts remaining!": the only host failed (the preflight's read refuses it)
        value = None
    print(json.dumps({"seconds": time.monotonic() - started, "failed": host in state.failed_hosts, "value": value}))


if __name__ == "__main__":
    main()
