"""One table of the facts the gate reads (qwen27b/controller/gate_facts.py) feeds the one builder the
preflight, doctor and the recorded hosts use: before it, doctor built 15 of the 17 fields (no kernel
headers, no models on disk) and the gate judged its hosts on defaults."""

from __future__ import annotations

import dataclasses

import pytest

from qwen27b.controller import facts as F
from qwen27b.controller.gate_facts import GATE_FACTS, build_host_facts
from qwen27b.plan.gate import HostFacts
from qwen27b.tools.doctor.context import host_facts
from qwen27b.tools.doctor.model import HostSnapshot
from tests.recordings import HOSTS_DIR, recorded_facts


def test_the_table_answers_every_field_from_every_fact():
    assert [name for name, _ in GATE_FACTS] == [f.name for f in dataclasses.fields(HostFacts) if f.name != "gpu_problems"]
    assert {cls for _, cls in GATE_FACTS} == set(F.ALL_FACTS)


def test_a_falsy_answer_takes_the_field_default_and_given_fields_win():
    facts = build_host_facts(lambda cls: cls.default() if cls is F.OsRelease else None, glibc="2.35")
    assert (facts.gpus, facts.secure_boot, facts.nouveau_loaded, facts.kernel, facts.glibc) == ([], "unsupported", False,
                                                                                              None, "2.35")


@pytest.mark.parametrize("host", ["v100x4-converged", "v100x4-noheaders", "v100x1-secureboot", "debian12-cpu"])
def test_doctor_reads_a_recorded_host_as_the_deploy_does(host):
    outputs = {F.SNAPSHOT_NAMES[cls]: (HOSTS_DIR / host / F.SNAPSHOT_NAMES[cls]).read_text(encoding="utf-8")
               for _, cls in GATE_FACTS if (HOSTS_DIR / host / F.SNAPSHOT_NAMES[cls]).is_file()}
    assert host_facts(HostSnapshot(host, outputs=outputs)) == recorded_facts(host)
