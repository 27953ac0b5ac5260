"""pyinfra's config file: pyinfra reads it (from the directory it runs in) before it loads the
inventory and connects to any host, the one place where qwen27b can be there from the start.

It hooks the run summary to the connection step: a host that cannot be reached is named in the
summary with its SSH error, also when no host at all can be reached (pyinfra then stops before
deploy.py runs). Only runs of this directory's deploy.py are affected (qwen27b/controller/runlife.py). And
for every run (deploy, rollback, uninstall) each SSH connection is set TCP_NODELAY as it is made:
without it each remote command waited up to 40 ms on Nagle's algorithm (controller/remote.no_delay).
"""

from qwen27b.controller.runlife import watch_connections

watch_connections()
