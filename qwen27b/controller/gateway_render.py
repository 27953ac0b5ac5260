"""The gateway's files, rendered from its GatewayPlan: nginx's config, the keys include (secret),
the pool watcher's config and the two systemd units. Every value is computed here; the templates
only loop (tests/golden/gateway/ holds the rendered files of a reference plan)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from qwen27b.controller.render import render
from qwen27b.controller.sandbox import SANDBOX
from qwen27b.controller.unitwords import nft_networks, nginx_regex_literal
from qwen27b.onhost.contract import FIREWALL_UNIT, GATEWAY_UNIT, POOL_UNIT
from qwen27b.onhost.secretfile import load_secret
from qwen27b.controller import chat_page_render as P
from qwen27b.plan.gateway import CLIENT_ROUTES, SCRAPER_ROUTES, USAGE_PORT, VERIFY, GatewayPlan, listen_on
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan.urlsecret import SECRET_NAMES

CONFIG_DIR = "/etc/qwen27b-gateway"
STATE_DIR = "/var/lib/qwen27b-gateway"
LIB_DIR = "/opt/qwen27b-gateway/lib"
USER = "qwen27b-gateway"  # nginx's workers; the master stays root to bind and read the keys
NGINX = "/usr/sbin/nginx"
PYTHON = "/usr/bin/python3"
PACKAGES = ["nginx-light", "python3"]  # nginx-light: the core modules (upstream, map, proxy) and nothing more
LUA_PACKAGE = "libnginx-mod-http-lua"  # nginx's Lua module (and its NDK), from the OS archive: usage per key
LUA_MODULES = ["/usr/lib/nginx/modules/ndk_http_module.so", "/usr/lib/nginx/modules/ngx_http_lua_module.so"]
USAGE_LUA = "qwen27b_gateway_usage.lua"  # qwen27b/onhost/: counts each key's tokens from the responses
DISTRO_UNIT = "nginx.service"  # the package's own server (its default site on :80): stopped, disabled
POOL_MODULE = "qwen27b_onhost.gateway_pool"

# nginx's unit: the shared sandbox less what an nginx master does (bind, drop to its worker user,
# hand its temp dirs to it, signal its workers), plus what nginx does not need.
_MASTER_CAPS = "CAP_NET_BIND_SERVICE CAP_SETUID CAP_SETGID CAP_CHOWN CAP_KILL"
NGINX_HARDENING = [line for line in SANDBOX if line not in (("CapabilityBoundingSet", ""),
                                                            ("SystemCallFilter", "~@privileged"))] + [
    ("CapabilityBoundingSet", _MASTER_CAPS),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
    ("PrivateDevices", "yes"),
    ("MemoryDenyWriteExecute", "yes"),  # no pcre_jit: nothing is compiled at run time
    ("ReadWritePaths", STATE_DIR),
    ("ReadWritePaths", "-/var/log/nginx"),  # nginx opens its built-in error log before reading the config
    ("UMask", "0027"),
]
NGINX_LEFT_OFF = [
    ("SystemCallFilter=~@privileged is off", "the master drops to the worker user (setuid, setgroups)"),
    ("User= is root", "the master binds the port and reads the 0600 keys, then runs its workers as " + USER),
    ("IPAddressDeny= is off", "clients come from anywhere the lab's network lets them; the keys decide"),
]
# the watcher runs as root (it signals nginx's root master: same user, no capability needed)
POOL_HARDENING = SANDBOX + [
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
    ("PrivateDevices", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("ReadWritePaths", STATE_DIR),
    ("UMask", "0022"),
]
POOL_LEFT_OFF = [
    ("ProtectProc=invisible is kept", "nginx's master is root's, as is the watcher: it still sees it"),
    ("User= is root", "it sends nginx's master SIGHUP after a pool change (root's process); no capability"),
]


def layout(prefix: str = "") -> dict[str, str]:
    """Host paths (prefix: a scratch root, for tests and the loopback benchmark)."""
    return {key: prefix + path for key, path in {
        "config": f"{CONFIG_DIR}/nginx.conf",
        "keys": f"{CONFIG_DIR}/keys.conf",
        "tls_cert": f"{CONFIG_DIR}/tls.crt",  # qwen27b_gateway_tls_*: the certificate (public)
        "tls_key": f"{CONFIG_DIR}/tls.key",  # and its key (root 0600, written as a secret)
        "pool_config": f"{CONFIG_DIR}/backends.json",
        "state_dir": STATE_DIR,
        "upstream_file": f"{STATE_DIR}/upstream.conf",
        "pool_file": f"{STATE_DIR}/pool.json",  # the watcher's record: pool, drained (qwen27b status reads it)
        "fair_file": f"{STATE_DIR}/fair.conf",  # the watcher's fair share of the pool's slots per key (an include)
        "pid_file": f"{STATE_DIR}/nginx.pid",
        "temp_dir": f"{STATE_DIR}/tmp",
        "drain_dir": f"{STATE_DIR}/drained",
        # the usage counters kept across a restart (the Lua module's keep(); nginx's workers write it)
        "usage_dir": f"{STATE_DIR}/usage",
        "usage_state": f"{STATE_DIR}/usage/counters.tsv",
        "lib_dir": LIB_DIR,
        "usage_lua": f"{LIB_DIR}/{USAGE_LUA}",
        "firewall_rules": f"{CONFIG_DIR}/firewall.nft",  # qwen27b_firewall_allow: the rule qwen27b-firewall loads
        "gateway_unit": HostLayout.unit_file(GATEWAY_UNIT),
        "pool_unit": HostLayout.unit_file(POOL_UNIT),
    }.items()}


def pool_argv(command: str, where: dict) -> list[str]:
    return [PYTHON, "-m", POOL_MODULE, "--config", where["pool_config"], command]


def pool_config(plan: GatewayPlan, where: dict) -> str:
    """The watcher's config (JSON): the backends and the files it keeps."""
    return json.dumps({
        "state_dir": where["state_dir"],
        "upstream_file": where["upstream_file"],
        "pool_file": where["pool_file"],
        "pid_file": where["pid_file"],
        "drain_dir": where["drain_dir"],
        # each key at most the in-pool backends' slots (their health endpoints' "slots") less one
        "fair_share": plan.fair_share, "fair_file": where["fair_file"],
        # a copy's verdict is on its own path of its host's endpoint (the pool's default: /health)
        "backends": [{"name": b.name, "address": b.address, "port": b.port, "health_port": b.health_port,
                      **({"health_path": b.health_path} if b.health_path != "/health" else {})}
                     for b in plan.backends],
        # ~2 s for a dead backend to leave, 2 s to return; nginx's passive check covers the gap
        "interval_s": 1.0, "timeout_s": 1.0, "fall": 2, "rise": 2,
        # nginx's passive check: 3 failed tries in 5 s skip a server for 5 s (1 would let one hiccup on
        # the last healthy backend answer 502 "no live upstreams" for 5 s)
        "max_fails": 3, "fail_timeout_s": 5,
    }, indent=2, sort_keys=True) + "\n"


def usage_available(lua: dict, os_id: str | None, version_id: str | None) -> bool:
    """Whether the host's OS archive has nginx's Lua module (stack tools.nginx_lua.on, with its
    source): Ubuntu 22.04's has none, and an OS not listed is not assumed to."""
    return f"{os_id} {version_id}" in lua["on"]


def usage_verdict(lua: dict, os_id: str | None, version_id: str | None) -> tuple[bool, str]:
    """(whether a gateway on this OS counts tokens per key, the plan's line saying so and, on Ubuntu,
    from which archive component the module comes: stack tools.nginx_lua.universe)."""
    if usage_available(lua, os_id, version_id):
        where = " from the archive's universe component" if f"{os_id} {version_id}" in lua.get("universe", ()) else ""
        return True, f"  usage per key: tokens counted from the responses (nginx's Lua module, {lua['package']}{where})"
    return False, (f"  usage per key: tokens NOT counted on {os_id} {version_id}: its archive has no {lua['package']} "
                   f"(it is in {', '.join(lua['on'])}); requests, limits and the request log still work")


def lua_budgets(plan: GatewayPlan) -> str:
    """The keys' tokens_per_day as a Lua table for the config's init (names are 1-64 of
    A-Za-z0-9._- and budgets integers: plan/gateway.py checked both)."""
    return "{" + ", ".join(f'["{c.name}"] = {c.tokens_per_day}' for c in plan.named_clients() if c.tokens_per_day) + "}"


def usage_lines(where: dict, port: int, on: bool, budgets: str = "{}", listens: tuple = (),
                allow: tuple = (), log_bodies: bool = False) -> dict[str, list[str]]:
    """nginx's lines for usage per key (qwen27b/onhost/qwen27b_gateway_usage.lua), or none where the
    OS archive has no Lua module (the gateway then serves, limits and logs without token counts).
    The code is loaded by the root master (a missing file fails `nginx -t`, not a request) and only
    interpreted: the unit denies W+X memory, which LuaJIT's compiler would need (its worker dies
    when mprotect refuses: tests/servers/test_gateway.py)."""
    if not on:
        return {"modules": [], "usage_http": [], "usage_server": [], "usage_location": [], "usage_metrics": []}
    lua = 'require("qwen27b_gateway_usage")'
    return {
        "modules": LUA_MODULES,
        "usage_http": ["# usage per key name (qwen27b_gateway_usage.lua): counted from each response's own usage",
                       f'lua_package_path "{where["usage_lua"].rsplit("/", 1)[0]}/?.lua;;";',
                       "lua_shared_dict qwen27b_usage 4m;", f"init_by_lua_block {{ jit.off() local usage = {lua} usage.budgets = {budgets} "
                       f"usage.log_bodies = {'true' if log_bodies else 'false'} usage.state_file = \"{where['usage_state']}\" }}",
                       "# the counters and the day's tokens survive a restart: loaded at start, written every few seconds",
                       f"init_worker_by_lua_block {{ {lua}.keep() }}"],
        "usage_server": [f"log_by_lua_block {{ {lua}.log() }}"],
        # a key over its tokens of the day (map $qwen27b_tokens_per_day) gets 429 until midnight UTC
        "usage_location": [f"access_by_lua_block {{ {lua}.budget() }}",
                           f"body_filter_by_lua_block {{ {lua}.body_filter() }}"],
        # each key's counters for Prometheus (qwen27b_gateway_*_total{key="NAME"}), on loopback only
        # on loopback, and on the gateway's address for qwen27b_gateway_metrics_allow only
        "usage_metrics": ["# each key's counters for Prometheus (qwen27b_gateway_*{key=\"NAME\"}): loopback and "
                          "qwen27b_gateway_metrics_allow",
                          "server {", f"    listen 127.0.0.1:{port};",
                          *(f"    listen {listen};" for listen in listens), "    access_log off;",
                          *(f"    allow {network};" for network in ("127.0.0.1", *allow)), "    deny all;",
                          f"    location = /metrics {{ content_by_lua_block {{ {lua}.metrics() }} }}",
                          "    location / { return 404; }", "}"],
    }


def route_lines(plan: GatewayPlan) -> list[str]:
    """$qwen27b_route: "1" for a path a client key may reach (CLIENT_ROUTES), the backends' /metrics
    for a scraper (loopback and qwen27b_gateway_metrics_allow), "" for the rest (answered 404). On
    $uri, nginx's normalised path: the server's check refuses dot segments and encoded dots or
    slashes before, so the path matched is the path forwarded."""
    scrapers = ("127.0.0.1/32", "::1/128", *plan.metrics_allow)
    return ["# the routes a client key reaches (plan/gateway.py CLIENT_ROUTES); any other is 404, never forwarded",
            "geo $qwen27b_scraper {", '    default "";', *(f"    {network} 1;" for network in scrapers), "}",
            "map $uri $qwen27b_route {", '    default "";', *(f"    {route} 1;" for route in CLIENT_ROUTES),
            *(f"    {route} $qwen27b_scraper;" for route in SCRAPER_ROUTES), "}"]


def bodies_log_lines(access_log: str, usage: bool = True) -> list[str]:
    """qwen27b_gateway_log_bodies: each request's body and, where Lua counts usage, the start of its
    answer, on a line of their own (tag qwen27b_gateway_bodies, joined to the request's line by
    request_id), so the request's own line, which `qwen27b usage` counts, never carries them (issue
    51). Where Lua runs it cuts each body to 96 KiB once JSON-escaped (qwen27b_gateway_usage.lua
    BODY_ESCAPED): the bodies line fits the largest datagram the journal's syslog socket takes from
    nginx (its 208 KiB socket buffer) and is kept too. Without Lua the request's body is nginx's
    (kept in memory up to 128 KiB, none it wrote to a temp file), and a line whose escaped body
    passes the datagram is lost. The same destination as the request log, its tag and format renamed."""
    if access_log == "off":
        return []
    where = access_log.rsplit(" ", 1)[0].replace(",tag=qwen27b_gateway", ",tag=qwen27b_gateway_bodies")
    body = "$qwen27b_request_body" if usage else "$request_body"
    return ["# the bodies (qwen27b_gateway_log_bodies), a line of their own: the request's line above always fits",
            "log_format qwen27b_bodies escape=json '{\"time\":\"$time_iso8601\",\"request_id\":\"$request_id\","
            f"\"request_body\":\"{body}\",\"response_body\":\"$qwen27b_response_body\"}}';",
            f"access_log {where} qwen27b_bodies;"]


def nginx_context(plan: GatewayPlan, where: dict, run_as: list[str] | None = None, usage_port: int = USAGE_PORT,
                  usage: bool = True,
                  access_log: str = "syslog:server=unix:/run/systemd/journal/dev-log,nohostname,tag=qwen27b_gateway qwen27b") -> dict:
    return {
        "worker_processes": "auto",
        "worker_connections": 4096,
        "pid_file": where["pid_file"],
        "error_log_level": "warn",
        "run_as": [f"user {USER};"] if run_as is None else run_as,
        "access_log": access_log,
        "temp_dir": where["temp_dir"],
        "max_body": "64m",  # long prompts are text: 64 MiB is far beyond any context window
        "request_timeout_s": plan.request_timeout_s,
        "keys_file": where["keys"],
        "routes_http": route_lines(plan),
        "client_routes": ", ".join(CLIENT_ROUTES),
        "upstream_file": where["upstream_file"],
        "keepalive": 32,
        "keepalive_timeout_s": 4,
        "listens": [listen_on(plan.address, plan.port) + (" ssl" if plan.tls else "")],
        # TLS 1.2 and 1.3 only, nginx's default ciphers; a session cache spares reconnecting clients a handshake
        "tls": [f"ssl_certificate {where['tls_cert']};", f"ssl_certificate_key {where['tls_key']};",
                "ssl_protocols TLSv1.2 TLSv1.3;", "ssl_session_cache shared:qwen27b_tls:1m;",
                "ssl_session_timeout 1h;"] if plan.tls else [],
        **usage_lines(where, usage_port, usage, lua_budgets(plan),
                      # the gateway's address for the lab's Prometheus (a loopback test gateway has it already)
                      tuple(listen_on(plan.address, usage_port) for _ in plan.metrics_allow[:1] if plan.address != "127.0.0.1"),
                      plan.metrics_allow, plan.log_bodies),
        "log_bodies": bodies_log_lines(access_log, usage) if plan.log_bodies else [],
        "body_buffer": ["client_body_buffer_size 128k;"] if plan.log_bodies else [],
        # the watcher's `limit_conn qwen27b_fair N;` for the pool's slots of the moment (pool_config);
        # included by a glob ([.]), which nginx -t passes while the watcher has not written it yet
        "fair": [f"include {where['fair_file'].replace('.conf', '[.]conf')};"] if plan.fair_share else [],
        **{f"limits_{where_}": lines for where_, lines in limit_lines(plan).items()},  # "http", "location"
        "connect_timeout_s": 2,  # a backend that does not answer SYN in 2 s: try the next one
        "tries": len(plan.backends),  # each backend once
        **P.nginx_lines(plan, where),  # the chat page (qwen27b_chat_page): its server, the page's listener
    }


def keys_text(plan: GatewayPlan) -> str:
    """The secret include: each client key (secretfile's characters: safe in nginx's double quotes)
    mapped to its name, and the backends' Authorization header ("" removes the client's header when
    the backends have no key)."""
    # each key an exact regex: . and + are its only regex characters (secretfile.SECRET_CHARS)
    client = [(nginx_regex_literal(load_secret(c.key_file, SECRET_NAMES["gateway_key_files"])), c.name)
              for c in plan.named_clients()]
    if plan.verify_key_file:  # the deploy's verify: its own name, no limit, never a client's count
        client.append((nginx_regex_literal(load_secret(plan.verify_key_file)), VERIFY))
    backend = f"Bearer {load_secret(plan.backend_key_file)}" if plan.backend_key_file else ""
    page = P.keys_lines(plan) if plan.chat_page else []  # then the keys' map sets $qwen27b_key_client
    return render("qwen27b-gateway-keys.conf.j2", {"client_keys": client, "backend_authorization": [backend],
                                                   "client_var": "qwen27b_key_client" if page else "qwen27b_client",
                                                   "page": page})


def limit_lines(plan: GatewayPlan) -> dict[str, list[str]]:
    """nginx's own limits per key name: one zone per distinct limit (a zone has one rate), keyed by a
    map that gives the name only for the keys with that limit (an empty key is not counted), so each
    key is held to its own; "http" lines and "location" lines. Over a limit: 429 (limit_*_status),
    answered by @qwen27b_limited with Retry-After (60/rate s over a rate, 1 s over a concurrency)."""
    clients = plan.named_clients()
    http, location = [], []
    for field_name, short in (("requests_per_minute", "rpm"), ("concurrent", "conc")):
        for value in sorted({getattr(c, field_name) for c in clients if getattr(c, field_name)}):
            var = f"$qwen27b_{short}_{value}"
            http.append(" ".join([f"map $qwen27b_client {var} {{ default \"\";",
                                  *(f"{c.name} {c.name};" for c in clients if getattr(c, field_name) == value), "}"]))
            zone = f"qwen27b_{short}_{value}"
            if short == "rpm":
                http.append(f"limit_req_zone {var} zone={zone}:1m rate={value}r/m;")
                # nginx spaces requests 60/rate s apart: a burst of rate-1 served at once lets a key
                # send its minute's requests together, then refills at the rate
                location.append(f"limit_req zone={zone}" + (f" burst={value - 1} nodelay;" if value > 1 else ";"))
            else:
                http.append(f"limit_conn_zone {var} zone={zone}:1m;")
                location.append(f"limit_conn {zone} {value};")
    if plan.fair_share:  # every named key, counted together per key: the watcher's include sets the number
        http.append("limit_conn_zone $qwen27b_client zone=qwen27b_fair:1m;")
    # Retry-After: over its rate, the key's spacing (60/rate s); over its concurrency, 1 s
    retry = {c.name: -(-60 // c.requests_per_minute) for c in clients if c.requests_per_minute}
    http.append(over_map(plan))
    http.append(" ".join(['map "$limit_req_status:$qwen27b_client" $qwen27b_retry_after { default 1;',
                          *(f'"REJECTED:{name}" {seconds};' for name, seconds in sorted(retry.items()) if seconds != 1),
                          "}"]))
    return {"http": http, "location": location}


def _times(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what.replace('request', 'requests')}"


def over_map(plan: GatewayPlan) -> str:
    """$qwen27b_over: which limit a 429 of nginx's is for, in words (the answer's message): nginx's
    own $limit_req_status / $limit_conn_status are empty for a limit it did not check (a request
    over the rate never reaches limit_conn) and say nothing of the numbers. The key's own limit
    first, then the pool's fair share (its number set by the watcher's include)."""
    fair = "its fair share of the pool's slots ($qwen27b_fair_share at once)"
    entries = []
    for c in plan.named_clients():
        name = nginx_regex_literal(c.name)
        if c.requests_per_minute:
            entries.append(f'"~^REJECTED[|][^|]*[|]{name}$" "its {_times(c.requests_per_minute, "request")} per minute";')
        if c.concurrent:
            entries.append(f'"~^[^|]*[|]REJECTED[|]{name}$" "its {_times(c.concurrent, "request")} at once'
                           + (f' or {fair}";' if plan.fair_share else '";'))
    if plan.fair_share:
        entries.append(f'"~^[^|]*[|]REJECTED[|]" "{fair}";')
    return " ".join(['map "$limit_req_status|$limit_conn_status|$qwen27b_client" $qwen27b_over {',
                     'default "one of its limits";', *entries, "}"])


def tls_pair(plan: GatewayPlan) -> tuple[bytes, bytes] | None:
    """(certificate PEM, key PEM) the gateway serves: the admin's files, or the lab CA's pair for the
    gateway's address (made or reused on the controller: controller/labca.py); None without TLS."""
    if plan.tls is None:
        return None
    if plan.tls.lab_ca_dir:
        from qwen27b.controller import labca  # noqa: PLC0415 (cryptography: only for a lab CA)

        return labca.gateway_cert(plan.tls.lab_ca_dir, plan.host, [plan.address])
    return Path(plan.tls.cert_file).expanduser().read_bytes(), Path(plan.tls.key_file).expanduser().read_bytes()


def unit_contexts(plan: GatewayPlan, where: dict) -> dict[str, dict]:
    listen = listen_on(plan.address, plan.port)
    allow = ["localhost"] + sorted({f"{b.address}/{32 if ipaddress.ip_address(b.address).version == 4 else 128}"
                                    for b in plan.backends})
    return {
        "qwen27b-gateway.service.j2": {
            "listen": listen, "backend_count": len(plan.backends), "pool_unit": POOL_UNIT,
            "lib_dir": where["lib_dir"], "render_pool": pool_argv("render", where), "nginx": NGINX,
            "config": where["config"], "stop_timeout_s": plan.request_timeout_s + 30,
            "hardening": NGINX_HARDENING, "left_off": [f"{what}: {why}" for what, why in NGINX_LEFT_OFF],
        },
        "qwen27b-gateway-pool.service.j2": {
            "backend_count": len(plan.backends), "lib_dir": where["lib_dir"], "watch": pool_argv("watch", where),
            "allow": allow, "hardening": POOL_HARDENING,
            "left_off": [f"{what}: {why}" for what, why in POOL_LEFT_OFF],
        },
    }


def render_gateway(plan: GatewayPlan, usage: bool = True) -> dict[str, str]:
    """Host path -> text of every non-secret file (the keys: keys_text, written as a secret).
    `usage`: the host's OS archive has nginx's Lua module (usage_available)."""
    where = layout()
    units = unit_contexts(plan, where)
    return {
        where["config"]: render("qwen27b-gateway.nginx.conf.j2", nginx_context(plan, where, usage=usage)),
        where["pool_config"]: pool_config(plan, where),
        where["gateway_unit"]: render("qwen27b-gateway.service.j2", units["qwen27b-gateway.service.j2"]),
        where["pool_unit"]: render("qwen27b-gateway-pool.service.j2", units["qwen27b-gateway-pool.service.j2"]),
    }


def firewall_contexts(plan: GatewayPlan, where: dict | None = None) -> dict[str, dict]:
    """The gateway host's nftables rule and its unit, the serving hosts' templates and swap
    (controller/render_firewall.firewall_contexts): with qwen27b_firewall_allow, the API's port and the chat
    page's only from those networks, and the usage counters' port (open on the gateway's address
    with qwen27b_gateway_metrics_allow) only from those; {} without qwen27b_firewall_allow."""
    if plan.firewall_allow is None:
        return {}
    where = where or layout()
    allowed = nft_networks(list(plan.firewall_allow))
    rules = [{"port": plan.port, "what": f"{GATEWAY_UNIT} (the gateway's API)", "allowed": allowed}]
    if plan.chat_page:
        rules.append({"port": plan.chat_page.port, "what": f"{GATEWAY_UNIT} (the chat page)", "allowed": allowed})
    if plan.metrics_allow and plan.address != "127.0.0.1":
        rules.append({"port": USAGE_PORT, "what": f"{GATEWAY_UNIT} (the usage counters)",
                      "allowed": nft_networks(list(plan.metrics_allow))})
    context = {"rules": rules, "ports": ", ".join(str(rule["port"]) for rule in rules), "guards": [GATEWAY_UNIT],
               "established": [], "firewall_unit": FIREWALL_UNIT, "rules_file": where["firewall_rules"]}
    return {"qwen27b-firewall.nft.j2": context, "qwen27b-firewall.service.j2": context}
