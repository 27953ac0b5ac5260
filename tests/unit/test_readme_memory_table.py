"""README's memory-plan table is read from the golden plans (tests/golden): a row whose figures
the golden no longer shows fails here, so the README cannot drift from what the planner prints."""

from __future__ import annotations

import re
from tests.support.paths import ROOT

ROW = re.compile(r"^\| .*\(`(?P<golden>[a-z0-9-]+)`\) \| (?P<tp>[^|]*)\| (?P<len>[^|]*)\| (?P<seqs>[^|]*)\| (?P<kv>[^|]*)\|$",
                 re.M)


def rows() -> list[dict]:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| host (golden) |", 1)[1].split("\n\n", 1)[0]
    return [m.groupdict() for m in ROW.finditer(table)]


def test_the_table_names_goldens_that_exist():
    found = rows()
    assert len(found) >= 4, found
    for row in found:
        assert (ROOT / "tests" / "golden" / f"{row['golden']}.txt").is_file(), row


def test_every_row_says_what_its_golden_plan_says():
    for row in rows():
        golden = (ROOT / "tests" / "golden" / f"{row['golden']}.txt").read_text()
        if row["len"].startswith("refused"):
            before = re.search(r"([\d.]+ GiB) before KV", row["len"]).group(1)
            assert golden.startswith(f"== @fake/{row['golden']}: REFUSED"), row
            assert f"({before} before KV)" in golden, row
            continue
        length = row["len"].split()[0]
        assert re.search(rf"^--max-model-len(?: \(pinned\))?\s+{length}\s", golden, re.M), row
        seqs = row["seqs"].split()[0]
        assert re.search(rf"^--max-num-seqs\s+{seqs}\s", golden, re.M), row
        kv = row["kv"].split()[0]
        assert re.search(rf"^KV capacity\s+{kv} tokens", golden, re.M), row
        if "lowered" in row["seqs"]:
            assert re.search(r"^--max-num-seqs\s+\S+\s+lowered", golden, re.M), row
