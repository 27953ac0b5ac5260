"""Chat page (issue 29): Open WebUI on a gateway host with `qwen27b_chat_page: true`, for the lab's
people who never touch curl (plan/chatpage.py says how accounts become gateway keys).

- its wheels from the controller's wheelhouse (`python3 -m qwen27b.tools.chat_page wheelhouse`),
  pushed and installed offline with uv (--no-index, every wheel's sha256 checked) into a venv of its
  own per version under /opt/qwen27b-chat, once: a later run finds the install's marker and skips it;
- Python 3.11 found by uv on the host (Debian 12's), else uv's managed build (from GitHub: the plan
  says so for a host without it);
- its environment written as a secret (the page's gateway key, the admin's first password, the
  session secret: files the gateway's preflight made on the controller, never printed);
- its hardened unit `qwen27b-chat-page.service` (user qwen27b-chat, loopback only), data in a
  SQLite file under /var/lib/qwen27b-chat kept across deploys; the gateway's nginx serves it (its
  server block: roles/gateway.py renders it with the gateway's config);
- restarted when its environment, unit or install changed; verified with the gateway: /health
  through nginx, the admin's sign-in, the served model in the page's list.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import File
from pyinfra.operations import files, server, systemd

from qwen27b.controller import chat_page_render as P
from qwen27b.controller import progress
from qwen27b.controller.artifacts import constraints_text, dir_manifest, uv_binary, wheel_pins
from qwen27b.controller.operations import directories, push_files, secret_file
from qwen27b.plan.chatpage import UNIT as CHAT_PAGE_UNIT
from qwen27b.plan.distname import normalize
from qwen27b.plan.gateway import GatewayPlan
from qwen27b.plan.stack import load_stack

from ._common import dry_run, note, service_user, started


def chat_page(plan: GatewayPlan) -> None:
    spec = load_stack()["tools"]["chat_page"]
    where = P.layout(spec["version"])
    if plan.chat_page is None:
        _off(where)
        return
    for line in plan.chat_page.describe(spec["version"], plan.scheme, plan.address, int(spec["listen_port"]),
                                        str(P.password_file(plan))):
        note(line)
    service_user(P.USER, P.STATE_DIR)
    directories(name="chat page directories (owner, group, mode)", specs=[
        [P.ROOT, "root", "root", "0755"], [f"{P.ROOT}/bin", "root", "root", "0755"],
        [where["wheelhouse_root"], "root", "root", "0755"], [where["release"], "root", "root", "0755"],
        [P.CONFIG_DIR, "root", "root", "0755"], [P.STATE_DIR, P.USER, P.USER, "0700"],
        [where["data_dir"], P.USER, P.USER, "0700"]])
    fresh = not host.get_fact(File, path=where["installed"])
    if fresh:
        _python_note(spec)
        _install(spec, where)
    else:
        note(f"chat page: Open WebUI {spec['version']} installed in {where['venv']}")
    env = secret_file(name="chat page environment (0600: its gateway key, the admin's first password)",
                      dest=where["env_file"], content=P.env_text(plan, where))
    unit = files.put(name=f"render {where['unit']}", src=StringIO(P.unit_text(plan, where, spec["version"],
                                                                              int(spec["listen_port"]))),
                     dest=where["unit"], user="root", group="root", mode="0644", create_remote_dir=False)
    if unit.will_change:
        systemd.daemon_reload(name="systemd daemon-reload (the chat page's unit changed)")
    why = "installed" if fresh else "its unit changed" if unit.will_change else "its environment changed"
    started(CHAT_PAGE_UNIT, restart=fresh or unit.will_change or env.will_change, why=why)


def _install(spec: dict, where: dict) -> None:
    """Push uv and the wheelhouse, make the venv, install from the wheels only, then the marker."""
    local = P.wheelhouse_dir()
    if dry_run() and not local.is_dir():
        note(f"chat page: will push the wheelhouse {local} (build it first: python3 -m qwen27b.tools.chat_page "
             "wheelhouse)", always=True)
        return
    if not (local.is_dir() and any(local.glob("*.whl"))):
        raise OperationError(f"no chat page wheelhouse at {local}: build it once with `python3 -m "
                             "qwen27b.tools.chat_page wheelhouse` (it fetches Open WebUI's wheels and the CPU torch)")
    uv_version = load_stack()["tools"]["uv"]["version"]
    files.put(name="uv binary (from the controller cache)", src=str(uv_binary(uv_version)), dest=where["uv"],
              user="root", group="root", mode="0755")
    manifest, dest = dir_manifest(local), f"{where['wheelhouse_root']}/{local.name}"
    push = push_files(name="push the chat page's wheelhouse (fetched once on the controller)", src_dir=str(local),
                      dest_dir=dest, manifest=manifest)
    progress.watch(push, host, "wheels", [dest], sum(p.stat().st_size for p in local.glob("*.whl")))
    constraints = f"{dest}.constraints.txt"
    files.put(name="the chat page wheelhouse's pins and hashes (uv --require-hashes)",
              src=StringIO(constraints_text(manifest)), dest=constraints, mode="0644")
    pins = wheel_pins(manifest)
    wanted = [pins[normalize(spec["dist"])][0], pins["torch"][0]]
    uv, venv, cache = where["uv"], where["venv"], where["install_cache"]
    server.shell(name=f"install Open WebUI {spec['version']} into {venv} (uv, offline, every wheel's hash checked)",
                 commands=[
                     f"UV_PYTHON_INSTALL_DIR={P.ROOT}/python {uv} venv --no-config --clear --python "
                     f"{shlex.quote(spec['python'])} {venv}",
                     f"rm -rf {cache} && UV_CACHE_DIR={cache} {uv} pip install --python {venv}/bin/python --no-config "
                     f"--compile-bytecode --no-index --find-links {dest} --require-hashes "
                     f"--constraints {constraints} {' '.join(shlex.quote(w) for w in wanted)} && rm -rf {cache}",
                     f"touch {where['installed']}"])


def _python_note(spec: dict) -> None:
    """Where the page's Python comes from: the host's own (Debian 12's python3.11), else uv downloads
    its managed build from GitHub during the install, which an offline gateway cannot do: said in the
    plan, with what to do, before anything runs."""
    python = f"/usr/bin/python{spec['python']}"
    if host.get_fact(File, path=python):
        note(f"chat page: Python {spec['python']} is the host's own ({python})")
        return
    note(f"chat page: no {python} on this host (Ubuntu 20.04/22.04 have none): uv downloads its managed Python "
         f"{spec['python']} from GitHub during the install; an offline gateway needs python{spec['python']} "
         "installed first (a lab apt mirror, e.g. the deadsnakes PPA's), or a Debian 12 gateway", always=True)


def _off(where: dict) -> None:
    """qwen27b_chat_page not set: a page an earlier deploy started is stopped and disabled (its data
    and venv stay: `qwen27b uninstall` removes them)."""
    if host.get_fact(File, path=where["unit"]):
        systemd.service(name=f"{CHAT_PAGE_UNIT} stopped and disabled (qwen27b_chat_page is off)",
                        service=CHAT_PAGE_UNIT, running=False, enabled=False)
