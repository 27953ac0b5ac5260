"""The journal a failed verify puts in the report (onhost/unit.journal_tail_command): run by a real
shell with awk and tail, `journalctl` replaced by a stand-in that prints a real recorded journal of
the CPU test hosts. A gateway pool's /health probes once a second had filled the report's 80 lines.
Since the profiles pass --disable-access-log-for-endpoints, vLLM no longer logs them; hosts deployed
before (or a build without the option) still do: the probes test reads the journal of a CPU test
host recorded on 2026-12-02, before the option (fixtures/journal-tail/)."""

from __future__ import annotations

import subprocess

from qwen27b.onhost.unit import PROBE_LINE, journal_tail_command
from tests.support.paths import TESTS

JOURNALS = TESTS / "fixtures" / "journals"
BEFORE_QUIET_LOG = TESTS / "fixtures" / "journal-tail" / "real-cpu-2026-12-02.txt"


def _run(tmp_path, text: str, lines: int = 80) -> list[str]:
    (tmp_path / "journal.txt").write_text(text)
    stub = tmp_path / "journalctl"
    stub.write_text(f"#!/bin/sh\ncat {tmp_path / 'journal.txt'}\n")
    stub.chmod(0o755)
    out = subprocess.run(["/bin/sh", "-c", journal_tail_command("qwen27b.service", lines)], capture_output=True,
                         text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True, timeout=30)
    return out.stdout.splitlines()


def test_the_probes_are_left_out_and_counted(tmp_path):
    recorded = BEFORE_QUIET_LOG.read_text().splitlines()
    probes = [line for line in recorded if PROBE_LINE in line]
    assert probes, "the recording holds vLLM's access-log lines of /health probes"
    flooded = recorded + probes * 40  # a minute and more of a pool's probes after the start
    out = _run(tmp_path, "\n".join(flooded) + "\n", lines=20)
    rest = [line for line in recorded if PROBE_LINE not in line]
    assert out[:-1] == rest[-20:]  # the last lines that say something, in order
    assert out[-1] == f"({len(probes) * 41} lines of /health probes in the access log left out)"


def test_a_journal_without_probes_is_passed_through(tmp_path):
    """Today's journals: the access log leaves /health out (real-cpu-healthy was recorded with it)."""
    assert not any(PROBE_LINE in line for line in (JOURNALS / "real-cpu-healthy" / "journal.txt").read_text().splitlines())
    recorded = (JOURNALS / "real-cpu-bad-flag" / "journal.txt").read_text().splitlines()
    assert not any(PROBE_LINE in line for line in recorded)
    assert _run(tmp_path, "\n".join(recorded) + "\n") == recorded[-80:]
