"""Copies on one machine (qwen27b_instances): the templated unit qwen27b@NAME.service, each copy's env
file, health check and timer, and the host's one health endpoint answering each copy. Built from the
one-service host's contexts (controller/render.py), changed where a copy differs. Cut from
controller/render.py (issue 50).
"""

from __future__ import annotations

from qwen27b.controller.render import (HEALTH_HTTP_SERVICE, contexts, endpoint_context, health_context, render,
                                       service_env, serving_gpus, warmup_argv)
from qwen27b.controller.unitwords import env_value, layout, systemd_quote, unit_text
from qwen27b.onhost.contract import COPIES_ENV, COPY_ENV, GPUS_ENV, HEALTH_HTTP_SOCKET, INSTANCE_TEMPLATE, SLOTS_ENV
from qwen27b.plan.gate import Decision
from qwen27b.plan.hostdata import http_base
from qwen27b.plan.hostlayout import HostLayout

INSTANCE_UNIT = INSTANCE_TEMPLATE  # one template; qwen27b@NAME.service per copy, %i its name
SERVE_ARGS_ENV = "QWEN27B_SERVE_ARGS"  # the copy's vLLM flags, split at spaces by systemd ($VAR)
URL_ENV = "QWEN27B_URL"  # where the copy answers: its readiness check
INSTANCE_LEFT_OFF = [("RemoveIPC= is off", "it removes every IPC object of the user when one copy stops: the "
                                           "other copies run as the same user")]


def instance_unit(name: str) -> str:
    return f"qwen27b@{name}.service"


def instance_files(paths: dict, name: str) -> dict[str, str]:
    """A copy's own files: its env file (GPUs, flags, URL) and its API key's 0600 env file."""
    at = HostLayout.of(paths)
    return {"env_file": at.instance_env_file(name), "secrets_file": at.instance_api_key_env_file(name)}


def instance_contexts(decision: Decision, prefix: str = "") -> dict[str, dict]:
    """The templated unit (the same for every copy: rendered from the first) and each copy's env file,
    keyed 'qwen27b@.service.j2' and 'NAME.env'. The unit is qwen27b.service.j2 with the copy's files
    named by %i, its flags and URL from its env file, and RemoveIPC= off (INSTANCE_LEFT_OFF)."""
    (_, first), paths = decision.copies[0], decision.stack.paths
    unit = dict(contexts(first, prefix)["qwen27b.service.j2"])
    unit.update({key: prefix + value for key, value in instance_files(paths, "%i").items()})
    unit["served_name"] = f"copy %i of {unit['served_name']}"
    unit["exec_start"] = [unit["exec_start"][0], f"${SERVE_ARGS_ENV}"]
    # the URL from the copy's env file (systemd expands ${VAR} as one word); the model from /v1/models
    url = f"${{{URL_ENV}}}"
    unit["ready_check"] = " ".join(arg if arg == url else systemd_quote(arg)
                                   for arg in warmup_argv(first, layout(first, prefix), url, None))
    unit["hardening"] = [line for line in unit["hardening"] if line[0] != "RemoveIPC"]
    unit["left_off"] = unit["left_off"] + [f"{what}: {why}" for what, why in INSTANCE_LEFT_OFF]
    out = {"qwen27b@.service.j2": unit}
    for instance, copy in decision.copies:
        where = {**layout(copy, prefix), **{k: prefix + v for k, v in instance_files(paths, instance.name).items()}}
        serve = copy.serve
        env = sorted(service_env(copy, where) + [
            (SERVE_ARGS_ENV, env_value(" ".join(serve.argv()))),
            (URL_ENV, env_value(http_base(serve.value('--host'), serve.value('--port'))))])
        out[f"{instance.name}.env"] = {"env": env, "secrets_file": where["secrets_file"]}
    return out


def copy_health_units(name: str) -> tuple[str, str]:
    """A copy's health check and its timer: qwen27b-health@NAME.service/.timer, each its own unit file
    (systemd prefers an instance's own file to a template; each copy's check differs in URL, key,
    GPUs and files, so there is no shared template to fill from %i)."""
    return f"qwen27b-health@{name}.service", f"qwen27b-health@{name}.timer"


def copy_health_files(paths: dict, name: str) -> dict[str, str]:
    """A copy's health status file and the restart request its check leaves for the unit's root
    ExecStopPost (the one-service host's: health.json, health-restart.request)."""
    at = HostLayout.of(paths)
    return {"health_status": at.copy_health_status(name), "restart_request": at.copy_restart_request(name)}


def instance_health_contexts(decision: Decision, prefix: str = "") -> dict[str, dict]:
    """Each copy's health unit and timer context (qwen27b-health.*.j2), keyed by copy name: the check
    of qwen27b@NAME.service at the copy's URL with its key, reading only its GPUs (GPUS_ENV) and
    writing its own status file, restart request and metrics file labelled copy=NAME (COPY_ENV)."""
    out, paths = {}, decision.stack.paths
    for instance, copy in decision.copies:
        where = {**layout(copy, prefix), **{k: prefix + v for k, v in instance_files(paths, instance.name).items()},
                 **{k: prefix + v for k, v in copy_health_files(paths, instance.name).items()}}
        serve, model = copy.serve, decision.stack.model
        env = [(COPY_ENV, instance.name)] + ([(GPUS_ENV, ",".join(str(g.index) for g in serving_gpus(copy)))]
                                             if copy.gpus else [])
        # what the copy runs at once, for /health/NAME and the gateway's fair share (digits only)
        env += [(SLOTS_ENV, seqs) for seqs in [serve.value("--max-num-seqs")] if seqs and seqs.isdigit()]
        health = health_context(copy, where, instance_unit(instance.name), copy_health_units(instance.name)[0],
                                http_base(serve.value("--host"), serve.value("--port")),
                                serve.value("--served-model-name"), unit_text(f"{model['id']}@{model['revision']}"),
                                tuple(env))
        out[instance.name] = health
    return out


def instance_endpoint_context(decision: Decision, prefix: str = "") -> dict:
    """The health endpoint of a host serving copies: one socket on qwen27b_health_port at the copies'
    address, answering each copy on /health/NAME from its status file (COPIES_ENV: the names,
    allow-listed by copykeys.INSTANCE_NAME)."""
    _, first = decision.copies[0]
    endpoint = endpoint_context(first, layout(first, prefix), first.serve.value("--host"))
    endpoint["environment"] = [(COPIES_ENV, ",".join(i.name for i, _ in decision.copies))]
    # never a key: each copy's key file is out of its reach too, as the host's is
    endpoint["hardening"] = endpoint["hardening"] + [
        ("InaccessiblePaths", f"-{prefix}{instance_files(decision.stack.paths, i.name)['secrets_file']}")
        for i, _ in decision.copies]
    return endpoint


def render_instances(decision: Decision, prefix: str = "") -> dict[str, str]:
    """'qwen27b@.service', 'NAME.env', 'qwen27b-health@NAME.service' and '.timer', the health endpoint's
    socket and service -> rendered text (the unit from qwen27b.service.j2, each copy's health units
    from qwen27b-health.*.j2, the endpoint from qwen27b-health-http*.j2)."""
    ctx = instance_contexts(decision, prefix)
    out = {INSTANCE_UNIT: render("qwen27b.service.j2", ctx.pop("qwen27b@.service.j2"))}
    out.update({name: render("qwen27b.env.j2", c) for name, c in ctx.items()})
    for name, health in instance_health_contexts(decision, prefix).items():
        unit, timer = copy_health_units(name)
        out[unit] = render("qwen27b-health.service.j2", health)
        out[timer] = render("qwen27b-health.timer.j2", health)
    endpoint = instance_endpoint_context(decision, prefix)
    out[HEALTH_HTTP_SOCKET] = render("qwen27b-health-http.socket.j2", endpoint)
    out[HEALTH_HTTP_SERVICE] = render("qwen27b-health-http@.service.j2", endpoint)
    return out
