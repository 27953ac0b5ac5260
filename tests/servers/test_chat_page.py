"""The chat page (issue 29) without a browser: its plan from host data (refusals name host, key and
fix), its rendered files (nginx -t, systemd-analyze), and a real nginx on loopback in front of a stub
backend counting a page account's requests under its gateway key. The page in Chromium against a
real vLLM is the e2e tier's (tests/e2e/test_scaleout_gateway.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import httpx
import pytest

from qwen27b.controller import apikey
from qwen27b.controller import chat_page_render as P
from qwen27b.controller import gateway_render as G
from qwen27b.plan.chatpage import HOUSEKEEPING, ChatPage
from qwen27b.plan.gateway import Backend, Client, GatewayPlan
from qwen27b.plan.hostdata import BadHostData
from qwen27b.plan.lifecycle import Installed, UninstallOptions, uninstall_plan
from qwen27b.plan.stack import load_stack
from qwen27b.tools.doctor.diagnose_symptom import chat_page_check
from qwen27b.tools.doctor.model import CHAT_PAGE_KEY, HostSnapshot
from qwen27b.tools.status import HostStatus, _gateway_cells, _parse_gateway
from tests.support.gateway_lab import config_test, running_nginx
from tests.support.gateway_lab import free_port as P_free_port
from tests.support.gateway_stubs import keys, lab, nginx_binary, plan_of, stub  # noqa: F401 (fixture)

PAGE = {"qwen27b_chat_page": True, "qwen27b_chat_page_accounts": {"Alice@Lab.example": "a"}}


def test_the_page_is_planned_from_the_gateways_data_and_says_why(keys):
    plan = plan_of(*lab(keys, PAGE))
    assert plan.chat_page == ChatPage(8080, "admin@qwen27b.lab", (("alice@lab.example", "a"),))
    assert plan_of(*lab(keys)).chat_page is None
    lines = plan.chat_page.describe("0.12.4", "https", "10.0.0.9", 8081, ".qwen27b/chat-page/gw/admin.password")
    text = "\n".join(lines)
    for part in ("Open WebUI 0.12.4 at https://10.0.0.9:8080/", "the gateway's TLS", "no sign-up",
                 "admin@qwen27b.lab (password in .qwen27b/chat-page/gw/admin.password on the controller, 0600, never printed)",
                 "alice@lab.example -> a", "an account not listed is refused by the gateway", "telemetry, update checks"):
        assert part in text


@pytest.mark.parametrize("data, key, text", [
    ({"qwen27b_chat_page_accounts": {"a@b.cd": "a"}}, "qwen27b_chat_page_accounts", "qwen27b_chat_page is not true"),
    ({**PAGE, "qwen27b_chat_page_accounts": {"bob@lab.example": "bb"}}, "qwen27b_chat_page_accounts",
     "'bb' is not the name of a key in qwen27b_gateway_key_files (did you mean 'b'?)"),
    ({**PAGE, "qwen27b_chat_page_accounts": {"bob at lab": "a"}}, "qwen27b_chat_page_accounts", "not an e-mail address"),
    ({**PAGE, "qwen27b_chat_page_accounts": {"a@b.cd": "a", "A@B.cd": "b"}}, "qwen27b_chat_page_accounts", "listed twice"),
    ({**PAGE, "qwen27b_chat_page_admin_email": 'x"@y.z'}, "qwen27b_chat_page_admin_email", "not an e-mail address"),
    ({**PAGE, "qwen27b_chat_page_port": 8000}, "qwen27b_chat_page_port", "taken by the gateway's API"),
    ({**PAGE, "qwen27b_chat_page_accounts": ["a"]}, "qwen27b_chat_page_accounts", "expected dict"),
])
def test_bad_page_settings_are_refused_naming_host_key_and_fix(keys, data, key, text):
    with pytest.raises(BadHostData) as refused:
        plan_of(*lab(keys, data))
    assert refused.value.host == "gw" and refused.value.key == key and text in str(refused.value), str(refused.value)


def test_a_page_setting_outside_the_gateway_group_and_a_key_named_like_the_pages_own_are_refused(keys, tmp_path):
    with pytest.raises(BadHostData, match="only hosts of the qwen27b_gateway group read it"):
        plan_of(*lab(keys, b1={"qwen27b_chat_page": True}))
    named = {"qwen27b_gateway_key_files": [{"file": keys["a"], "name": HOUSEKEEPING}], **PAGE,
             "qwen27b_chat_page_accounts": {}}
    with pytest.raises(BadHostData, match="the name the chat page's own requests count under"):
        plan_of(*lab(keys, named))


def page_plan(keys, tmp_path, address: str = "10.0.0.9", port: int = 8000, tls=None) -> GatewayPlan:
    directory = tmp_path / "state" / "chat-page" / "gw"
    assert apikey.ensure_chat_page(directory) == ["page.key", "admin.password", "session.secret"]
    assert apikey.ensure_chat_page(directory) == []  # made once, kept
    plan = plan_of(*lab(keys, PAGE))
    page = dataclasses.replace(plan.chat_page, secrets_dir=str(directory), port=P_free_port() if address == "127.0.0.1" else 8080)
    return dataclasses.replace(plan, address=address, port=port, chat_page=page, tls=tls)


def test_the_pages_files_keep_its_secrets_in_its_env_file_and_the_keys_include_only(keys, tmp_path):
    plan = page_plan(keys, tmp_path)
    where = P.layout("0.12.4")
    secrets = P.page_secrets(plan)
    env = P.env_text(plan, where)
    for line in ("ENABLE_SIGNUP=false", "WEBUI_AUTH=true", "ENABLE_FORWARD_USER_INFO_HEADERS=true", "OFFLINE_MODE=true",
                 "OPENAI_API_BASE_URL=http://127.0.0.1:8000/v1", "WEBUI_ADMIN_EMAIL=admin@qwen27b.lab",
                 "ENABLE_VERSION_UPDATE_CHECK=false", "ENABLE_COMMUNITY_SHARING=false", "ENABLE_PERSISTENT_CONFIG=false",
                 f"OPENAI_API_KEY={secrets['page_key']}", f"WEBUI_ADMIN_PASSWORD={secrets['admin_password']}"):
        assert line in env.splitlines(), line
    gateway = G.render_gateway(plan)
    unit = P.unit_text(plan, where, "0.12.4", 8081)
    keys_text = G.keys_text(plan)
    assert "$qwen27b_key_client" in keys_text and '"~*^1[|]127[.]0[.]0[.]1[|]alice@lab\\.example[|][^|]*$" "a"' in keys_text
    assert secrets["page_key"].replace(".", "\\.") in keys_text
    leaked = [(name, s) for name, text in {**gateway, "unit": unit}.items() for s in secrets.values() if s in text]
    assert leaked == []
    config = gateway[G.layout()["config"]]
    assert "listen 10.0.0.9:8080;" in config and "listen 127.0.0.1:8000;" in config and "proxy_pass http://127.0.0.1:8081;" in config
    assert "IPAddressDeny=any" in unit and "User=qwen27b-chat" in unit and "qwen27b chat page at http://10.0.0.9:8080/" in unit


def test_the_page_speaks_tls_whenever_the_gateway_does(keys, tmp_path):
    from qwen27b.plan.gateway import Tls

    plan = page_plan(keys, tmp_path, tls=Tls(lab_ca_dir=str(tmp_path / "ca")))
    config = G.render_gateway(plan)[G.layout()["config"]]
    page_server = config[config.index("# the chat page (qwen27b_chat_page)"):]
    assert "listen 10.0.0.9:8080 ssl;" in page_server and "ssl_certificate /etc/qwen27b-gateway/tls.crt;" in page_server
    assert "WEBUI_URL=https://10.0.0.9:8080" in P.env_text(plan, P.layout("0.12.4"))
    assert "OPENAI_API_BASE_URL=http://127.0.0.1:8000/v1" in P.env_text(plan, P.layout("0.12.4"))  # loopback


def test_a_gateway_with_the_page_passes_nginx_t_and_its_unit_systemd_analyze(keys, tmp_path):
    plan = page_plan(keys, tmp_path, address="127.0.0.1", port=P_free_port())
    result = config_test(plan, tmp_path / "root", nginx_binary(), ["gpu-1"])
    assert result.returncode == 0 and "test is successful" in result.stderr, result.stderr
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze missing (./run tests installs systemd)")
    unit = tmp_path / "qwen27b-chat-page.service"
    unit.write_text(P.unit_text(plan, P.layout("0.12.4"), "0.12.4", 8081).replace("/opt/qwen27b-chat/open-webui-0.12.4/venv/bin/open-webui", "/bin/true"))
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert not [line for line in verify.stderr.splitlines() if "qwen27b-chat-page" in line and "User" not in line], verify.stderr


def test_nginx_counts_a_page_accounts_requests_under_its_key_and_refuses_an_unmapped_one(keys, tmp_path):
    """A real nginx (the rendered config) in front of a stub backend: the page's key with a mapped
    account's e-mail is that account's key (the backends get theirs); the page's model list counts
    as chat-page, for any account; an unmapped account's completion is refused with the fix; the
    page's key without the page's header is no client key."""
    backend = stub("a")
    plan = dataclasses.replace(page_plan(keys, tmp_path, address="127.0.0.1", port=P_free_port()),
                               backends=(Backend("a", "127.0.0.1", backend.server_address[1], backend.server_address[1]),),
                               clients=(Client("a", keys["a"]), Client("b", keys["b"])))
    page_key = P.page_secrets(plan)["page_key"]
    log = tmp_path / "requests.log"
    try:
        with running_nginx(plan, tmp_path / "root", nginx_binary(), access_log=f"{log} qwen27b") as lb:
            def send(email: str | None, method: str = "POST", path: str = "/v1/chat/completions") -> httpx.Response:
                headers = {"Authorization": f"Bearer {page_key}", **({P.HEADER: email} if email else {})}
                return httpx.request(method, f"{lb['base']}{path}", headers=headers, json={}, timeout=10)

            mapped, upper = send("alice@lab.example"), send("ALICE@lab.example")
            listed, listed_by_unmapped = send(None, "GET", "/v1/models"), send("bob@lab.example", "GET", "/v1/models")
            unmapped, no_header = send("bob@lab.example"), send(None)
            forged = send("alice@lab.example|x")  # another account whose e-mail starts with a mapped one and a |
    finally:
        backend.shutdown()
    assert (mapped.status_code, upper.status_code, listed.status_code, listed_by_unmapped.status_code) == (200, 200, 200, 200)
    assert unmapped.status_code == 403 and unmapped.json()["error"]["code"] == "unmapped_account"
    assert "qwen27b_chat_page_accounts" in unmapped.json()["error"]["message"]
    assert no_header.status_code == 403 and forged.status_code == 403  # never counted as alice
    assert backend.seen[:2] == ["Bearer backend-key-0123"] * 2  # the page's key ends at the gateway
    lines = [r for r in map(json.loads, log.read_text().splitlines()) if r["path"] != "/health"]
    assert [(r["key"], r["status"]) for r in lines] == [("a", 200), ("a", 200), (HOUSEKEEPING, 200), (HOUSEKEEPING, 200),
                                                        ("", 403), ("", 403), ("", 403)]


def test_uninstall_removes_the_page_and_keeps_its_users_and_chats_unless_asked():
    paths = load_stack()["paths"]
    have = Installed(paths={"/opt/qwen27b-chat": "root:root", "/etc/qwen27b-chat": "root:root",
                            "/var/lib/qwen27b-chat": "qwen27b-chat:qwen27b-chat",
                            "/etc/systemd/system/qwen27b-chat-page.service": "root:root"},
                     units={"qwen27b-chat-page.service": "active"}, users=["qwen27b-chat"], groups=["qwen27b-chat"])
    removals, kept = uninstall_plan(have, paths, UninstallOptions(), "/etc/systemd/system", "/t/qwen27b.prom")
    what = [r.what for r in removals]
    assert what[0] == "stop qwen27b-chat-page.service" and "/opt/qwen27b-chat" in what and "/etc/qwen27b-chat" in what
    assert "/var/lib/qwen27b-chat" not in what and not [w for w in what if "qwen27b-chat " in w + " " and "user" in w]
    assert any("chat page's users and chats" in k and "--chat-data" in k for k in kept)
    removals, kept = uninstall_plan(have, paths, UninstallOptions(chat_data=True), "/etc/systemd/system", "/t/qwen27b.prom")
    assert {"/var/lib/qwen27b-chat", "chat page user qwen27b-chat"} <= {r.what for r in removals}
    assert not [k for k in kept if "chat" in k]


def snapshot(text: str | None, data: dict | None = None) -> HostSnapshot:
    return HostSnapshot(host="gw", data=data or {}, outputs={} if text is None else {CHAT_PAGE_KEY: text})


@pytest.mark.parametrize("text, data, verdict, words", [
    ("LoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=0\nHealth=200\n", {}, "ok", "answers /health"),
    ("LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nNRestarts=4\nHealth=000\n"
     "Journal=sqlite3.OperationalError: unable to open database file\n", {}, "fail", "unable to open database file"),
    ("LoadState=not-found\nHealth=000\n", {"qwen27b_chat_page": True}, "fail", "is not installed"),
])
def test_doctor_has_one_check_for_the_page(text, data, verdict, words):
    class Ctx:
        snap = snapshot(text, data)

    checks = chat_page_check(Ctx)
    assert [(c.check, c.verdict) for c in checks] == [("chat page", verdict)] and words in checks[0].evidence, checks


def test_doctor_has_no_page_check_where_none_is_asked_for():
    class Ctx:
        snap = snapshot("LoadState=not-found\n")

    assert chat_page_check(Ctx) == []


def test_status_shows_the_pages_unit_and_address_beside_the_gateway():
    row = HostStatus("gw")
    _parse_gateway(row, "LoadState=loaded\nActiveState=active\nSubState=running\n", '{"pool": ["a"]}', 0,
                   "LoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=0\n"
                   "Description=qwen27b chat page at https://10.0.0.9:8080/ (Open WebUI 0.12.4 on 127.0.0.1:8081)\n")
    assert row.gateway["page"] == {"active": "active", "sub": "running", "url": "https://10.0.0.9:8080/"}
    assert _gateway_cells(row.gateway)[0] == "gateway active/running; chat page active/running https://10.0.0.9:8080/"


def test_the_key_command_writes_a_new_key_once_and_prints_only_its_inventory_entry(tmp_path, capsys):
    from qwen27b.onhost.secretfile import load_secret
    from qwen27b.tools.cli import main

    path = tmp_path / "secrets" / "alice.key"
    assert main(["key", "new", str(path)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"file": str(path), "name": "alice"} and path.stat().st_mode & 0o777 == 0o600
    key = load_secret(str(path))
    assert key.startswith("sk-qwen27b-") and key not in out.out + out.err
    assert main(["key", "new", str(path)]) == 1 and load_secret(str(path)) == key  # never overwritten
    assert "never overwritten" in capsys.readouterr().err
    assert main(["key", "new", str(tmp_path / "b.key"), "--name", "bad name"]) == 2
