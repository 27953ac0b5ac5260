"""What verify does on a host, decided from the run's plan (pure: no host read, no request): which
check runs, the speculative judge and probe it measures with, and why it cannot run at all.

Which check (issue 48): the figures (a streamed 64-token answer: TTFT, decode tok/s; the speculative
acceptance) belong to a run that changed what serves: the release, the unit and its flags, the env
or key files, the weights or the model link, the on-host code: exactly what makes the service role
restart the service. A run that changed none of it (a no-op re-run) checks liveness only: /health,
the served name in /v1/models with the key, and a 1-token answer from the model; the release's
figures stay those its record holds (roles/verify.py judge_release still judges them).
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from qwen27b.plan.gate import Decision
from qwen27b.plan.addresses import lab_address

FIGURES, LIVENESS = "figures", "liveness"
WHAT_SERVES = ("the release, the unit and its flags, the env and key files, the weights, the model link and the "
               "on-host code")


@dataclass(frozen=True)
class Check:
    """The check verify runs on one service: FIGURES or LIVENESS, and what this run changed that
    serves (empty for liveness; None: not known, so the figures are measured)."""

    kind: str
    changed: tuple[str, ...] | None = None

    @property
    def figures(self) -> bool:
        return self.kind == FIGURES

    def why(self) -> str:
        if self.kind == LIVENESS:
            return "nothing that serves changed"
        if self.changed is None:
            return "what this run changed is not known"
        return f"this run changed {', '.join(self.changed)}"

    def plan_line(self) -> str:
        """The host's plan note: which check verify will run, and why."""
        if self.kind == LIVENESS:
            return (f"verify: a liveness check (/health, /v1/models with the key, a 1-token answer), no new figures: "
                    f"{self.why()} ({WHAT_SERVES})")
        return f"verify: the figures (a streamed 64-token answer: TTFT, tok/s; acceptance when speculating): {self.why()}"


def which_check(changed: tuple[str, ...] | list[str] | None) -> Check:
    """Pure: the check for a service whose restart on this run was decided on `changed` (what the
    service role saw change that serves it, roles/service.py): none -> LIVENESS; some, or None (no
    role said: e.g. a rollback deploy's own verify) -> FIGURES."""
    if changed is None:
        return Check(FIGURES, None)
    return Check(FIGURES, tuple(changed)) if changed else Check(LIVENESS, ())


def changed_names(named_ops) -> list[str]:
    """The names of the (name, operation) pairs whose operation will change the host, each once."""
    return list(dict.fromkeys(name for name, op in named_ops if op.will_change))


def summary_detail(status: str, reason: str, check: str, changed: list[str] | None, ttft_s: float | None,
                   decode_tok_s: float | None) -> str:
    """Pure: the run summary's detail for one verified row: an ok row says which check ran (and the
    figures it measured), then its reason if any; any other row, its reason."""
    if status != "ok" or check not in (FIGURES, LIVENESS):
        return reason
    if check == LIVENESS:
        said = "liveness check (nothing that serves changed): /health, /v1/models, a 1-token answer; no new figures"
    else:
        what = f"{', '.join(changed)} changed" if changed else "what changed is not known"
        measured = (f"TTFT {ttft_s * 1000:.0f} ms, {decode_tok_s or 0:.1f} tok/s" if ttft_s is not None
                    else "not measured")
        said = f"figures measured ({what}): {measured}"
    return f"{said}; {reason}" if reason else said


def spec_judge(decision: Decision, tried: list[str] | tuple = ()):
    """The fallback decision (plan/engine.py fallback) for this host's method, as verify's judge.
    `tried`: the methods this deploy already dropped."""
    spec = decision.serve.spec
    if not spec.on:
        return None
    from qwen27b.plan import engine
    from qwen27b.plan.checkpoint import load_shape
    from qwen27b.plan.stack import checkpoint_metadata_dir
    target = load_shape(checkpoint_metadata_dir(decision.stack.model))
    serve = decision.serve
    tp = int(serve.value("--tensor-parallel-size")) if serve.has("--tensor-parallel-size") else 1
    max_len = int(serve.value("--max-model-len"))
    return functools.partial(engine.fallback, decision.stack, target, spec, list(tried), tp, max_len)


def spec_probe(decision: Decision) -> dict | None:
    """The stack's measuring completion for this host's method (speculative.<method>.probe), if any."""
    spec = decision.serve.spec
    return (decision.stack.speculative.get(spec.method) or {}).get("probe") if spec.on else None


def probe_address(bind: str, data: dict) -> str | None:
    """Where the controller sends its requests (and the API key) for a service bound to `bind`: that
    address, or for the wildcard (0.0.0.0, ::) the host's lab address (ssh_hostname), never the
    wildcard itself, which from the controller is the controller (issue 51: the key would go to
    whatever listens there); None where the lab address is not an IP."""
    if not ipaddress.ip_address(bind).is_unspecified:
        return bind
    return lab_address(data)


def unverifiable(decision: Decision, data: dict | None = None) -> str | None:
    """Why verify cannot run from the controller (the service listens on loopback only, or on the
    wildcard of a host whose lab address is a name), or None."""
    address = decision.serve.value("--host")
    if ipaddress.ip_address(address).is_unspecified and probe_address(address, data or {}) is None:
        return (f"not verified: the service listens on {address} (every address) and the host's lab address is "
                "not an IP (ssh_hostname), so the controller has no address to send the key to; set "
                "qwen27b_bind_address to the lab address")
    if not ipaddress.ip_address(address).is_loopback:
        return None
    return (f"not verified: the service listens on {address} only, which the controller cannot reach; set "
            "qwen27b_bind_address to an address the controller reaches")
