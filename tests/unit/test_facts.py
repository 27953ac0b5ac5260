"""JSON fixture tests for qwen27b.controller.facts, run the way pyinfra tests its own facts.

One generated TestCase per fact; one test per tests/facts/<FactClassName>/<case>.json with the
keys `command`, `requires_command` (facts that have one), `arg` (DiskFree), `output` and `fact`.
Cases named after a recorded host (tests/fixtures/hosts/<name>/) carry that host's recorded output
(tests/unit/test_recorded.py checks they agree); the others are hand-written edge cases.
"""


from pyinfra_testing.facts import make_fact_tests

from qwen27b.controller.facts import ALL_FACTS
from tests.support.paths import TESTS

FACT_CASES = TESTS / "facts"

for _fact in ALL_FACTS:
    _test_case = make_fact_tests("qwen27b.controller", f"facts.{_fact.__name__}", FACT_CASES / _fact.__name__)
    globals()[f"TestFact{_fact.__name__}"] = _test_case

del _fact, _test_case
