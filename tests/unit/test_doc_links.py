"""Every relative link in README.md and docs/*.md points at a file that exists (issue 50 item 5: the long
paragraphs moved to docs/, so a link left behind would go nowhere): markdown links `[text](path)`,
relative to the file, and the `docs/NAME.md` paths the text names, relative to the repository."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md)")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def broken(page) -> list[str]:
    text = page.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            bad.append(target)
    bad += [p for p in DOC_PATH.findall(text) if not (ROOT / p).is_file()]
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert not broken(page), f"{page.relative_to(ROOT)}: no such file: {broken(page)}"


def test_a_missing_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](nowhere.md) [web](https://example.org) [top](#top)\n")
    assert broken(page) == ["nowhere.md"]
