"""`qwen27b rollback INVENTORY --limit HOST [--dry]`: `pyinfra INVENTORY rollback.py -y --limit HOST`.

Switches each named host back to its previous release (release dir, model revision, unit, env, as
recorded on the host by the deploy that replaced it), restarts and verifies it; a second rollback
rolls forward again. The deploy file (rollback.py, roles/rollback.py) does the work.
"""

from __future__ import annotations

import sys

from qwen27b.tools.rollout import run_deploy_file


def main(argv: list[str] | None = None) -> int:
    return run_deploy_file("qwen27b rollback", "rollback.py", __doc__.split("\n\n")[1].replace("\n", " "),
                           list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
