"""qwen27b rollback: switch each host back to its previous release (release dir, model revision,
unit, env), restart and verify it, without a failed deploy first.

    pyinfra inventory/lab.py rollback.py --dry --limit gpu-b   # what it would switch, per host
    pyinfra inventory/lab.py rollback.py -y --limit gpu-b      # do it (or: qwen27b rollback ...)

The previous release is the one the last deploy that switched anything replaced, as recorded on
the host (/etc/qwen27b/rollback/); a second rollback rolls forward again. A host with nothing
recorded, or whose previous release was pruned, is refused with the fix. docs/lifecycle.md.
"""

from roles.rollback import rollback

rollback()
