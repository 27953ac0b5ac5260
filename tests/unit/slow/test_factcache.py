"""qwen27b/controller/factcache.py: a fact is read once while nothing changes the host, never
across States, and re-read after any command an operation runs (@local hosts on a temp dir, so a
command really changes what the next read sees)."""

from __future__ import annotations

import os

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op, operation
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import Command
from pyinfra.operations import python, server

from qwen27b.controller import factcache
from qwen27b.controller.host_facts import SymlinkTarget
from tests.support.recorded import answer_scripts


def make_state(name: str = "@local", data: dict | None = None, cache: bool = True) -> State:
    state = State(Inventory(([(name, data or {})], {})), Config())
    state.set_stage(StateStage.Connect)
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    if cache:
        factcache.install(state)
    return state


def only_host(state):
    return next(iter(state.inventory))


def counting(host) -> list[str]:
    """The commands the host's connector runs, from now on."""
    seen: list[str] = []
    run = host.connector.run_shell_command

    def wrapped(command, *args, **kwargs):
        seen.append(str(command))
        return run(command, *args, **kwargs)

    host.connector.run_shell_command = wrapped
    return seen


def read(state, cls, **kwargs):
    host = only_host(state)
    with ctx_state.use(state), ctx_host.use(host):
        return host.get_fact(cls, **kwargs)


def test_planning_reads_a_fact_once_and_hands_out_copies(tmp_path):
    state = make_state()
    ran = counting(only_host(state))
    first = read(state, Command, command=f"echo one; echo two # {tmp_path}")
    assert read(state, Command, command=f"echo one; echo two # {tmp_path}") == first == "one\ntwo"
    assert len(ran) == 1
    (tmp_path / "f").write_text("x")
    info = read(state, File, path=str(tmp_path / "f"))
    info["size"] = -1  # a caller changing its answer does not change the next one
    assert read(state, File, path=str(tmp_path / "f"))["size"] == 1
    assert len(ran) == 2


def test_two_states_in_one_process_never_share_an_answer():
    one = make_state("@fake/a", {"fake_responses": {"uname -r": ["5.15-one"]}})
    two = make_state("@fake/a", {"fake_responses": {"uname -r": ["6.1-two"]}})
    assert read(one, Command, command="uname -r") == "5.15-one"
    assert read(two, Command, command="uname -r") == "6.1-two"
    assert read(one, Command, command="uname -r") == "5.15-one"


def test_a_new_state_on_the_same_hosts_reads_afresh():
    """A State and its hosts are re-used (pyinfra's API allows it): the memo is the first State's."""
    answers = {"uname -r": ["5.15-old"]}
    inventory = Inventory(([("@fake/a", {"fake_responses": answers})], {}))
    first = State(inventory, Config())
    first.set_stage(StateStage.Prepare)
    factcache.install(first)
    assert read(first, Command, command="uname -r") == "5.15-old"
    answers["uname -r"] = ["6.1-new"]  # the host changed between the two runs
    second = State(inventory, Config())
    second.set_stage(StateStage.Prepare)
    assert read(second, Command, command="uname -r") == "6.1-new"  # no memo for this State
    factcache.install(second)
    assert read(second, Command, command="uname -r") == "6.1-new"  # its own memo, not the first's


def test_a_state_without_the_cache_reads_every_time():
    state = make_state("@fake/a", {"fake_responses": {"uname -r": ["5.15"]}}, cache=False)
    ran = counting(only_host(state))
    read(state, Command, command="uname -r")
    read(state, Command, command="uname -r")
    assert len(ran) == 2


@operation()
def _touch_then_look(path: str, seen: list):
    from pyinfra import host

    seen.append(host.get_fact(File, path=path))
    yield f"touch {path}"
    seen.append(host.get_fact(File, path=path))  # read after its own command ran


@operation()
def _look(path: str, seen: list):
    from pyinfra import host

    seen.append(host.get_fact(File, path=path))
    return
    yield


def test_a_fact_an_operation_changes_is_read_again(tmp_path):
    path = str(tmp_path / "made")
    state = make_state()
    assert read(state, File, path=path) is None
    seen: list = []
    add_op(state, _touch_then_look, path=path, seen=seen)
    add_op(state, _look, path=path, seen=seen)
    seen.clear()  # what planning saw; execution follows
    state.set_stage(StateStage.Execute)
    run_ops(state)
    before, after, later = seen
    assert before is None  # the plan's answer: nothing ran yet
    assert after is not None and later is not None  # the touch ran: read again, not the kept None


def test_a_no_op_operation_keeps_the_answers(tmp_path):
    path = str(tmp_path / "there")
    open(path, "w").close()
    state = make_state()
    seen: list = []
    add_op(state, _look, path=path, seen=seen)
    ran = counting(only_host(state))
    state.set_stage(StateStage.Execute)
    run_ops(state)
    assert seen[-1] is not None and ran == []  # executing it re-read nothing


def test_changes_only_keeps_the_other_facts(tmp_path):
    lock, other = tmp_path / "lock", tmp_path / "other"
    other.write_text("x")
    state = make_state()
    with ctx_state.use(state), ctx_host.use(only_host(state)):
        op = server.shell(commands=[f"echo taken > {lock}"])
        factcache.changes_only(op, Sha1File)
    read(state, Sha1File, path=str(lock))
    read(state, File, path=str(other))
    state.set_stage(StateStage.Execute)
    run_ops(state)
    ran = counting(only_host(state))
    assert read(state, File, path=str(other)) is not None and ran == []  # kept
    assert read(state, Sha1File, path=str(lock)) is not None and len(ran) == 1  # dropped: read again


def test_facts_read_inside_a_python_call_are_not_kept(tmp_path):
    path = str(tmp_path / "p")
    state = make_state()
    answers = []

    def inside():
        host = only_host(state)
        answers.append(host.get_fact(File, path=path))
        open(path, "w").close()
        answers.append(host.get_fact(File, path=path))

    with ctx_state.use(state), ctx_host.use(only_host(state)):
        python.call(function=inside)
    state.set_stage(StateStage.Execute)
    run_ops(state)
    assert answers[0] is None and answers[1] is not None
    assert read(state, File, path=path) is not None  # and everything was dropped after it


def test_prefetch_answers_as_each_read_would(tmp_path):
    (tmp_path / "file").write_text("hello\n")
    # File reports atime, which Sha1File's read would move between the two passes: an atime after
    # the mtime (and not over a day old) is one relatime leaves alone
    os.utime(tmp_path / "file", (2_000_000_000, 1_000_000_000))
    (tmp_path / "dir").mkdir()
    os.symlink("file", tmp_path / "link")
    reads = [(File, {"path": str(tmp_path / "file")}), (Sha1File, {"path": str(tmp_path / "file")}),
             (Directory, {"path": str(tmp_path / "dir")}), (File, {"path": str(tmp_path / "missing")}),
             (SymlinkTarget, {"path": str(tmp_path / "link")}), (Command, {"command": "printf 'a\\n\\nb\\n\\n'"}),
             (Command, {"command": "printf ''"})]
    plain = make_state(cache=False)
    expected = [read(plain, cls, **kwargs) for cls, kwargs in reads]
    state = make_state()
    host = only_host(state)
    ran = counting(host)
    with ctx_state.use(state), ctx_host.use(host):
        factcache.prefetch(reads + [(Command, {"command": "exit 3"})])
    assert len(ran) == 1
    assert [read(state, cls, **kwargs) for cls, kwargs in reads] == expected
    assert expected[5] == "a\n\nb\n" and expected[6] is None
    assert len(ran) == 1
    kept = factcache.cache_of(state).answers[host]
    assert len(kept) == len(reads)  # the failing read is left to pyinfra's own, which reports it


def test_recorded_fake_hosts_answer_a_prefetch_section_by_section():
    answer_scripts()
    state = make_state("@fake/a", {"fake_responses": {"uname -r": ["5.15"], "uname -s": ["Linux"]}})
    ran = counting(only_host(state))
    with ctx_state.use(state), ctx_host.use(only_host(state)):
        factcache.prefetch([(Command, {"command": "uname -r"}), (Command, {"command": "uname -s"})])
    assert read(state, Command, command="uname -s") == "Linux" and read(state, Command, command="uname -r") == "5.15"
    assert len(ran) == 1


def test_an_answer_it_cannot_split_leaves_each_fact_to_its_own_read(monkeypatch):
    state = make_state("@fake/a", {"fake_responses": {"uname -r": ["5.15"], "uname -s": ["Linux"]}})
    host = only_host(state)
    monkeypatch.setattr(type(host.connector), "_lookup_response", lambda self, command: (True, CommandOutput([])))
    with ctx_state.use(state), ctx_host.use(host):
        factcache.prefetch([(Command, {"command": "uname -r"}), (Command, {"command": "uname -s"})])
    assert factcache.cache_of(state).answers[host] == {}
    monkeypatch.undo()
    assert read(state, Command, command="uname -s") == "Linux"


def test_prefetch_reads_nothing_while_executing():
    state = make_state("@fake/a", {"fake_responses": {"uname -r": ["5.15"], "uname -s": ["Linux"]}})
    state.set_stage(StateStage.Execute)
    ran = counting(only_host(state))
    with ctx_state.use(state), ctx_host.use(only_host(state)):
        factcache.prefetch([(Command, {"command": "uname -r"}), (Command, {"command": "uname -s"})])
    assert ran == []


@pytest.mark.parametrize("kwargs", [{"_sudo": False}, {}])
def test_reads_with_global_arguments_are_not_kept(kwargs):
    state = make_state("@fake/a", {"fake_responses": {"uname -r": ["5.15"]}})
    ran = counting(only_host(state))
    read(state, Command, command="uname -r", **kwargs)
    read(state, Command, command="uname -r", **kwargs)
    assert len(ran) == (2 if kwargs else 1)


def test_one_read_is_one_key_however_its_arguments_are_written():
    state = make_state("@fake/a")
    cache, host = factcache.cache_of(state), only_host(state)
    with ctx_state.use(state), ctx_host.use(host):
        by_name = cache.key(state, host, File, (), {"path": "/etc/hosts"})
        by_position = cache.key(state, host, File, ("/etc/hosts",), {})
        other = cache.key(state, host, File, (), {"path": "/etc/passwd"})
        wrong = cache.key(state, host, File, (), {"no_such_argument": 1})
    assert by_name == by_position and by_name != other and wrong is None
    assert by_name[1] == repr([("path", "/etc/hosts")])  # the command's own argument names, defaults filled in


def test_a_read_inside_an_operation_is_keyed_by_its_connector_arguments():
    state = make_state("@fake/a")
    cache, host = factcache.cache_of(state), only_host(state)
    with ctx_state.use(state), ctx_host.use(host):
        outside = cache.key(state, host, File, (), {"path": "/etc/hosts"})
        keys = []
        for arguments in ({"_sudo": False}, {"_sudo": True}, {"_sudo": True}, {"_sudo": False, "name": "x"}):
            host.current_op_global_arguments = arguments  # as pyinfra sets it while an op generates
            keys.append(cache.key(state, host, File, (), {"path": "/etc/hosts"}))
        host.current_op_global_arguments = None
    assert keys[0] == outside == keys[3] and keys[1] == keys[2] != outside
