"""The gateway: one OpenAI address for the lab, in front of every qwen27b backend.

A host of the inventory group `qwen27b_gateway` gets the gateway role only (nginx, its pool
watcher; no GPU role). Its backends are the other hosts of the inventory (or the names in
`qwen27b_gateway_backends`): each one's address and ports come from its own host data, as its
deploy reads them. Everything the gateway needs from the backends is checked here, across the
inventory, before any host is touched: a mistake names the host, the key and the fix.

Pure: host data and settings in, a GatewayPlan out (no pyinfra, no host I/O; the key files are
read on the controller, as hostdata reads them).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

from qwen27b.onhost.secretfile import load_secret
from qwen27b.plan.chatpage import HOUSEKEEPING, ChatPage, plan_chat_page
from qwen27b.plan.hostdata import PREFIX, BadHostData, Settings
from qwen27b.plan.settings import GATEWAY_KEYS
from qwen27b.plan.urlsecret import SECRET_NAMES, check_secret_file
from qwen27b.plan.copykeys import instances_of
from qwen27b.plan.addresses import lab_address, parse_address, parse_network

GROUP = "qwen27b_gateway"
DEFAULT_PORT = 8000
USAGE_PORT = 9121  # the usage counters in Prometheus' text format (loopback; the gateway's address for metrics_allow)
# The routes a client key reaches (issue 51): the OpenAI routes a client needs, whose answers carry
# `usage` as prompt_tokens/completion_tokens (what the gateway counts and budgets). Everything else a
# backend serves is the backends' own (/tokenize, /scale_elastic_ep, /inference/v1/abort_requests,
# stored responses, LoRA loading) and would run with the backends' key: 404. /v1/responses and
# /v1/messages report usage in another shape (input_tokens/output_tokens), not counted yet: refused.
CLIENT_ROUTES = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# the backends' /metrics through the gateway: with a client key, from qwen27b_gateway_metrics_allow
# (and loopback) only, the networks named as the lab's scrapers
SCRAPER_ROUTES = ("/metrics",)
VERIFY = "qwen27b-verify"  # the name the deploy's own verify requests count under (its own key, never a client's)
DEFAULT_REQUEST_TIMEOUT_S = 600  # a long generation on a loaded V100; also a drain's longest wait
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclass(frozen=True)
class Backend:
    name: str  # the inventory host name (what `drain NAME` takes); a copy's: HOST.NAME
    address: str  # where vLLM listens: qwen27b_bind_address, else the host's lab address
    port: int  # qwen27b_port, or the copy's port
    health_port: int  # qwen27b_health_port (qwen27b-health-http: 200 OK/WARNING, 503 CRITICAL/STALE)
    health_path: str = "/health"  # a copy's verdict: /health/NAME on its host's endpoint
    key_file: str | None = field(default=None, compare=False)  # the key file it serves with (the copy's, or the host's)
    # what the deploy adds to this host's allow-lists for the gateway (key -> network; plan line, gateway_needs)
    added: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    host: str = field(default="", compare=False)  # the inventory host (a copy's: HOST of HOST.NAME)


@dataclass(frozen=True)
class Client:
    """A client key of the gateway: its name (in the request log, the limits, the 429's message; never
    the key), its controller-side file, and its limits (None: none)."""
    name: str
    key_file: str
    requests_per_minute: int | None = None  # more in a minute: 429 with Retry-After
    concurrent: int | None = None  # more requests at once: 429 (one key cannot take every slot)
    tokens_per_day: int | None = None  # prompt + completion tokens a UTC day; over it: 429 until midnight

    def describe(self) -> str:
        limits = [f"{self.requests_per_minute} requests/min" if self.requests_per_minute else "",
                  f"{self.concurrent} at once" if self.concurrent else "",
                  f"{self.tokens_per_day} tokens/day" if self.tokens_per_day else ""]
        return f"{self.name} ({', '.join(x for x in limits if x) or 'no limit'})"


CLIENT_FIELDS = {"file": str, "name": str, "requests_per_minute": int, "concurrent": int, "tokens_per_day": int}
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def key_name(path: str) -> str:
    """A key file's default name: its file name less the extension (secrets/team-a.key: team-a)."""
    return os.path.splitext(os.path.basename(path))[0]


@dataclass(frozen=True)
class Tls:
    """How the gateway speaks TLS: the admin's certificate and key files, or a lab CA kept by
    qwen27b on the controller in `lab_ca_dir` (controller/labca.py) that signs one for its address."""
    cert_file: str | None = None
    key_file: str | None = None
    lab_ca_dir: str | None = None

    def describe(self) -> str:
        if self.lab_ca_dir:
            return (f"TLS: a certificate for its address signed by the lab CA in {self.lab_ca_dir} (made once, kept); "
                    f"clients trust {self.lab_ca_dir}/ca.crt (the openai client and httpx: SSL_CERT_FILE=PATH; "
                    "curl --cacert PATH)")
        return f"TLS: the certificate {self.cert_file} and its key (0600 on the gateway, never in a log)"


# who reads the logged bodies and for how long (issue 51): the plan's line with qwen27b_gateway_log_bodies
BODIES_REACH = ("qwen27b_gateway_log_bodies: each request's body and the start of its answer, on a line of their own "
                "(tag qwen27b_gateway_bodies), are readable by root and the groups systemd-journal and adm (the "
                "journal's readers; adm by the journal's ACL on Debian and Ubuntu) for as long as journald keeps "
                "the journal (no time limit by default: until it fills SystemMaxUse, 10% of its filesystem up to "
                "4 GiB; journald.conf MaxRetentionSec= bounds it), and where rsyslog runs, by group adm in "
                "/var/log/syslog until logrotate drops it (a week to a month by the OS's default)")


@dataclass(frozen=True)
class GatewayPlan:
    host: str
    address: str  # the gateway's listen address (and the source its probes come from)
    port: int
    key_files: tuple[str, ...]  # controller-side client key files
    backends: tuple[Backend, ...]
    backend_key_file: str | None  # the backends' shared qwen27b_api_key_file, None when they have none
    served_name: str | None  # the backends' qwen27b_served_model_name (None: their profile's default)
    request_timeout_s: int
    tls: Tls | None = None  # None: plain HTTP (the plan warns)
    clients: tuple[Client, ...] = ()  # the keys' names and limits; () : key_files named by their file names
    metrics_allow: tuple[str, ...] = ()  # networks whose Prometheus may read the usage counters (:9121)
    fair_share: bool = False  # no key may hold every slot of the pool (qwen27b_gateway_fair_share, 2+ keys)
    log_bodies: bool = False  # the request log keeps each request's body and its answer's (qwen27b_gateway_log_bodies)
    chat_page: ChatPage | None = None  # Open WebUI behind this nginx (qwen27b_chat_page; plan/chatpage.py)
    # the deploy's verify key on the controller (apikey.ensure_gateway_verify, set by the gateway's
    # preflight): its requests count under VERIFY, never in a client's usage or against its limits
    verify_key_file: str | None = None
    # qwen27b_firewall_allow on the gateway host: the networks that reach its API and chat page ports
    # (nftables, as on a serving host); None: no rule
    firewall_allow: tuple[str, ...] | None = None

    def named_clients(self) -> tuple[Client, ...]:
        return self.clients or tuple(Client(key_name(path), path) for path in self.key_files)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def describe(self) -> list[str]:
        """The plan's lines, each with its reason (printed before anything runs)."""
        lines = [f"gateway: nginx on {self.address}:{self.port} in front of {len(self.backends)} backend(s) "
                 "(nginx's upstream module: one OpenAI address; docs/scale-out.md)"]
        for b in self.backends:
            added = "".join(f"; {key} += {network} (" + ("" if key == "qwen27b_serve_flags" else "the gateway's address, ")
                            + f"added: {NEEDS[key]})" for key, network in b.added)
            lines.append(f"  backend {b.name}: {b.address}:{b.port}, health {b.address}:{b.health_port}{b.health_path} "
                         f"(in the pool while both answer 200 and it is not drained){added}")
        lines.append(f"  client keys: {', '.join(c.describe() for c in self.named_clients())}; held by the gateway only; "
                     + ("the backends' key is added by the gateway, never seen by clients" if self.backend_key_file
                        else "WARNING: the backends have no qwen27b_api_key_file, so anyone on the lab network "
                             "can bypass the gateway's keys"))
        lines.append("  fair share: a key may hold at most the pool's slots less one at once (each backend's "
                     "--max-num-seqs, from its health endpoint), so another key always finds one; over it: 429 "
                     "with Retry-After 1 (qwen27b_gateway_fair_share: false to let one key take them all)"
                     if self.fair_share else
                     "  fair share: off (" + ("one client key" if len(self.named_clients()) < 2
                                             else "qwen27b_gateway_fair_share: false") + ")")
        lines.append("  request log: one JSON line per request in the gateway's journal (key name, status, tokens, "
                     "latency, backend; no prompt or answer text" + ("" if self.log_bodies else
                                                                     ": qwen27b_gateway_log_bodies keeps them") + ")")
        if self.log_bodies:
            lines.append(f"  WARNING: {BODIES_REACH}")
        if self.verify_key_file:
            lines.append(f"  verify: with its own key ({self.verify_key_file}, made once, 0600), counted as {VERIFY}: "
                         "never a client's usage or limits")
        lines.append(f"  client routes: {', '.join(CLIENT_ROUTES)} (the backends' other routes, /tokenize, "
                     "abort, LoRA, stored responses..., answer 404); the backends' /metrics through it: loopback"
                     + "".join(f", {n}" for n in self.metrics_allow) + " (qwen27b_gateway_metrics_allow)")
        lines.extend(f"  WARNING: qwen27b_gateway_metrics_allow lists {n}: every address reads each key's usage "
                     "and the backends' /metrics" for n in self.metrics_allow if ipaddress.ip_network(n).prefixlen == 0)
        if self.firewall_allow is None:  # with it, the firewall's own lines say each port's networks
            lines.append("  firewall: none (qwen27b_firewall_allow unset): the API" + (" and the chat page" if self.chat_page
                         else "") + " answer every network that reaches this host")
        lines.append(f"  {self.tls.describe()}" if self.tls else
                     "  plain HTTP: client keys, prompts and answers cross the network unencrypted (fine on a closed "
                     "lab network; else set qwen27b_gateway_tls_lab_ca, or qwen27b_gateway_tls_cert and _tls_key)")
        return lines


def listen_on(address: str, port: int) -> str:
    """ADDRESS:PORT as nginx's listen and a URL take it (an IPv6 address in brackets)."""
    return f"[{address}]:{port}" if ipaddress.ip_address(address).version == 6 else f"{address}:{port}"


def is_gateway(groups: set | list | tuple) -> bool:
    return GROUP in set(groups or ())


def _int_setting(host: str, data: dict, name: str, default: int, low: int, high: int, fix: str) -> int:
    value = data.get(PREFIX + name)
    if value is None:
        return default
    if not low <= value <= high:
        raise BadHostData(host, PREFIX + name, f"{value} is out of range", fix)
    return value


def _address(host: str, key: str, value: str, fix: str) -> str:
    """An address nginx listens on or proxies to: re-printed, no zone id, neither loopback nor the
    wildcard (nginx would send the backends' key to whatever listens on its own host)."""
    address = ipaddress.ip_address(parse_address(host, key, value, fix))  # no zone id: nginx takes none
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:  # ::ffff:127.0.0.1 is loopback, yet not is_loopback to Python's ipaddress
        raise BadHostData(host, key, f"{value} is an IPv4-mapped IPv6 address ({mapped}"
                          + (", loopback)" if mapped.is_loopback else ")"), f"write the IPv4 address {mapped}; {fix}")
    if address in LOOPBACK or address.is_loopback:
        raise BadHostData(host, key, f"{value} is loopback: other hosts cannot reach it", fix)
    if address.is_unspecified:
        raise BadHostData(host, key, f"{value} is the wildcard address, not one host's address", fix)
    return str(address)


def _backend(name: str, data: dict, s: Settings) -> list[Backend]:
    where = s.bind_address or lab_address(data)
    if where is None:
        raise BadHostData(name, "qwen27b_bind_address", "the gateway cannot tell where this backend listens "
                          "(no qwen27b_bind_address, and ssh_hostname is not an IP address)",
                          "set qwen27b_bind_address to the host's lab address")
    where = _address(name, "qwen27b_bind_address", where, "serve on the lab address the gateway reaches "
                     "(qwen27b_bind_address)")
    if s.instances:
        # each copy of qwen27b_instances is a backend: its port, its verdict on the host's endpoint
        return [Backend(f"{name}.{i.name}", where, i.port, s.health_port, f"/health/{i.name}",
                        i.api_key_file or s.api_key_file) for i in instances_of(s)]
    return [Backend(name, where, s.port, s.health_port, key_file=s.api_key_file)]


def backend_names(name: str, data: dict) -> list[str]:
    """The gateway backends host `name` is (what `qwen27b-gateway-pool drain` takes, as _backend
    names them): HOST.NAME for each copy of qwen27b_instances, else the host. Read from the raw host
    data (a rollout drains before its deploy checks it; the gateway answers a name it lacks)."""
    copies = data.get(f"{PREFIX}instances")
    if isinstance(copies, list) and copies:
        return [f"{name}.{copy['name']}" for copy in copies if isinstance(copy, dict) and isinstance(copy.get("name"), str)]
    return [name]


def _covered(address: str, networks: list | None) -> bool:
    ip = ipaddress.ip_address(address)
    return any(ip in ipaddress.ip_network(n, strict=False) for n in networks or [])


# the flag a backend serves with behind a gateway: every stream reports its usage (in every chunk),
# which the gateway counts and budgets per key; without it a stream that does not ask for
# stream_options.include_usage reports none (issue 51)
FORCE_USAGE = "--enable-force-include-usage"
NEEDS = {"qwen27b_serve_flags": "every stream reports its usage, which the gateway counts and budgets per key",
         "qwen27b_metrics_allow": "it reads this host's health endpoint",
         "qwen27b_firewall_allow": "it sends this host's requests"}


def _reach(address: str, data: dict) -> tuple[tuple[str, str], ...]:
    """What the gateway at `address` needs added to a backend's allow-lists: its health endpoint
    (open to loopback, the host itself and qwen27b_metrics_allow only) and, with a firewall rule,
    its port. Filled in by gateway_needs (both hosts are in the inventory), never refused. Read from
    the host data as written (checked by settings_for), so a plan made from the filled-in settings
    still says what was added."""
    network = str(ipaddress.ip_network(address))
    out = []
    if FORCE_USAGE not in (data.get(PREFIX + "serve_flags") or {}):
        out.append(("qwen27b_serve_flags", FORCE_USAGE))
    if not _covered(address, data.get(PREFIX + "metrics_allow")):
        out.append(("qwen27b_metrics_allow", network))
    if data.get(PREFIX + "firewall_allow") is not None and not _covered(address, data[PREFIX + "firewall_allow"]):
        out.append(("qwen27b_firewall_allow", network))
    return tuple(out)


def gateway_needs(plans: dict[str, "GatewayPlan"], settings: dict[str, Settings]) -> dict[str, Settings]:
    """Each backend's settings with its gateways' addresses added to the allow-lists that lack them
    (each GatewayPlan's backend line says which)."""
    out = dict(settings)
    for plan in plans.values():
        for backend in plan.backends:
            host = backend.host or backend.name
            for key, network in backend.added:
                field_name = key[len(PREFIX):]
                if key == "qwen27b_serve_flags":  # a switch, pinned beside the host's own pins; a serving
                    group = out[host].node_group  # group's members run one engine: every member gets it
                    for name in [n for n, s in out.items() if group and s.node_group == group] or [host]:
                        out[name] = replace(out[name], serve_flags={**(out[name].serve_flags or {}), network: True})
                    continue
                have = list(getattr(out[host], field_name) or [])
                if network not in have:
                    out[host] = replace(out[host], **{field_name: have + [network]})
    return out


def _client(host: str, key: str, entry) -> Client:
    """One entry of qwen27b_gateway_key_files: a file path (named by its file name), or
    {file, name, requests_per_minute, concurrent, tokens_per_day} with the name and limits given."""
    if isinstance(entry, str):
        entry = {"file": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        raise BadHostData(host, key, f"{entry!r} is neither a file path nor {{file: PATH, name: ..., ...}}",
                          "list paths, or {file: 'secrets/team-a.key', name: 'team-a', requests_per_minute: 60, "
                          "concurrent: 2}")
    for field_name, value in entry.items():
        if field_name not in CLIENT_FIELDS:
            near = difflib.get_close_matches(field_name, CLIENT_FIELDS, n=1)
            raise BadHostData(host, key, f"{entry['file']}: unknown field {field_name!r}"
                              + (f" (did you mean {near[0]!r}?)" if near else ""), f"use {', '.join(CLIENT_FIELDS)}")
        if not isinstance(value, CLIENT_FIELDS[field_name]) or isinstance(value, bool):
            raise BadHostData(host, key, f"{entry['file']}: {field_name} is {value!r}, not a {CLIENT_FIELDS[field_name].__name__}",
                              f"give {field_name} as a {CLIENT_FIELDS[field_name].__name__}")
    name = entry.get("name") or key_name(entry["file"])
    if not CLIENT_NAME.fullmatch(name):
        raise BadHostData(host, key, f"{entry['file']}: the name {name!r} is not 1-64 letters, digits, '.', '_', '-' "
                          "(it goes into nginx's config and the request log)", "give it a name: {file: ..., name: team-a}")
    for field_name, high in (("requests_per_minute", 60000), ("concurrent", 1000), ("tokens_per_day", 10**12)):
        value = entry.get(field_name)
        if value is not None and not 1 <= value <= high:
            raise BadHostData(host, key, f"{name}: {field_name} {value} is out of range", f"use 1-{high}, or leave it out")
    check_secret_file(host, key, entry["file"])
    return Client(name, entry["file"], entry.get("requests_per_minute"), entry.get("concurrent"), entry.get("tokens_per_day"))


def _client_keys(host: str, data: dict) -> tuple[Client, ...]:
    key = PREFIX + "gateway_key_files"
    entries = data.get(key)
    if not entries:
        raise BadHostData(host, key, "a gateway needs at least one client key (an open gateway would serve anyone "
                          "on the network)", "list 0600 key files, e.g. ['secrets/team-a.key'] "
                          "(`qwen27b key new FILE`, or `openssl rand -hex 32 > FILE; chmod 600 FILE`)")
    clients = [_client(host, key, entry) for entry in entries]
    seen: dict[str, str] = {}
    names: dict[str, str] = {}
    for client in clients:
        value = load_secret(client.key_file, SECRET_NAMES["gateway_key_files"])
        if value in seen:
            raise BadHostData(host, key, f"{client.key_file} holds the same key as {seen[value]}",
                              "give each client its own key")
        if client.name in names:
            raise BadHostData(host, key, f"{client.key_file} and {names[client.name]} are both named {client.name!r}",
                              "give each key its own name: {file: ..., name: ...}")
        seen[value], names[client.name] = client.key_file, client.key_file
    return tuple(clients)


def _pem_file(host: str, key: str, path, marker: str, what: str, private: bool) -> bytes:
    """A controller-side PEM file: a regular file holding `marker`; a private key 0600."""
    if not isinstance(path, str):
        raise BadHostData(host, key, f"{path!r} is not a file path", "give the path as a string")
    try:
        st = os.stat(os.path.expanduser(path))
        data = Path(path).expanduser().read_bytes() if stat.S_ISREG(st.st_mode) else b""
    except OSError as error:
        raise BadHostData(host, key, f"cannot read {path}: {error.strerror}", "fix the path") from None
    if private and stat.S_IMODE(st.st_mode) & 0o077:
        raise BadHostData(host, key, f"{path} is mode {stat.S_IMODE(st.st_mode):o}, readable by others",
                          f"chmod 600 {path}")
    if marker.encode() not in data:
        raise BadHostData(host, key, f"{path} holds no PEM {what}",
                          "give the PEM file (-----BEGIN ...-----)")
    return data


def cert_names(pem: bytes) -> set[str]:
    """The IP addresses and DNS names a PEM certificate (the first in the file) is valid for."""
    from cryptography import x509  # noqa: PLC0415 (only a gateway with TLS reads a certificate)

    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))


def _tls(host: str, data: dict, address: str) -> Tls | None:
    """TLS from the admin's files or a lab CA, one or the other; the certificate must name the
    gateway's address (verify and the lab's clients reach it by that address)."""
    cert, key, lab_ca = (data.get(PREFIX + name) for name in ("gateway_tls_cert", "gateway_tls_key", "gateway_tls_lab_ca"))
    if lab_ca is not None:
        if cert is not None or key is not None:
            raise BadHostData(host, PREFIX + "gateway_tls_lab_ca", "set with qwen27b_gateway_tls_cert/_tls_key: "
                              "the certificate would come from two places", "keep the lab CA or your files, not both")
        if not lab_ca or os.path.exists(os.path.expanduser(lab_ca)) and not os.path.isdir(os.path.expanduser(lab_ca)):
            raise BadHostData(host, PREFIX + "gateway_tls_lab_ca", f"{lab_ca!r} is not a directory",
                              "name a directory on the controller for the lab CA (made when absent), "
                              "e.g. ~/.local/share/qwen27b/lab-ca")
        return Tls(lab_ca_dir=os.path.expanduser(lab_ca))
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = "gateway_tls_cert" if cert is None else "gateway_tls_key"
        raise BadHostData(host, PREFIX + missing, "is missing: TLS needs the certificate and its key",
                          f"set {PREFIX}{missing} too, or qwen27b_gateway_tls_lab_ca instead of both")
    pem = _pem_file(host, PREFIX + "gateway_tls_cert", cert, "-----BEGIN CERTIFICATE-----", "certificate", private=False)
    _pem_file(host, PREFIX + "gateway_tls_key", key, "PRIVATE KEY-----", "private key", private=True)
    try:
        names = cert_names(pem)
    except ValueError as error:
        raise BadHostData(host, PREFIX + "gateway_tls_cert", f"{cert} cannot be read as a certificate ({error})",
                          "give a PEM certificate") from None
    if address not in names:
        raise BadHostData(host, PREFIX + "gateway_tls_cert", f"{cert} is for {', '.join(sorted(names)) or 'no address'}, "
                          f"not the gateway's address {address}: clients and verify would refuse it",
                          f"issue it with {address} as an IP subject alternative name, or set "
                          "qwen27b_gateway_tls_lab_ca to let qwen27b issue one")
    return Tls(cert_file=os.path.expanduser(cert), key_file=os.path.expanduser(key))


def _backend_names(host: str, data: dict, names: list[str], gateways: set[str],
                   workers: set[str] = frozenset()) -> list[str]:
    """The backends: listed, or every host but the gateways and the Ray workers of a serving group
    (a worker runs no API: its group's head serves for it)."""
    key = PREFIX + "gateway_backends"
    chosen = data.get(key)
    if chosen is None:
        chosen = [name for name in names if name not in gateways and name not in workers]
    for name in chosen:
        if name not in names:
            raise BadHostData(host, key, f"{name!r} is not a host of this inventory", "list inventory host names")
        if name in gateways:
            raise BadHostData(host, key, f"{name} is a gateway (group {GROUP}), not a backend",
                              f"list serving hosts only, or take {name} out of the {GROUP} group")
        if name in workers:
            raise BadHostData(host, key, f"{name} is a Ray worker of a serving group: it serves no API",
                              "list the group's head instead")
    if len(set(chosen)) != len(chosen):
        raise BadHostData(host, key, "a host is listed twice", "list each backend once")
    if not chosen:
        raise BadHostData(host, key if data.get(key) is not None else "inventory",
                          "the gateway has no backend", "add the serving hosts to the inventory (outside the "
                          f"{GROUP} group)")
    return chosen


def _shared(host: str, backends: list[str], settings: dict[str, Settings],
            served: list[Backend]) -> tuple[str | None, str | None]:
    """(the backends' key file, their served name): one key and one model name across the pool,
    since the gateway sends every request to any backend with one Authorization header (a copy
    with its own api_key_file must hold that key too)."""
    names = {b: settings[b].served_model_name or f"the default of profile {settings[b].profile or 'auto'}"
             for b in backends}
    if len(set(names.values())) > 1:
        detail = ", ".join(f"{b}: {n}" for b, n in names.items())
        raise BadHostData(host, "qwen27b_served_model_name", f"the backends serve different names ({detail}): "
                          "/v1/models would list several and a request could reach a host without its model",
                          "set one qwen27b_served_model_name on every backend of the gateway")
    keys = {b.name: (load_secret(b.key_file) if b.key_file else None) for b in served}
    if len(set(keys.values())) > 1:
        raise BadHostData(host, "qwen27b_api_key_file", "the backends do not share one API key (files differ, or "
                          "some have none): the gateway sends one key to every backend",
                          "give every backend of the gateway (and every copy of qwen27b_instances) the same "
                          "qwen27b_api_key_file")
    first = backends[0]
    return served[0].key_file, settings[first].served_model_name


def plan_gateway(host: str, data: dict, inventory: list[tuple[str, dict]], gateways: set[str],
                 settings: dict[str, Settings]) -> GatewayPlan:
    by_name = dict(inventory)
    port = _int_setting(host, data, "gateway_port", DEFAULT_PORT, 1, 65535, f"use a TCP port (default {DEFAULT_PORT})")
    timeout = _int_setting(host, data, "gateway_request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S, 10, 86400,
                           f"use 10-86400 seconds (default {DEFAULT_REQUEST_TIMEOUT_S})")
    given = data.get(PREFIX + "gateway_bind_address")
    address = (_address(host, PREFIX + "gateway_bind_address", given, "give the gateway's lab address")
               if given else lab_address(data))
    if address is None:
        raise BadHostData(host, PREFIX + "gateway_bind_address", "the gateway's lab address is unknown (ssh_hostname "
                          "is not an IP address)", "set qwen27b_gateway_bind_address to its lab address")
    address = _address(host, "ssh_hostname", address, "set qwen27b_gateway_bind_address to its lab address")
    clients = _client_keys(host, data)
    key_files = tuple(c.key_file for c in clients)
    workers = {name for name, s in settings.items() if s.node_role == "worker"}
    names = _backend_names(host, data, [name for name, _ in inventory], gateways, workers)
    backends = [replace(backend, added=_reach(address, by_name[name]), host=name)
                for name in names for backend in _backend(name, by_name[name], settings[name])]
    backend_key, served = _shared(host, names, settings, backends)
    if backend_key and any(load_secret(path, SECRET_NAMES["gateway_key_files"]) == load_secret(backend_key)
                           for path in key_files):
        raise BadHostData(host, PREFIX + "gateway_key_files", "a client key is the backends' API key",
                          "give clients their own keys: the backends' key stays with the gateway")
    fair = data.get(PREFIX + "gateway_fair_share")
    page = plan_chat_page(host, data, [c.name for c in clients],
                          {port: "the gateway's API", **({USAGE_PORT: "the usage counters"} if data.get(PREFIX + "gateway_metrics_allow") else {})})
    if VERIFY in {c.name for c in clients}:
        raise BadHostData(host, PREFIX + "gateway_key_files", f"a key is named {VERIFY!r}, the name the deploy's own "
                          "verify requests count under", "give that key another name: {file: ..., name: ...}")
    if page and HOUSEKEEPING in {c.name for c in clients}:
        raise BadHostData(host, PREFIX + "gateway_key_files", f"a key is named {HOUSEKEEPING!r}, the name the chat page's "
                          "own requests count under", "give that key another name: {file: ..., name: ...}")
    allow = settings[host].firewall_allow if host in settings else None
    return GatewayPlan(host, address, port, key_files, tuple(backends), backend_key, served, timeout,
                       _tls(host, data, address), clients, _metrics_allow(host, data),
                       fair_share=(fair is not False) and len(clients) > 1,
                       log_bodies=data.get(PREFIX + "gateway_log_bodies") is True, chat_page=page,
                       firewall_allow=tuple(allow) if allow is not None else None)


def _metrics_allow(host: str, data: dict) -> tuple[str, ...]:
    """qwen27b_gateway_metrics_allow: networks parsed as every other allow-list is (hostdata's
    parse_network: no ints or bools, no zone id, no host bits), re-printed as nginx's `allow` takes them."""
    key = PREFIX + "gateway_metrics_allow"
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise BadHostData(host, key, f"{value!r} is not a list of networks", "list networks, e.g. ['10.0.0.5/32']")
    return tuple(parse_network(host, key, network) for network in value)


def uninstall_notes(plans: dict[str, GatewayPlan], host: str) -> list[str]:
    """What uninstalling `host` leaves at the gateways that list it as a backend (their plans): the
    gateway keeps it in its backend list until the gateway is deployed without it."""
    out = []
    for gateway, plan in plans.items():
        mine = [b.name for b in plan.backends if (b.host or b.name) == host]
        if mine and gateway != host:
            out.append(f"gateway {gateway} lists {', '.join(mine)} as backend(s): once the service is gone its watcher "
                       "takes them out of the pool (clients get the other backends, no error), but they stay in its "
                       f"backend list; to drop them, take {host} out of the inventory (or out of {gateway}'s "
                       f"qwen27b_gateway_backends) and deploy the gateway: pyinfra INVENTORY deploy.py -y --limit {gateway}")
    return out


def plan_gateways(inventory: list[tuple[str, dict]], groups: dict[str, set],
                  settings: dict[str, Settings]) -> dict[str, GatewayPlan]:
    """Every gateway host's plan; gateway keys on a host outside the group are refused (they would
    be silently ignored)."""
    gateways = {name for name, _ in inventory if is_gateway(groups.get(name, ()))}
    for name, data in inventory:
        stray = [key for key in data if key in GATEWAY_KEYS and data[key] is not None]
        if stray and name not in gateways:
            raise BadHostData(name, stray[0], f"only hosts of the {GROUP} group read it",
                              f"put {name} in the {GROUP} group, or remove the key")
    return {name: plan_gateway(name, data, inventory, gateways, settings)
            for name, data in inventory if name in gateways}
