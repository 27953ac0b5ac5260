"""The layout's rule (issue 16), read from every import in qwen27b/, function-level ones included:
a place imports only the places below it, onhost < plan < controller < tools; plan/ and onhost/
never import pyinfra; onhost/ imports its siblings relatively (on a host it is qwen27b_onhost);
the package never imports roles/, deploy.py or test machinery; and no modules of one folder import
each other round in a circle (issue 31: plan/ had hostdata -> instances -> gate -> hostdata and more,
held together by function-level imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.support.paths import ROOT

PACKAGE = ROOT / "qwen27b"
ORDER = ["onhost", "plan", "controller", "tools"]
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute name, was relative) of each import in `path`."""
    package = list(path.relative_to(PACKAGE.parent).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, False) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)]
            found.append((".".join(base + ([node.module] if node.module else [])), True))
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", False))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_places_below(path):
    here = path.relative_to(PACKAGE).parts[0]
    wrong = []
    for name, relative in imports(path):
        parts = name.split(".")
        if parts[0] in ("roles", "tests", "deploy", "recordings", "setupcheck"):
            wrong.append(f"{name}: not part of the package")
        elif parts[0] == "pyinfra" and here in ("onhost", "plan"):
            wrong.append(f"{name}: {here}/ runs without pyinfra")
        elif parts[0] == "qwen27b" and len(parts) > 1:
            if parts[1] not in ORDER or ORDER.index(parts[1]) > ORDER.index(here):
                wrong.append(f"{name}: {parts[1]} is not below {here}")
            elif here == "onhost" and not relative:
                wrong.append(f"{name}: on a host the package is qwen27b_onhost, import siblings relatively")
    assert wrong == []


def test_every_module_lives_in_a_place():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    assert {p.relative_to(PACKAGE).parts[0] for p in MODULES} == set(ORDER)


def folder_graph(folder: Path) -> dict[str, set[str]]:
    """module -> the modules of the same folder it imports (function-level imports included)."""
    here = ".".join(folder.relative_to(PACKAGE.parent).parts)
    names = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        found = set()
        for name, _ in imports(path):
            if name.startswith(here + "."):
                found.add(name[len(here) + 1:].split(".")[0])
            elif name == here:  # `from qwen27b.plan import engine`
                found |= {a.name for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, ast.ImportFrom) for a in node.names} & names
        graph[path.stem] = (found & names) - {path.stem}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the modules on it (strongly connected components over one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


FOLDERS = sorted({p.parent for p in MODULES})


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_circle_inside_a_folder(folder):
    assert circles(folder_graph(folder)) == []
