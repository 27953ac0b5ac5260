"""qwen27b: turn a host with NVIDIA V100s into a verified OpenAI-compatible endpoint.

    pyinfra inventory/lab.py deploy.py          # plan, install, render, start, verify
    pyinfra inventory/lab.py deploy.py --dry    # print each host's plan, change nothing

Preflight reads facts and decides everything (printed with reasons); a refused host gets no
operations. The roles then run in the order the stack is built. Hosts of the `qwen27b_gateway`
group get the gateway role instead (roles/gateway.py), and its chat page with qwen27b_chat_page
(roles/chat_page.py).
"""

from roles.chat_page import chat_page
from roles.cuda import cuda
from roles.dflash import dflash
from roles.firewall import firewall
from roles.gateway import gateway, gateway_host, gateway_preflight, verify_gateway
from roles.multinode import multinode
from roles.node_exporter import node_exporter
from roles.nvidia import nvidia
from roles._run import release_lock, run_roles, show_planned_operations
from roles.preflight import preflight
from roles.service import service
from roles.takeover import takeover
from roles.toolchain import toolchain
from roles.verify import verify
from roles.vllm import vllm
from roles.weights import weights

ROLES = [toolchain, nvidia, cuda, vllm, dflash, weights, firewall, node_exporter, multinode, takeover, service, verify]

# A host of the qwen27b_gateway group gets the gateway instead: the lab's one OpenAI address in
# front of the other hosts (roles/gateway.py).
gateway_plan = gateway_preflight() if gateway_host() else None
decision = None if gateway_host() else preflight()
if decision is not None:
    planned = run_roles(decision, ROLES)
else:
    planned = gateway_plan is not None and run_roles(gateway_plan, [gateway, chat_page])
if planned:
    # one line for every host, so one operation: a gateway's check below runs after every backend's verify
    release_lock()
    if gateway_plan is not None:
        verify_gateway(gateway_plan)
    show_planned_operations()
