"""README's host-data table is generated (qwen27b/tools/readme_keys.py) from hostdata.KEYS and the comments
beside each key in the code: a key added without rerunning the tool, or without a comment, fails here."""

from __future__ import annotations

from qwen27b.plan import hostdata
from qwen27b.tools import readme_keys
from tests.support.paths import ROOT


def test_readme_table_is_what_the_tool_generates():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_keys.current(readme), "README.md lacks the host-data markers"
    assert readme_keys.current(readme) == readme_keys.table(), (
        "README.md's host-data table differs from the code: run python3 -m qwen27b.tools.readme_keys")


def test_every_key_is_a_row_with_a_meaning():
    found = readme_keys.rows()
    assert [key for key, *_ in found] == hostdata.KEYS
    missing = [key for key, _, meaning, _ in found if meaning == readme_keys.NO_MEANING]
    assert not missing, f"write a comment beside these keys in the code: {missing}"


def test_a_field_comment_reaches_its_row():
    source = ('class S:\n    # section header\n\n    # first line\n    # second line\n'
              '    a: int = 1  # at the end\n    b: str = "x|y"\n')
    assert readme_keys._comments(source, readme_keys.FIELD) == {"a": "first line second line at the end", "b": ""}


def test_rewrite_replaces_only_the_block():
    readme = f"# top\n\n{readme_keys.BEGIN}\nold\n{readme_keys.END}\n\nbelow\n"
    out = readme_keys.rewrite(readme)
    assert out.startswith("# top\n\n") and out.endswith("\n\nbelow\n")
    assert "| `qwen27b_port` | `8000` |" in out and "\nold\n" not in out
