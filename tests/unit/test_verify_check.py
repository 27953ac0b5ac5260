"""Which check verify runs (issue 48, qwen27b/controller/verifyplan.py): the figures (a streamed
64-token answer, acceptance) after a run that changed what serves, a liveness check (/health,
/v1/models, a 1-token answer) after one that changed nothing; the plan and the run summary say
which. The decision is pure; the plans of the recorded hosts (tests/golden: v100x4-copies-converged
says liveness for both copies, v100x4-copies-drop-b for the copy left as it was) show it on the
service role's real view of a run; tests/servers/test_verify_live.py runs both checks on a real vLLM."""

from __future__ import annotations

import types

import pytest

from qwen27b.controller import postdeploy as V
from qwen27b.controller.verifyplan import FIGURES, LIVENESS, Check, changed_names, summary_detail, which_check
from qwen27b.plan import retry
from tests.support.gate_run import run


def test_a_run_that_changed_nothing_that_serves_checks_liveness():
    check = which_check(())
    assert check == Check(LIVENESS, ()) and not check.figures
    assert check.plan_line().startswith("verify: a liveness check (/health, /v1/models with the key, a 1-token answer), "
                                        "no new figures: nothing that serves changed")


@pytest.mark.parametrize("changed", [("the release",), ("the unit (its flags)",), ("the model link", "the weights"),
                                     ("the API key",), ("the on-host code",)])
def test_a_run_that_changed_what_serves_measures_the_figures_naming_what_changed(changed):
    check = which_check(list(changed))
    assert check.figures and check.changed == changed
    assert check.plan_line() == ("verify: the figures (a streamed 64-token answer: TTFT, tok/s; acceptance when "
                                 f"speculating): this run changed {', '.join(changed)}")


def test_when_no_role_said_what_changed_the_figures_are_measured():
    """A verify no service role planned for (the rollback deploy's own): never a liveness check by default."""
    assert which_check(None) == Check(FIGURES, None)
    assert which_check(None).plan_line().endswith(": what this run changed is not known")


def test_changed_names_are_the_operations_that_will_change_each_named_once():
    op = lambda change: types.SimpleNamespace(will_change=change)  # noqa: E731 (pyinfra's OperationMeta answers will_change)
    assert changed_names([("the env file", op(False)), ("the unit (its flags)", op(True)), ("the release", op(True)),
                          ("the API key", op(False)), ("the release", op(True))]) == ["the unit (its flags)", "the release"]
    assert changed_names([("the env file", op(False))]) == []


def test_the_summary_says_which_check_ran_on_an_ok_host():
    assert summary_detail("ok", "", LIVENESS, [], None, None) == (
        "liveness check (nothing that serves changed): /health, /v1/models, a 1-token answer; no new figures")
    assert summary_detail("ok", "", FIGURES, ["the release", "the unit (its flags)"], 0.2345, 19.84) == (
        "figures measured (the release, the unit (its flags) changed): TTFT 234 ms, 19.8 tok/s")
    retried = "verified on start 2 of 2 (speculative off)"
    assert summary_detail("ok", retried, FIGURES, None, 0.1, 30.0) == (
        f"figures measured (what changed is not known): TTFT 100 ms, 30.0 tok/s; {retried}")
    # a host that failed, or never got as far as a check, keeps its reason as it was
    assert summary_detail("failed", "not ready after 600 s", LIVENESS, [], None, None) == "not ready after 600 s"
    assert summary_detail("rolled back", "rolled back: x", FIGURES, ["the release"], 0.1, 1.0) == "rolled back: x"
    assert summary_detail("ok", "", "", None, None, None) == ""


def test_the_run_summary_row_of_each_host_names_its_check():
    from qwen27b.controller import runreport
    results = [V.HostResult("gpu-a", status="ok", check=LIVENESS, changed=[], completion_tokens=1),
               V.HostResult("gpu-b", status="ok", check=FIGURES, changed=["the release"], ttft_s=0.5, decode_tok_s=20.0)]
    found = runreport.verified(types.SimpleNamespace(results=results))
    assert found["gpu-a"] == ("ok", "liveness check (nothing that serves changed): /health, /v1/models, a 1-token "
                                    "answer; no new figures")
    assert found["gpu-b"] == ("ok", "figures measured (the release changed): TTFT 500 ms, 20.0 tok/s")
    table = V.report_table(results)
    assert table.splitlines()[0].split()[:3] == ["host", "status", "check"]
    assert table.splitlines()[2].split()[:3] == ["gpu-a", "ok", "liveness"]


def test_a_retry_that_restarts_with_changed_flags_measures_the_figures(monkeypatch):
    """A liveness run whose service was found stalled in its start (the watchdog) restarts it with the
    retry's flags: that start serves changed flags, so it is checked with the figures."""
    from qwen27b.controller import startwatch
    seen, evidence = [], "start-up made no progress for 600 s"
    starts = iter([V.VerifyFailed(evidence, retry=retry.Failure(retry.STALLED, evidence)), None])

    def serving(result, *args, check=Check(FIGURES), **kwargs):
        seen.append(check)
        outcome = next(starts)
        if outcome:
            raise outcome
        result.check = check.kind

    monkeypatch.setattr(startwatch, "host", types.SimpleNamespace(name="gpu-a"))
    monkeypatch.setattr(startwatch, "say", lambda line: None)
    monkeypatch.setattr(startwatch, "serving", serving)
    monkeypatch.setattr(startwatch, "host_lines", lambda command: [])  # the stop before the retry; no record to write
    monkeypatch.setattr(startwatch, "restart_with", lambda decision: None)
    result = V.HostResult("gpu-a")
    _, failure = startwatch.start_and_watch(result, None, run("v100x4-converged"), which_check(()))
    assert failure is None and [c.kind for c in seen] == [LIVENESS, FIGURES]
    assert seen[1].changed == ("the unit's flags (a retry)",) and result.check == FIGURES


def test_a_wildcard_bound_service_is_probed_at_the_lab_address_never_the_wildcard():
    """Issue 51: from the controller, 0.0.0.0 or :: is the controller itself; verify would send the
    API key to whatever listens there. A wildcard bind is probed at the host's lab address; with
    none (ssh_hostname a name) the host is not verified, saying why."""
    from qwen27b.controller.verifyplan import probe_address

    assert probe_address("10.0.0.5", {"ssh_hostname": "10.0.0.9"}) == "10.0.0.5"
    assert probe_address("0.0.0.0", {"ssh_hostname": "10.0.0.9"}) == "10.0.0.9"
    assert probe_address("::", {"ssh_hostname": "fd00::9"}) == "fd00::9"
    assert probe_address("0.0.0.0", {"ssh_hostname": "gpu-1.lab"}) is None
    assert probe_address("0.0.0.0", {}) is None
