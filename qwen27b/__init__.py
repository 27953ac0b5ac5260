"""qwen27b, one subpackage per place its code runs (a lower one never imports a higher one):

    onhost/      shipped onto the hosts (stdlib + httpx/pynvml/prometheus_client): health check,
                 route guard, fetch, seed server; imports nothing else of ours
    plan/        pure planning on the controller: stack data, gate, planner, host data, fan-out
                 waves; no pyinfra, no host I/O
    controller/  pyinfra-bound controller code: facts, operations, rendering, reports
    tools/       operator commands: `qwen27b bench | doctor | status`, the CPU smoke build

Test machinery (systemd test hosts, recorded hosts) lives in tests/support/, outside the wheel.
"""
