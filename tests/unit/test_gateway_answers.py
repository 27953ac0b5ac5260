"""`qwen27b gateway status|drain|undrain`'s lines (issue 48's README walk: drain and undrain did their
work on the lab's gateway, then printed a TypeError traceback: their record's `drained` is a bool)."""

from qwen27b.tools.gateway import answer_line


def test_drain_names_the_drained_backend_and_the_wait():
    record = {"backend": "q27t3", "drained": True, "pool": ["q27t2"], "waited_s": 0.0, "old_workers_busy": 0}
    assert answer_line("q27t4", record) == "q27t4: pool q27t2; drained q27t3; waited 0.0 s"


def test_undrain_shows_the_pool_it_returned_to():
    record = {"backend": "q27t3", "drained": False, "pool": ["q27t2", "q27t3"]}
    assert answer_line("q27t4", record) == "q27t4: pool q27t2, q27t3"


def test_status_lists_the_drained_and_the_fair_share():
    record = {"pool": ["q27t2"], "drained": ["q27t3"], "fair_share": 3}
    assert answer_line("q27t4", record) == "q27t4: pool q27t2; drained q27t3; fair share 3 at once per key"
    assert answer_line("q27t4", {"pool": [], "drained": []}) == "q27t4: pool none"
