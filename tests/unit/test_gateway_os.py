"""Which Ubuntu gateway counts tokens (issue 56 item 6): the stack's `tools.nginx_lua` held equal to
the Ubuntu archive's own package lists (genuine `Packages` stanzas, tests/fixtures/ubuntu-archive),
and the plan's line per OS. The module's behaviour on Ubuntu 24.04's nginx is checked by running the
loopback gateway tests against it (docs/scale-out.md, "The Lua module per OS")."""

from __future__ import annotations

import re

import pytest
from qwen27b.controller.gateway_render import usage_verdict
from qwen27b.plan.stack import load_stack
from tests.support.paths import TESTS

ARCHIVE = TESTS / "fixtures" / "ubuntu-archive"
RELEASES = {"focal": "20.04", "jammy": "22.04", "noble": "24.04"}


def stanzas(release: str) -> list[tuple[str, dict]]:
    """(component, fields) of every recorded stanza of a release, its -updates pocket included."""
    found = []
    for path in sorted(ARCHIVE.glob(f"{release}*.Packages")):
        component = path.stem.rsplit("-", 1)[1]
        for text in path.read_text().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in text.strip().splitlines())
            if fields:
                found.append((component, fields))
    return found


def relations(depends: str) -> list[list[tuple[str, str | None]]]:
    """A Depends field as its and-list of or-lists of (package, version constraint or None)."""
    return [[(m.group(1), m.group(2)) for m in (re.match(r"([^\s(]+)\s*(?:\((.+)\))?", alt.strip()) for alt in group.split("|"))]
            for group in depends.split(",")]


def lua_module_installable(release: str) -> str | None:
    """The archive component whose libnginx-mod-http-lua the release's own nginx can load (its nginx
    ABI provided, or nginx-common at the module's version), or None."""
    entries = stanzas(release)
    nginx = [f for _, f in entries if f["Package"] in ("nginx", "nginx-core")]
    provided = {p.strip().split(" ")[0] for f in nginx for p in f.get("Provides", "").split(",")}
    versions = {f["Version"] for f in nginx}
    for component, fields in entries:
        if fields["Package"] != "libnginx-mod-http-lua":
            continue
        needs = [alt for group in relations(fields["Depends"]) for alt in group if alt[0].startswith(("nginx-abi-", "nginx-common"))]
        if all(name in provided or (constraint or "").removeprefix("= ") in versions for name, constraint in needs):
            return component
    return None


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_stack_says_a_release_counts_tokens_exactly_where_its_archive_has_a_loadable_lua_module(release):
    lua, name = load_stack()["tools"]["nginx_lua"], f"ubuntu {RELEASES[release]}"
    component = lua_module_installable(release)
    assert (name in lua["on"]) == (component is not None), (release, component)
    assert (name in lua.get("universe", ())) == (component == "universe"), (release, component)


def test_the_recorded_archive_is_what_the_stack_cites():
    """The lists must be the archive's: noble's module is 0.10.26 on OpenResty's LuaJIT, jammy has none."""
    noble = {f["Package"]: f for _, f in stanzas("noble")}
    assert noble["libnginx-mod-http-lua"]["Version"] == "1:0.10.26-2" and "libluajit2-5.1-2" in noble["libnginx-mod-http-lua"]["Depends"]
    assert "libnginx-mod-http-lua" not in {f["Package"] for _, f in stanzas("jammy")}
    assert lua_module_installable("jammy") is None and lua_module_installable("noble") == "universe"


def test_the_plan_line_per_os():
    lua = load_stack()["tools"]["nginx_lua"]
    on, line = usage_verdict(lua, "ubuntu", "24.04")
    assert on and line.endswith("(nginx's Lua module, libnginx-mod-http-lua from the archive's universe component)")
    on, line = usage_verdict(lua, "debian", "12")
    assert on and line.endswith("(nginx's Lua module, libnginx-mod-http-lua)")
    on, line = usage_verdict(lua, "ubuntu", "22.04")
    assert not on and "tokens NOT counted on ubuntu 22.04" in line and "ubuntu 24.04" in line
