"""qwen27b uninstall: remove what the deploy made, every removal listed in the plan first.

    pyinfra inventory/lab.py uninstall.py --dry --limit gpu-b    # the list, per host; nothing changes
    pyinfra inventory/lab.py uninstall.py -y --limit gpu-b       # do it (or: qwen27b uninstall ...)
    ... --data qwen27b_uninstall_weights=true                    # the model weights too (20+ GiB)
    ... --data qwen27b_uninstall_driver=true                     # unhold and purge the NVIDIA driver too

A second run finds nothing to remove; the host can be deployed again afterwards (with the
weights kept, without fetching them). docs/lifecycle.md.
"""

from roles.uninstall import uninstall

uninstall()
