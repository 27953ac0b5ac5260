"""`qwen27b` on the controller: the commands beside `pyinfra ... deploy.py`.

    qwen27b bench ...     the seed's bench matrix against a deployed endpoint (qwen27b.tools.bench)
    qwen27b doctor ...    the seed's troubleshooting chain, automated (qwen27b.tools.doctor)
    qwen27b mirror ...    an air-gapped lab's mirror layout from fetched artifacts (qwen27b.tools.mirror_layout)
    qwen27b profiles ...  the engine profile catalog, and which entries fit each host (qwen27b.tools.profiles)
    qwen27b reach ...     can each host reach every source its plan fetches from (qwen27b.tools.reach)
    qwen27b qualify ...   a bounded burn-in of every GPU before it serves (qwen27b.tools.qualify)
    qwen27b status ...    one line per host of the fleet, read in parallel (qwen27b.tools.status)
    qwen27b gateway ...   a backend in or out of every gateway's pool (qwen27b.tools.gateway)
    qwen27b usage ...     each gateway key's requests and tokens over a window (qwen27b.tools.usage)
    qwen27b rollout ...   a rolling upgrade, canary first, batch by batch (qwen27b.tools.rollout)
    qwen27b rollback ...  hosts back to their previous release, verified (rollback.py)
    qwen27b uninstall ... remove what the deploy made, listed first (uninstall.py)

Each subcommand lives in its own module with a `main(argv)`; this only dispatches.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "bench": ("qwen27b.tools.bench", "the bench matrix against an endpoint"),
    "doctor": ("qwen27b.tools.doctor", "the troubleshooting chain for a host"),
    "mirror": ("qwen27b.tools.mirror_layout", "lay out a lab mirror (checkpoint, wheels, Python) from fetched files"),
    "qualify": ("qwen27b.tools.qualify", "burn in each GPU (matmul, memory, pattern) and judge its wear"),
    "profiles": ("qwen27b.tools.profiles", "the engine profile catalog; with an inventory, which entries fit each host"),
    "reach": ("qwen27b.tools.reach", "from each host, a HEAD request to each source its plan fetches from"),
    "status": ("qwen27b.tools.status", "service, health, release, model, GPUs, last verify of every host"),
    "gateway": ("qwen27b.tools.gateway", "drain / undrain a backend at every gateway, or show the pools"),
    "key": ("qwen27b.tools.key", "a new gateway client key in a 0600 file (an API user or a chat page account)"),
    "usage": ("qwen27b.tools.usage", "each gateway key's requests, 429s and tokens over a window"),
    "rollout": ("qwen27b.tools.rollout", "a rolling upgrade: canary first, each batch verified before the next"),
    "rollback": ("qwen27b.tools.rollback", "switch hosts back to their previous release and verify it"),
    "uninstall": ("qwen27b.tools.uninstall", "remove what the deploy made, each removal listed first"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:9} {about}" for name, (_, about) in COMMANDS.items()]
        print("usage: qwen27b COMMAND [args]\n\n" + "\n".join(lines), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
