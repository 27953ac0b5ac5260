"""qwen27b.onhost.listener: who holds the service's port, read from recorded /proc formats.

The /proc text is genuine (tests/fixtures/proc/README.md says how it was recorded: a process of user
nobody listening on 127.0.0.1:18000, [::]:18001, [::ffff:127.0.0.1]:18002 and [::1]:18000); the
process tree is a /proc laid out in a scratch directory with those files, `stat` lines and fd links
(`socket:[INODE]`, as the kernel shows them), so check_owner reads it exactly as it reads the real one.
"""

from __future__ import annotations

import ipaddress
import os

import pytest

from qwen27b.onhost import listener
from tests.support.paths import TESTS

RECORDED = TESTS / "fixtures" / "proc"
IP = ipaddress.ip_address


def _sockets():
    return (listener.parse_net_tcp((RECORDED / "net_tcp.txt").read_text())
            + listener.parse_net_tcp((RECORDED / "net_tcp6.txt").read_text()))


def test_parse_net_tcp_reads_the_recorded_addresses_ports_uids_and_inodes():
    got = {(str(s["address"]), s["port"], s["state"], s["uid"], s["inode"]) for s in _sockets()}
    assert ("127.0.0.1", 18000, "0A", 65534, 3819545) in got
    assert ("::", 18001, "0A", 65534, 3819546) in got
    assert ("::ffff:7f00:1", 18002, "0A", 65534, 3819547) in got  # ::ffff:127.0.0.1
    assert ("::1", 18000, "0A", 65534, 3819548) in got
    assert ("0.0.0.0", 2024, "0A", 0, 315) in got
    assert ("192.0.2.2", 40164, "01", 0, 3810778) in got  # an established connection: not LISTEN
    assert listener.parse_net_tcp("header\ngarbage line\n   9: ZZ:1 00:0 0A x x x x x x\n") == []


@pytest.mark.parametrize("address,port,inodes", [
    ("127.0.0.1", 18000, {3819545}),  # the exact address (::1:18000 is v6-only and another address)
    ("::1", 18000, {3819548}),
    ("127.0.0.1", 18001, {3819546}),  # [::] is dual-stack: an IPv4 connection reaches it
    ("::1", 18001, {3819546}),
    ("127.0.0.1", 18002, {3819547}),  # a v4-mapped bind takes IPv4 connections to that address
    ("10.0.0.7", 2024, {315}),  # 0.0.0.0
    ("::1", 2024, set()),  # an IPv4 wildcard takes no IPv6 connection
    ("127.0.0.1", 18003, set()),
])
def test_candidates_are_every_listener_a_connection_may_reach(address, port, inodes):
    assert {s["inode"] for s in listener.candidates(_sockets(), [IP(address)], port)} == inodes


def test_parse_stat_ppid_survives_a_command_name_with_spaces_and_parentheses():
    recorded = ("19416 (python3) R 19414 19414 8419 0 -1 4194304 3126 6563 0 0 5 0 4 0 20 0 1 0 2250361 "
                "18685952 3685 18446744073709551615")
    assert listener.parse_stat_ppid(recorded) == 19414
    assert listener.parse_stat_ppid(recorded.replace("(python3)", "(a) b (c)")) == 19414
    assert listener.parse_stat_ppid("") is None


def test_descendants_follow_children_and_grandchildren_only():
    parents = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert listener.descendants(10, parents) == {10, 11, 12}
    assert listener.descendants(99, parents) == {99}


def test_main_pid_of_systemctl_show():
    assert listener.main_pid_of({"MainPID": "4242"}) == 4242
    assert listener.main_pid_of({"MainPID": "0"}) is None and listener.main_pid_of({}) is None
    assert listener.main_pid_of({"MainPID": "-1"}) is None and listener.main_pid_of({"MainPID": "x"}) is None


def _proc(tmp_path, tree: dict[int, tuple[int, str, list[int]]]):
    """A /proc with the recorded net files and {pid: (ppid, comm, [socket inodes])}."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text((RECORDED / "net_tcp.txt").read_text())
    (proc / "net" / "tcp6").write_text((RECORDED / "net_tcp6.txt").read_text())
    for pid, (ppid, comm, inodes) in tree.items():
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")
        (proc / str(pid) / "comm").write_text(comm + "\n")
        os.symlink("/dev/null", proc / str(pid) / "fd" / "0")
        for n, inode in enumerate(inodes, start=3):
            os.symlink(f"socket:[{inode}]", proc / str(pid) / "fd" / str(n))
    return str(proc)


def test_the_units_child_holding_the_socket_is_ours(tmp_path):
    proc = _proc(tmp_path, {500: (1, "vllm", []), 501: (500, "VLLM::APIServer", [3819545])})
    out = listener.check_owner("http://127.0.0.1:18000", 500, proc)
    assert out["ours"] and out["listening"] and out["holders"] == []


def test_a_squatter_is_named_with_its_pid_name_and_user(tmp_path):
    proc = _proc(tmp_path, {500: (1, "vllm", []), 777: (1, "python3", [3819545])})
    out = listener.check_owner("http://127.0.0.1:18000", 500, proc)
    assert not out["ours"] and out["listening"]
    assert out["holders"] == [{"uid": 65534, "user": listener._user(65534), "address": "127.0.0.1", "port": 18000,
                               "processes": [{"pid": 777, "name": "python3"}]}]
    assert "pid 777 (python3)" in out["text"] and "uid 65534" in out["text"]


def test_one_foreign_listener_among_ours_is_a_squatter(tmp_path):
    """[::]:18001 is ours, but 0.0.0.0 is not in this /proc at that port; at 18000 both 127.0.0.1 (ours)
    and a name resolving to ::1 too (someone else's) are reached: not ours."""
    proc = _proc(tmp_path, {500: (1, "vllm", [3819545]), 600: (1, "nc", [3819548])})
    assert listener.check_owner("http://127.0.0.1:18000", 500, proc)["ours"]
    both = listener.judge(listener.candidates(listener.parse_net_tcp(open(f"{proc}/net/tcp").read())
                                              + listener.parse_net_tcp(open(f"{proc}/net/tcp6").read()),
                                              [IP("127.0.0.1"), IP("::1")], 18000), {3819545}, {})
    assert not both["ours"] and "its pid is not visible" in both["text"]


def test_no_main_pid_or_an_unreadable_holder_sends_no_key(tmp_path):
    proc = _proc(tmp_path, {500: (1, "vllm", [3819545])})
    out = listener.check_owner("http://127.0.0.1:18000", None, proc)
    assert not out["ours"] and "the unit has no main process" in out["text"] and "pid 500 (vllm)" in out["text"]
    hidden = _proc(tmp_path / "h", {500: (1, "vllm", [])})  # the holder's process is not visible (another user)
    out = listener.check_owner("http://[::]:18001", 500, hidden)
    assert not out["ours"] and "its pid is not visible to this check" in out["text"]


def test_nothing_listening_is_not_ours_and_names_nobody(tmp_path):
    proc = _proc(tmp_path, {500: (1, "vllm", [])})
    out = listener.check_owner("http://127.0.0.1:18009", 500, proc)
    assert out == {"ours": False, "listening": False, "holders": [], "text": "nothing listens there", "main_pid": 500}


def test_health_verdict_names_a_squatter_and_asks_nothing_with_the_key():
    from qwen27b.onhost import health
    owner = {"ours": False, "listening": True, "text": "pid 777 (python3) of user eve (uid 1001) listens on 127.0.0.1:8000"}
    r = {"url": "http://127.0.0.1:8000", "unit": "qwen27b.service", "listener": owner,
         "health": {"status": 200, "latency_ms": 1.0, "error": None},
         "models": {"status": None, "ids": None, "error": None, "skipped": owner["text"]}}
    code, findings = health.verdict(r)
    assert code == health.CRITICAL and len(findings) == 1
    assert "pid 777 (python3)" in findings[0]["text"] and "the API key was not sent" in findings[0]["text"]
    gone = {**r, "listener": {"ours": False, "listening": False, "text": "nothing listens there"},
            "models": {**r["models"], "skipped": "nothing listens there"}}
    code, findings = health.verdict(gone)
    assert code == health.CRITICAL and "/v1/models not asked (nothing listens there)" in findings[0]["text"]
