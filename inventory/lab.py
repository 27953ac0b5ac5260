"""An example lab: two V100 hosts. Copy this file, edit the addresses and data, then run

    pyinfra inventory/lab.py deploy.py --dry     # see each host's plan and why
    pyinfra inventory/lab.py deploy.py -y        # do it

Every `qwen27b_*` key is optional; the defaults (qwen27b/plan/hostdata.py) fit a standard V100 box.
A typo in a key or a wrong type is refused before any host is touched.
"""

v100_hosts = [
    # A 4x V100-SXM2-32GB server: all four GPUs in one tensor-parallel group (the planner's default).
    ("gpu-a.lab", {
        "ssh_hostname": "192.168.10.21",
        "ssh_user": "admin",
        "_sudo": True,
        "qwen27b_bind_address": "192.168.10.21",  # serve on the lab interface only
        "qwen27b_api_key_file": "secrets/gpu-a.key",  # controller-side file, mode 0600
        "qwen27b_metrics_allow": ["192.168.10.5/32"],  # the Prometheus scraper reads /metrics without the key
    }),
    # A workstation with two V100-PCIE-16GB: the planner lowers context/batch to fit, and says so.
    ("gpu-b.lab", {
        "ssh_hostname": "192.168.10.22",
        "ssh_user": "admin",
        "_sudo": True,
        "qwen27b_port": 8001,
        "qwen27b_serve_flags": {"--max-model-len": 4096},  # a pin: the planner checks it fits
        "qwen27b_skip_reboot": True,  # reboot by hand after the driver install
        # no qwen27b_api_key_file: the controller makes the lab key (.qwen27b/api.key beside this file)
    }),
]
