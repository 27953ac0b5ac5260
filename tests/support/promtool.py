"""promtool (Debian's `prometheus` package) and the gateway's recorded usage series, for the alert rules' and
the dashboard's tests."""

import shutil

from tests.support.paths import ROOT


def gateway_usage_names() -> set[str]:
    """The gateway's usage series, as its Lua module served them on a real nginx (recorded by
    tests/servers/test_gateway.py's machinery into tests/fixtures/gateway/usage-metrics.txt)."""
    from prometheus_client.parser import text_string_to_metric_families
    text = (ROOT / "tests" / "fixtures" / "gateway" / "usage-metrics.txt").read_text()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        from setupcheck import skip_or_fail_setup
        skip_or_fail_setup("no promtool: `apt-get install prometheus` (./run tests' setup installs it)")
    return path
