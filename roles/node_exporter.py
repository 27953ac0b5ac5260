"""node_exporter (optional, qwen27b_node_exporter): Debian's and Ubuntu's prometheus-node-exporter
from the OS archive, enabled and running, with its textfile directory writable by the health check.

The package (no Recommends: those are the extra collectors and their tools) listens on :9100; the
firewall role, run before this one so the port is never open to all, lets only the host itself and
qwen27b_metrics_allow reach it. Leaving the key
out later leaves the package installed: it is the lab's to remove, and other collectors may use it.
"""

from __future__ import annotations

from pyinfra.operations import systemd

from qwen27b.controller.operations import directories
from qwen27b.onhost.contract import TEXTFILE_DIR, TEXTFILE_NAME
from qwen27b.plan.gate import Decision
from qwen27b.plan.settings import NODE_EXPORTER_PORT, NODE_EXPORTER_UNIT

from ._common import note
from ._common import apt_install

# the distribution's own package (Debian, Ubuntu), installed without Recommends
PACKAGE = "prometheus-node-exporter"


def textfile_dir_spec(user: str) -> list[str]:
    """[path, owner, group, mode] of the textfile directory: root's, group the service user, 2775.

    The health check runs as the service user and writes qwen27b.prom there (a temp file renamed
    over it), so it needs the group's write; node_exporter (user prometheus) reads through "other".
    vLLM, the same user, cannot write it: its unit's ProtectSystem=strict leaves only the state
    dir writable (the health unit lists this directory in ReadWritePaths=). No sticky bit: a
    qwen27b.prom written by root (qwen27b-health run by hand) would block the timer's rename. The
    setgid bit because `chmod 0775` keeps a directory's setgid (coreutils): a package that set it
    would make every run chmod again, while 2775 converges from any state.
    """
    return [TEXTFILE_DIR, "root", user, "2775"]


def node_exporter(decision: Decision) -> None:
    if not decision.settings.node_exporter:
        return
    user = decision.stack.layout.service_user
    scrapers = ", ".join(decision.settings.metrics_allow or []) or "nobody (set qwen27b_metrics_allow)"
    note(f"node_exporter: {PACKAGE} on :{NODE_EXPORTER_PORT}, scraped by {scrapers}; "
         f"the health check writes {TEXTFILE_DIR}/{TEXTFILE_NAME}")
    apt_install(f"{PACKAGE} (node_exporter, from the OS archive)", [PACKAGE], no_recommends=True)
    directories(name=f"node_exporter's textfile dir, writable by {user}", specs=[textfile_dir_spec(user)])
    systemd.service(name=f"{NODE_EXPORTER_UNIT} enabled and running", service=NODE_EXPORTER_UNIT,
                    running=True, enabled=True)
