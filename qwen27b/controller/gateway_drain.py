"""Drain a backend at every gateway of an inventory, and let it return: the seam a rolling upgrade
uses around each backend's restart (`qwen27b rollout`; by hand: `qwen27b gateway drain|undrain`).

    from qwen27b.controller import gateway_drain
    gateway_drain.drain("inventory/lab.py", "gpu-a")      # out of every gateway's pool; its requests done
    ...                                                   # restart / upgrade gpu-a, verify it
    gateway_drain.undrain("inventory/lab.py", "gpu-a")    # back, and (by default) in the pool again

Each gateway host runs `qwen27b-gateway-pool drain NAME --wait S` (qwen27b/onhost/gateway_pool.py)
through pyinfra's own connector for that host (controller/remote.py: ssh user, key, sudo as the
deploy has them), all gateways at once: the backend leaves nginx's pool by a graceful reload and
the call returns once the nginx workers that could still hold one of its requests have exited.
No admin port is opened on the gateway for this: who may drain is who may SSH to it.

An inventory without a gateway drains nothing (an empty list): a rollout calls this in any lab.
pyinfra's connectors patch the process they run in (gevent): call this from a pyinfra-style
process, not one with threads of its own (tests/e2e/test_scaleout_gateway.py goes through the CLI).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field

from qwen27b.controller import gateway_render as G
from qwen27b.controller import remote
from qwen27b.plan.gateway import is_gateway


class GatewayDrainError(RuntimeError):
    """A gateway could not be reached, or did not drain (or take back) the backend in time."""


@dataclass
class PoolAnswer:
    gateway: str
    ok: bool
    record: dict = field(default_factory=dict)  # what the gateway printed (JSON)
    error: str | None = None
    seconds: float = 0.0


def pool_command(*args: str) -> str:
    where = G.layout()
    return " ".join(["PYTHONPATH=" + shlex.quote(where["lib_dir"]), G.PYTHON, "-m", G.POOL_MODULE, "--config",
                     shlex.quote(where["pool_config"]), *(shlex.quote(a) for a in args)])


def _gateways(inventory: str):
    state, hosts = remote.load_inventory(inventory)
    return state, [h for h in hosts if is_gateway(h.groups)], [h.name for h in hosts]


def _on_gateways(inventory: str, args: list[str], timeout: int, backend: str | None = None) -> list[PoolAnswer]:
    state, gateways, names = _gateways(inventory)
    # a copy of qwen27b_instances is the backend HOST.NAME (qwen27b.plan.gateway)
    if backend is not None and backend not in names and backend.rpartition(".")[0] not in names:
        raise GatewayDrainError(f"{backend} is not a host of {inventory} (nor HOST.COPY, a copy of one)")
    if not gateways:
        return []
    answers = remote.run_everywhere(state, gateways, lambda _: pool_command(*args), timeout=timeout)
    out = []
    for answer in answers:
        line = (answer.stdout.strip().splitlines() or [""])[-1]
        try:
            record = json.loads(line) if line else {}
        except ValueError:
            record = {}
        error = answer.error or (None if answer.ok else (answer.stderr.strip() or line or "failed")[-300:])
        out.append(PoolAnswer(answer.host, answer.ok and answer.error is None, record, error, answer.seconds))
    return out


def _raise_unless_ok(what: str, answers: list[PoolAnswer]) -> list[PoolAnswer]:
    bad = [a for a in answers if not a.ok]
    if bad:
        raise GatewayDrainError(f"{what}: " + "; ".join(f"{a.gateway}: {a.error}" for a in bad))
    return answers


def drain(inventory: str, backend: str, wait_s: float = 600, check: bool = True) -> list[PoolAnswer]:
    """`backend` out of every gateway's pool, its requests in flight finished (up to wait_s each;
    a gateway still busy then is an error when `check`)."""
    answers = _on_gateways(inventory, ["drain", backend, "--wait", str(wait_s)], int(wait_s) + 60, backend)
    return _raise_unless_ok(f"drain {backend}", answers) if check else answers


def undrain(inventory: str, backend: str, wait_in_pool_s: float = 300, check: bool = True) -> list[PoolAnswer]:
    """Let `backend` return; then wait (up to wait_in_pool_s, 0: not at all) until every gateway has
    it in its pool again, i.e. it answers healthy, so a rollout never has two backends out at once."""
    answers = _on_gateways(inventory, ["undrain", backend], 60, backend)
    if check:
        _raise_unless_ok(f"undrain {backend}", answers)
    deadline = time.monotonic() + wait_in_pool_s
    while wait_in_pool_s and answers and not all(backend in a.record.get("pool", []) for a in answers):
        if time.monotonic() > deadline:
            out = [a.gateway for a in answers if backend not in a.record.get("pool", [])]
            if check:
                raise GatewayDrainError(f"undrain {backend}: not back in the pool of {', '.join(out)} after "
                                        f"{wait_in_pool_s:.0f} s (is it healthy? qwen27b gateway status)")
            break
        time.sleep(1)
        answers = status(inventory)
    return answers


def usage(inventory: str, since: str = "1d") -> list[PoolAnswer]:
    """Every gateway's usage per key name over the window (`qwen27b-gateway-pool usage`)."""
    return _on_gateways(inventory, ["usage", "--since", since], 300)


def status(inventory: str) -> list[PoolAnswer]:
    """Every gateway's pool record: pool, drained, counts (rounds healthy > 0 / unhealthy < 0)."""
    return _on_gateways(inventory, ["status"], 60)
