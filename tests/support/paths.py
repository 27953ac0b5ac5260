"""Where the tests find the repository and their data, wherever their module lives (tests/unit,
tests/plans, tests/servers, tests/e2e: docs/testhosts.md, "Tiers"): the fixtures, golden plans and
recorded facts stay in tests/ (fixtures/, golden/, facts/, ...), the code under test in ROOT."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
