"""The chat page's files (issue 29), from the gateway's plan: Open WebUI's unit, its environment (a
secret: the page's gateway key, the admin's first password, the session secret) and the lines the
gateway's nginx gets for it (the page's server, the page's key in the keys include). Every value is
computed here; the templates only loop. Why each Open WebUI variable: stack source open-webui-env."""

from __future__ import annotations

from pathlib import Path

from qwen27b.controller.apikey import CHAT_PAGE_FILES
from qwen27b.controller.artifacts import cache_root
from qwen27b.controller.render import render
from qwen27b.controller.sandbox import SANDBOX
from qwen27b.controller.unitwords import nginx_regex_literal
from qwen27b.onhost.secretfile import load_secret
from qwen27b.onhost.contract import GATEWAY_UNIT
from qwen27b.plan.chatpage import UNIT as CHAT_PAGE_UNIT
from qwen27b.plan.chatpage import CONFIG_DIR, HOUSEKEEPING, ROOT, STATE_DIR, USER
from qwen27b.plan.gateway import GatewayPlan, listen_on
from qwen27b.plan.hostlayout import HostLayout
from qwen27b.plan.stack import load_stack

HEADER = "X-OpenWebUI-User-Email"  # Open WebUI's forwarded account (FORWARD_USER_INFO_HEADER_USER_EMAIL)

# Open WebUI's unit: the shared sandbox; no W+X denial (onnxruntime and torch may map JIT code),
# and no address but loopback: the gateway is all it talks to, so nothing it tries can leave the host.
HARDENING = SANDBOX + [
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
    ("PrivateDevices", "yes"),
    ("ReadWritePaths", STATE_DIR),
    ("UMask", "0077"),
]
LEFT_OFF = [("MemoryDenyWriteExecute= is off", "torch and onnxruntime, imported at start, may map code they generate")]


def layout(version: str) -> dict[str, str]:
    """Host paths of the page (a new version gets a new venv beside the old one; the pushed wheelhouse
    goes under `wheelhouse_root`, named as the controller's)."""
    release = f"{ROOT}/open-webui-{version}"
    return {
        "root": ROOT, "release": release, "venv": f"{release}/venv",
        "installed": f"{release}/venv/.qwen27b-installed",  # written after a whole install (the next run skips it)
        "wheelhouse_root": f"{ROOT}/wheelhouse",
        "uv": f"{ROOT}/bin/uv", "install_cache": f"{ROOT}/.uv-cache",
        "config_dir": CONFIG_DIR, "env_file": f"{CONFIG_DIR}/page.env",
        "state_dir": STATE_DIR, "data_dir": f"{STATE_DIR}/data",
        "unit": HostLayout.unit_file(CHAT_PAGE_UNIT),
    }


def page_secrets(plan: GatewayPlan) -> dict[str, str]:
    """The page's secrets, read from the controller files the gateway's preflight made (apikey.py)."""
    directory = Path(plan.chat_page.secrets_dir)
    return {name: load_secret(str(directory / file_name)) for name, file_name in CHAT_PAGE_FILES.items()}


def password_file(plan: GatewayPlan) -> Path:
    """The admin's first password, on the controller (0600; the admin reads it there)."""
    return Path(plan.chat_page.secrets_dir) / CHAT_PAGE_FILES["admin_password"]


def wheelhouse_dir() -> Path:
    """The controller's wheelhouse for the page (`python3 -m qwen27b.tools.chat_page wheelhouse`)."""
    spec = load_stack()["tools"]["chat_page"]
    return cache_root() / "wheelhouse" / f"{spec['dist']}-{spec['version']}-cp{spec['python'].replace('.', '')}"


def page_url(plan: GatewayPlan) -> str:
    return f"{plan.scheme}://{listen_on(plan.address, plan.chat_page.port)}"


def api_base(plan: GatewayPlan) -> str:
    """Where the page reaches the gateway: its loopback listener (plain HTTP: it never leaves the host)."""
    return f"http://127.0.0.1:{plan.port}/v1"


def env_text(plan: GatewayPlan, where: dict) -> str:
    """Open WebUI's environment (written as a secret, read by systemd as root). The secrets are
    secretfile's characters; e-mails and the URL: plan/chatpage.py's allow-list; the served name:
    hostdata's."""
    page, secrets = plan.chat_page, page_secrets(plan)
    values = {
        "DATA_DIR": where["data_dir"], "HOME": where["state_dir"],
        "WEBUI_URL": page_url(plan), "CORS_ALLOW_ORIGIN": page_url(plan),
        "WEBUI_SECRET_KEY": secrets["session_secret"],
        # sign-in required; the admin made at the first start (an existing user base is kept)
        "WEBUI_AUTH": "true", "ENABLE_SIGNUP": "false", "DEFAULT_USER_ROLE": "user",
        "WEBUI_ADMIN_EMAIL": page.admin_email, "WEBUI_ADMIN_PASSWORD": secrets["admin_password"],
        "WEBUI_ADMIN_NAME": "Admin",
        # the inventory wins at every start over settings an earlier start stored
        "ENABLE_PERSISTENT_CONFIG": "false",
        # the gateway only, with the page's own key and the account's e-mail
        "ENABLE_OLLAMA_API": "false", "ENABLE_OPENAI_API": "true",
        "OPENAI_API_BASE_URL": api_base(plan), "OPENAI_API_KEY": secrets["page_key"],
        "ENABLE_FORWARD_USER_INFO_HEADERS": "true",
        # every account sees the served model (without it only admins see a model no one granted);
        # tools described in the prompt, not sent as OpenAI tools with tool_choice auto (an engine
        # without --enable-auto-tool-choice answers those 400)
        "BYPASS_MODEL_ACCESS_CONTROL": "true", "DEFAULT_MODEL_PARAMS": """'{"function_calling": "legacy"}'""",
        **({"DEFAULT_MODELS": plan.served_name} if plan.served_name else {}),
        # offline: no telemetry, update check, model download, web search or sharing
        "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "ENABLE_VERSION_UPDATE_CHECK": "false", "ANONYMIZED_TELEMETRY": "false", "DO_NOT_TRACK": "true",
        "SCARF_NO_ANALYTICS": "true", "ENABLE_COMMUNITY_SHARING": "false", "ENABLE_WEB_SEARCH": "false",
        "ENABLE_IMAGE_GENERATION": "false", "ENABLE_CODE_INTERPRETER": "false",
        "RAG_EMBEDDING_ENGINE": "openai", "BYPASS_EMBEDDING_AND_RETRIEVAL": "true",
        # a request of the engine's per message, not four: titles yes, follow-ups and tags no
        "ENABLE_FOLLOW_UP_GENERATION": "false", "ENABLE_TAGS_GENERATION": "false",
    }
    lines = [f"{key}={value}" for key, value in values.items()]
    return "# Written by qwen27b (root, 0600): the chat page's environment. Secret.\n" + "\n".join(lines) + "\n"


def unit_text(plan: GatewayPlan, where: dict, version: str, internal_port: int) -> str:
    return render("qwen27b-chat-page.service.j2", {
        "version": version, "listen": f"127.0.0.1:{internal_port}", "gateway_unit": GATEWAY_UNIT, "url": page_url(plan),
        "user": USER, "env_file": where["env_file"], "state_dir": where["state_dir"],
        "exec_start": [f"{where['venv']}/bin/open-webui", "serve", "--host", "127.0.0.1", "--port", str(internal_port)],
        "hardening": HARDENING, "left_off": [f"{what}: {why}" for what, why in LEFT_OFF],
    })


def nginx_lines(plan: GatewayPlan, where: dict) -> dict[str, list[str]]:
    """The gateway config's lines for the page: its server on the gateway's address (with the
    gateway's TLS), the loopback listener the page sends to, and the refusal of an unmapped account."""
    if plan.chat_page is None:
        return {"page_listens": [], "page_location": [], "page_server": []}
    internal_port = int(load_stack()["tools"]["chat_page"]["listen_port"])
    tls = ([f"    ssl_certificate {where['tls_cert']};", f"    ssl_certificate_key {where['tls_key']};",
            "    ssl_protocols TLSv1.2 TLSv1.3;"] if plan.tls else [])
    return {
        # the page's requests: loopback, plain (a gateway on loopback, as in the tests, has it already)
        "page_listens": [f"127.0.0.1:{plan.port}"] if plan.address != "127.0.0.1" else [],
        "page_location": [
            "# a chat page account with no gateway key (qwen27b_chat_page_accounts): refused, saying so",
            "if ($qwen27b_page_unmapped) {",
            "    return 403 '{\"error\": {\"message\": \"this chat page account has no gateway key: the lab admin "
            "maps it in qwen27b_chat_page_accounts\", \"type\": \"invalid_request_error\", \"code\": "
            "\"unmapped_account\"}}\\n';",
            "}",
        ],
        "page_server": [
            "# the chat page (qwen27b_chat_page): Open WebUI on loopback, served on the gateway's address",
            "map $http_upgrade $qwen27b_page_connection { default upgrade; \"\" \"\"; }",
            "server {",
            f"    listen {listen_on(plan.address, plan.chat_page.port)}{' ssl' if plan.tls else ''};",
            *tls,
            "    access_log off;  # the page's own traffic; its model requests are in the gateway's log",
            "    client_max_body_size 64m;",
            "    location / {",
            f"        proxy_pass http://127.0.0.1:{internal_port};",
            "        proxy_http_version 1.1;",
            "        proxy_set_header Upgrade $http_upgrade;  # its live updates: a WebSocket",
            "        proxy_set_header Connection $qwen27b_page_connection;",
            "        proxy_set_header Host $host;",
            "        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
            "        proxy_set_header X-Forwarded-Proto $scheme;",
            "        proxy_buffering off;  # streamed answers reach the browser as they come",
            f"        proxy_read_timeout {plan.request_timeout_s}s;",
            "    }",
            "}",
        ],
    }


def keys_lines(plan: GatewayPlan) -> list[str]:
    """The keys include's lines for the page (after the client keys' map, which then sets
    $qwen27b_key_client): the page's key counts as the account's gateway key, by the e-mail in
    Open WebUI's header, only from loopback; without an account (the page's own model list) as
    chat-page; any account may list the model (the page shows it), an unmapped one nothing else."""
    key = nginx_regex_literal(page_secrets(plan)["page_key"])
    accounts = [(nginx_regex_literal(email), name) for email, name in plan.chat_page.accounts]
    return [
        "# the chat page's key (from loopback only) and its accounts (qwen27b_chat_page_accounts)",
        f'map $http_authorization $qwen27b_page_key {{ default ""; "~^Bearer {key}$" 1; }}',
        f'map "$qwen27b_page_key|$remote_addr|$http_{HEADER.lower().replace("-", "_")}|$request_method $uri" $qwen27b_client {{',
        "    default $qwen27b_key_client;",
        # the e-mail whole: anchored at the `|` before the request line, which holds none ("alice@lab|x"
        # is not alice: issue 51)
        *(f'    "~*^1[|]127[.]0[.]0[.]1[|]{email}[|][^|]*$" "{name}";' for email, name in accounts),
        f'    "~^1[|]127[.]0[.]0[.]1[|][^|]*[|]GET /v1/models$" "{HOUSEKEEPING}";',
        '    "~^1[|]" "";',
        "}",
        'map "$qwen27b_page_key|$qwen27b_client" $qwen27b_page_unmapped { default ""; "1|" 1; }',
    ]

