"""Only the weights part of deploy.py, for benchmarks/fanout.py: preflight (facts, gate, plan)
then the weights role, so the benchmark times the checkpoint's placement and nothing else (the full
deploy pip-installs an 878 MiB wheelhouse per host first).

    PYTHONPATH=. pyinfra INVENTORY benchmarks/fanout_deploy.py -y
"""

from roles.preflight import preflight
from roles.weights import weights

try:  # the host deploy lock, where this tree has it (roles/_run.py since issue 50, roles/preflight.py before)
    from roles._run import release_lock
except ImportError:  # pragma: no cover
    try:
        from roles.preflight import release_lock
    except ImportError:
        release_lock = None

decision = preflight()
if decision is not None:
    weights(decision)
    if release_lock is not None:
        release_lock()
