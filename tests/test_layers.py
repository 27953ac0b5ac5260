"""The layout's rule (issue 16), read from every import in qwen27b/, function-level ones included:
a place imports only the places below it, onhost < plan < controller < tools; plan/ and onhost/
never import pyinfra; onhost/ imports its siblings relatively (on a host it is qwen27b_onhost);
the package never imports roles/, deploy.py or test machinery."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "qwen27b"
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
