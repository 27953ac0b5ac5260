"""The e2e tier's one lab, as tests/e2e/conftest.py plans it (issue 31): every e2e module has its place
in LAB_ORDER (one left out would run after test_deploy, on a host in the wrong state), and each pytest
process boots the hosts its modules need: three for the second process of `./run tests`, whose bare
host 0 takes the gateway, four for the whole tier in one process."""

from __future__ import annotations

import importlib.util
import sys
from tests.support.paths import TESTS

E2E = TESTS / "e2e"


def _lab_plan():
    spec = importlib.util.spec_from_file_location("e2e_lab_plan", E2E / "conftest.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


PLAN = _lab_plan()
ALL = {p.stem for p in E2E.glob("test_*.py")}


def test_every_e2e_module_has_its_place_in_the_lab_order():
    assert ALL == set(PLAN.LAB_ORDER)
    assert set(PLAN.HOST0_CHAIN) <= ALL and PLAN.LAB_ORDER[0] == PLAN.HOST0_CHAIN[0] == "test_testhosts"


def test_the_second_process_puts_the_gateway_on_its_bare_host_0():
    second = ALL - set(PLAN.HOST0_CHAIN)
    assert PLAN.gateway_host_index(second) == 0 and PLAN.lab_size(second) == 3
    assert PLAN.lab_size(set(PLAN.HOST0_CHAIN)) == 1


def test_one_process_gives_the_gateway_a_host_of_its_own():
    assert PLAN.gateway_host_index(ALL) == 3 and PLAN.lab_size(ALL) == 4


def test_a_module_alone_gets_the_hosts_it_needs():
    assert PLAN.lab_size({"test_scaleout_gateway"}) == 3 and PLAN.lab_size({"test_deploy"}) == 1
    assert PLAN.lab_size({"test_scaleout_gateway", "test_faults"}) == 4  # host 0 serves: the gateway on host 3
