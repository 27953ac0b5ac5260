"""Take-over (issue 52 item 1): with qwen27b_take_over_unit, a lab's own unit on qwen27b's unit names
(one the deploy did not render: plan/foreignunit.py) is kept (the unit, its env file(s) and a
restore.sh, root-only under the state dir's takeover/), stopped and disabled right before the service
role writes ours, so the lab's server serves through the download and the builds. `qwen27b rollback`
(with no earlier release of ours) and `qwen27b uninstall` put it back (roles/_takeover.py). Without
the setting the gate has refused such a host already; with nothing foreign this role plans nothing.
"""

from __future__ import annotations

from pyinfra.operations import server

from qwen27b.plan.foreignunit import foreign, take_over_commands
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostlayout import UNIT_DIR


def takeover(decision: Decision) -> None:
    units = foreign(decision.facts.unit_files) if decision.settings.take_over_unit else []
    if not units:
        return
    kept = decision.stack.layout.takeover_dir
    names = ", ".join(u.name for u in units)
    server.shell(name=f"take-over: keep {names} and its env file(s) in {kept}, stop and disable it",
                 commands=take_over_commands(decision.facts.unit_files, UNIT_DIR, kept))
