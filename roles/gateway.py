"""Gateway: the lab's one OpenAI address, on the hosts of the `qwen27b_gateway` group (and only the
gateway there: no GPU role). nginx's upstream module in front of every qwen27b backend of the
inventory (docs/scale-out.md: why nginx, measured beside vllm-router), with qwen27b-gateway-pool
keeping the pool from each backend's health and drains.

- nginx from the OS archive (`nginx`; an air-gapped lab's apt mirror has it), run by our own
  hardened unit `qwen27b-gateway.service` (root master, workers as qwen27b-gateway); the
  package's own `nginx.service` (its default site on :80) is stopped and disabled;
- the pool watcher: the on-host package pushed by content to /opt/qwen27b-gateway/lib, run by the
  system python3 (standard library only);
- config rendered from the GatewayPlan (plan/gateway.py checked it across the inventory); the
  client keys and the backends' key in one root 0600 include written as a secret (never argv,
  logs or --diff);
- usage per key name counted from the responses by nginx's Lua module (libnginx-mod-http-lua, the
  OS archive's; qwen27b/onhost/qwen27b_gateway_usage.lua), exported on loopback :9121;
- with qwen27b_gateway_tls_*: the certificate and its key (a secret) beside the config, nginx
  listening `ssl`; the lab CA's pair is made and kept on the controller (controller/labca.py);
- a changed config or key reloads nginx (graceful: requests in flight finish), a changed unit
  restarts it; then the controller checks the gateway: no key refused, /v1/models lists the served
  name once, a streamed completion through it (over https against the lab CA or the admin's
  certificate when it speaks TLS).
"""

from __future__ import annotations

import json
import urllib.error
from dataclasses import replace
from io import StringIO

import click
from pyinfra import host, state
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, python, server, systemd

from qwen27b.controller import apikey
from qwen27b.controller import chat_page_render as P
from qwen27b.controller import gateway_render as G
from qwen27b.controller import postdeploy as V
from qwen27b.controller import runstate
from qwen27b.controller.artifacts import source_manifest
from qwen27b.controller.operations import directories, push_files, secret_file
from qwen27b.controller.runlife import BadInventory, inventory_file, inventory_settings
from qwen27b.onhost.secretfile import load_secret
from qwen27b.controller import oporder
from qwen27b.plan.gate import RefusedHost
from qwen27b.plan.gateway import GatewayPlan, is_gateway, plan_gateways
from qwen27b.plan.stack import load_stack

from ._common import check, dry_run, note
from ._common import ONHOST_SOURCE, apt_install, service_user, started
from ._firewall import apply_firewall
from ._run import refuse, take_lock

READY_TIMEOUT_S = 900  # the backends of the same run load their weights first (minutes on V100)
PAGE_READY_TIMEOUT_S = 300  # Open WebUI's first start: imports and its database migrations (25-60 s here)


def gateway_host() -> bool:
    """Is this host in the gateway group (it then gets the gateway role only)?"""
    return is_gateway(host.groups)


def gateway_preflight() -> GatewayPlan | None:
    """The preflight of a gateway host: the whole inventory validated (gateways and their backends
    included), this host's plan printed, the host's deploy lock taken; None when another deploy
    holds the lock. No GPU facts are read: the gate is for serving hosts."""
    oporder.register_deploy_file(state.current_deploy_filename)
    settings = inventory_settings()
    inventory = [(h.name, dict(h.data.dict())) for h in state.inventory]
    plan = plan_gateways(inventory, {h.name: set(h.groups) for h in state.inventory}, settings)[host.name]
    if plan.chat_page:
        plan = _chat_page_secrets(plan)
    plan = _verify_key(plan)
    lines = plan.describe()
    note(f"== {host.name}: {lines[0]}\n")
    budgets = [c.name for c in plan.named_clients() if c.tokens_per_day]
    if budgets and not _usage_available()[0]:  # a limit nothing would enforce: refused, not ignored
        refuse(RefusedHost(host.name, f"tokens_per_day is set for {', '.join(budgets)}, but this host's OS archive has "
                           "no nginx Lua module to count tokens (stack tools.nginx_lua)",
                           "remove tokens_per_day from qwen27b_gateway_key_files, or run the gateway on one of: "
                           + ", ".join(load_stack()["tools"]["nginx_lua"]["on"])))
        return None
    return plan if take_lock() else None


def _chat_page_secrets(plan: GatewayPlan) -> GatewayPlan:
    """The chat page's secret files on the controller, made once (controller/apikey.py): the plan
    carries their directory, never a value."""
    directory = apikey.chat_page_dir(inventory_file(), host.name)
    try:
        made = apikey.ensure_chat_page(directory)
    except OSError as error:
        raise BadInventory(f"the chat page's secrets cannot be made at {directory}: {error.strerror}. Fix: set "
                           f"{apikey.STATE_ENV} to a writable directory") from None
    if made:
        note(f"chat page: made {', '.join(made)} in {apikey.shown(directory)} (0600)", always=True)
    return replace(plan, chat_page=replace(plan.chat_page, secrets_dir=str(directory)))


def _verify_key(plan: GatewayPlan) -> GatewayPlan:
    """The gateway's own key for the deploy's verify, on the controller (made once): its requests
    count under plan.VERIFY, never in the first client's usage or against her limits."""
    try:
        path, _ = apikey.ensure_gateway_verify(apikey.gateway_dir(inventory_file(), host.name))
    except OSError as error:
        raise BadInventory(f"the gateway's verify key cannot be made: {error.strerror}. Fix: set "
                           f"{apikey.STATE_ENV} to a writable directory") from None
    return replace(plan, verify_key_file=str(path))


def _directories() -> list[list[str]]:
    where = G.layout()
    return [[G.CONFIG_DIR, "root", "root", "0755"], [G.STATE_DIR, "root", "root", "0755"],
            [where["temp_dir"], "root", "root", "0755"], [where["drain_dir"], "root", "root", "0700"],
            [where["usage_dir"], G.USER, G.USER, "0700"],  # the usage counters, written by nginx's workers
            [G.LIB_DIR.rsplit("/", 1)[0], "root", "root", "0755"], [G.LIB_DIR, "root", "root", "0755"]]


def _usage_available() -> tuple[bool, str]:
    """(whether this gateway counts tokens per key, the plan's line saying so): nginx's Lua module
    where the host's OS archive has it (stack tools.nginx_lua)."""
    meta = (host.get_fact(LinuxDistribution) or {}).get("release_meta") or {}
    return G.usage_verdict(load_stack()["tools"]["nginx_lua"], meta.get("ID"), meta.get("VERSION_ID"))


def gateway(plan: GatewayPlan) -> None:
    where = G.layout()
    usage_on, usage_line = _usage_available()
    for line in plan.describe()[1:] + [usage_line]:
        note(line)
    new_module = False  # a module nginx did not load before is loaded by a restart, not a reload
    if usage_on:
        new_module = apt_install("nginx, its Lua module and python3 (the gateway)", ["nginx", G.LUA_PACKAGE, "python3"],
                                 no_recommends=True)
    else:
        apt_install("nginx and python3 (the gateway)", ["nginx", "python3"], no_recommends=True)
    systemd.service(name=f"the package's {G.DISTRO_UNIT} stopped and disabled (the gateway has its own unit)",
                    service=G.DISTRO_UNIT, running=False, enabled=False)
    service_user(G.USER, G.STATE_DIR)
    directories(name="gateway directories (owner, group, mode)", specs=_directories())
    apply_firewall(G.firewall_contexts(plan))  # qwen27b_firewall_allow: before nginx listens on a new port
    code = push_files(name="on-host code (qwen27b-gateway-pool)", src_dir=str(ONHOST_SOURCE),
                      dest_dir=f"{G.LIB_DIR}/qwen27b_onhost", manifest=source_manifest(ONHOST_SOURCE), remove_extra=True)
    usage = files.put(name=f"usage per key (nginx's Lua module) {where['usage_lua']}",
                      src=str(ONHOST_SOURCE / G.USAGE_LUA), dest=where["usage_lua"], user="root", group="root",
                      mode="0644", create_remote_dir=False) if usage_on else \
        files.file(name=f"no usage code (no Lua module here) {where['usage_lua']}", path=where["usage_lua"], present=False)
    tls = _tls_files(plan, where)  # before the config that names them (a pool reload in between reads it)
    written = {path: files.put(name=f"render {path}", src=StringIO(text), dest=path, user="root", group="root",
                               mode="0644", create_remote_dir=False)
               for path, text in G.render_gateway(plan, usage_on).items()}
    keys = secret_file(name="gateway client keys and the backends' key (0600)", dest=where["keys"],
                       content=G.keys_text(plan))
    units = [written[where["gateway_unit"]], written[where["pool_unit"]]]
    if any(op.will_change for op in units):
        systemd.daemon_reload(name="systemd daemon-reload (a gateway unit changed)")
    pool_changed = code.will_change or written[where["pool_config"]].will_change or units[1].will_change
    started(G.POOL_UNIT, restart=pool_changed, why="its code, config or unit changed")
    if units[0].will_change or new_module:
        started(G.GATEWAY_UNIT, restart=True, why="its unit changed" if units[0].will_change else
                "nginx's Lua module was installed (a module loads at start)")
    elif written[where["config"]].will_change or keys.will_change or tls or usage.will_change or pool_changed:
        # nginx's graceful reload (ExecReload: config test, then SIGHUP): requests in flight finish
        systemd.service(name=f"enable {G.GATEWAY_UNIT}", service=G.GATEWAY_UNIT, running=None, enabled=True)
        server.shell(name=f"reload {G.GATEWAY_UNIT} (config or keys changed; graceful)",
                     commands=[f"systemctl reload-or-restart {G.GATEWAY_UNIT}"])
    else:
        started(G.GATEWAY_UNIT, restart=False, why="")


def _tls_files(plan: GatewayPlan, where: dict) -> bool:
    """The certificate (0644) and its key (a secret: root 0600, never in --diff) when the gateway
    speaks TLS; removed when it no longer does. Whether either changes (nginx then reloads)."""
    pair = G.tls_pair(plan)
    if pair is None:
        gone = files.file(name="no TLS certificate (plain HTTP)", path=where["tls_cert"], present=False)
        key_gone = files.file(name="no TLS key (plain HTTP)", path=where["tls_key"], present=False)
        return gone.will_change or key_gone.will_change
    cert = files.put(name=f"TLS certificate {where['tls_cert']}", src=StringIO(pair[0].decode()), dest=where["tls_cert"],
                     user="root", group="root", mode="0644", create_remote_dir=False)
    key = secret_file(name="TLS key (0600)", dest=where["tls_key"], content=pair[1].decode())
    return cert.will_change or key.will_change


def verify_gateway(plan: GatewayPlan) -> None:
    """The controller's check of the gateway, as a client. deploy.py queues it after the run's
    unlock, an operation every host shares: pyinfra orders each host's operations and merges the
    hosts level by level, so only a shared operation makes this wait for the backends' verify
    (queued earlier, it would hold the run while their services were not even rendered)."""
    if not dry_run():
        python.call(name="verify: the gateway refuses no key, lists one model, streams a completion",
                    function=_check, plan=plan)


@check
def _check(plan: GatewayPlan) -> None:
    """From the controller, as a client: the gateway's own refusal, then one backend through it."""
    from pyinfra.api.exceptions import OperationError

    address = f"[{plan.address}]" if ":" in plan.address else plan.address
    base = f"{plan.scheme}://{address}:{plan.port}"
    if plan.tls:  # verified as a client would: against the lab CA, or the admin's certificate
        V.trust(base, _trust_anchor(plan))
    result = V.HostResult(host.name, model="gateway", served_name=plan.served_name or "", url=base)
    runstate.current().results.append(result)
    if not plan.verify_key_file:  # the preflight sets it: a client's key would count in her usage and limits
        raise OperationError("gateway verify: no verify key in the plan (the gateway's preflight makes it)")
    key = load_secret(plan.verify_key_file)

    def say(message: str) -> None:
        click.echo(f"    [{host.name}] {message}", err=True)

    try:
        # /health is proxied to the pool: 200 once a backend of this run has loaded its weights
        result.ready_s = V.wait_ready(base, READY_TIMEOUT_S, say)
        if _status(f"{base}/v1/models", None) != 401:
            raise V.VerifyFailed("the gateway does not refuse a request without a key")
        names = [m["id"] for m in _get(f"{base}/v1/models", key)["data"]]
        if len(names) != 1 or (plan.served_name and names != [plan.served_name]):
            raise V.VerifyFailed(f"/v1/models through the gateway lists {names}, not the one served name")
        result.served_name = names[0]
        chat = V.chat_stream(base, names[0], key, max_tokens=16)
        result.ttft_s, result.decode_tok_s = chat["ttft_s"], chat["decode_tok_s"]
        result.completion_tokens, result.status = chat["completion_tokens"], "ok"
        say(f"gateway verified: {names[0]} through {base}, TTFT {result.ttft_s * 1000:.0f} ms")
        if plan.chat_page:
            _check_page(plan, names[0], say)
    except V.VerifyFailed as failure:
        result.status, result.reason = "failed", str(failure)
        raise OperationError(f"gateway verify failed: {failure}") from None


def _trust_anchor(plan: GatewayPlan) -> str:
    """What a client of this gateway trusts: the lab CA's certificate, or the admin's certificate file."""
    return f"{plan.tls.lab_ca_dir}/ca.crt" if plan.tls.lab_ca_dir else plan.tls.cert_file


def _check_page(plan: GatewayPlan, served: str, say) -> None:
    """The chat page as its admin meets it: up behind nginx, the admin signs in, the page lists the
    served model (its requests reach the gateway with the page's key)."""
    base = P.page_url(plan)
    if plan.tls:
        V.trust(base, _trust_anchor(plan))
    V.wait_ready(base, PAGE_READY_TIMEOUT_S, lambda line: say(line.replace("loading weights", "chat page starting")))
    password = load_secret(str(P.password_file(plan)))
    try:
        with V._request(f"{base}/api/v1/auths/signin", body={"email": plan.chat_page.admin_email,  # noqa: SLF001
                                                             "password": password}) as response:
            token = json.load(response)["token"]
    except (urllib.error.HTTPError, OSError, ValueError, KeyError) as error:
        raise V.VerifyFailed(f"the chat page's admin {plan.chat_page.admin_email} cannot sign in at {base}: {error} "
                             f"(an earlier admin password stays the page's: see {P.password_file(plan)})") from None
    models = [m.get("id") for m in _get(f"{base}/api/models", token).get("data", [])]
    if served not in models:
        raise V.VerifyFailed(f"the chat page at {base} lists {models}, not {served}: it does not reach the gateway")
    say(f"chat page verified: {base}/ (the admin signs in; it lists {served})")


def _status(url: str, key: str | None) -> int:
    try:
        with V._request(url, key) as response:  # noqa: SLF001 (the verifier's one request helper)
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        raise V.VerifyFailed(f"GET {url} failed: {error}") from None


def _get(url: str, key: str) -> dict:
    try:
        with V._request(url, key) as response:  # noqa: SLF001
            return json.load(response)
    except urllib.error.HTTPError as error:
        raise V.VerifyFailed(f"GET {url} answered {error.code}") from None
    except (OSError, ValueError) as error:
        raise V.VerifyFailed(f"GET {url} failed: {error}") from None
