"""qwen27b: turn a host with NVIDIA V100s into a verified OpenAI-compatible endpoint.

    pyinfra inventory/lab.py deploy.py          # plan, install, render, start, verify
    pyinfra inventory/lab.py deploy.py --dry    # print each host's plan, change nothing

Preflight reads facts and decides everything (printed with reasons); a refused host gets no
operations. The roles then run in the order the stack is built. Hosts of the `qwen27b_gateway`
group get the gateway role instead (roles/gateway.py).
"""

from roles.cuda import cuda
from roles.dflash import dflash
from roles.firewall import firewall
from roles.gateway import gateway, gateway_host, gateway_preflight
from roles.node_exporter import node_exporter
from roles.nvidia import nvidia
from roles.preflight import preflight, release_lock, run_roles, show_planned_operations
from roles.service import service
from roles.toolchain import toolchain
from roles.verify import verify
from roles.vllm import vllm
from roles.weights import weights

ROLES = [toolchain, nvidia, cuda, vllm, dflash, weights, firewall, node_exporter, service, verify]

if not gateway_host():
    decision = preflight()
    if decision is not None and run_roles(decision, ROLES):
        release_lock()
        show_planned_operations()

# The qwen27b_gateway group: the lab's one OpenAI address in front of the hosts above (planned
# after them, so a run that deploys both checks the gateway once its backends serve).
if gateway_host():
    plan = gateway_preflight()
    if plan is not None and run_roles(plan, [gateway]):
        release_lock()
        show_planned_operations()
