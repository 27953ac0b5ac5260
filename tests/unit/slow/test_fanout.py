"""Weights fan-out: the wave planner (pure), its host data key, and the planned commands of a
four-host @fake run (`pyinfra ... deploy.py --dry` against a loopback mirror)."""

import os
import random
import re
import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen27b.controller.artifacts import dir_manifest
from qwen27b.onhost.contract import module_argv, module_command
from qwen27b.plan.fanout import (MIRROR, SEED_PORT, Member, fetch_command, ideal_waves, plan_waves, seed_max_s, seed_peers,
                            seed_start_commands)
from qwen27b.plan.hostdata import BadHostData, settings_for
from qwen27b.onhost.mirror import serve
from fuzz_budget import examples
from tests.support.paths import ROOT



def _hosts(n: int, holders=()) -> list[Member]:
    return [Member(f"h{i:02d}", f"10.0.0.{i}", f"h{i:02d}" in holders) for i in range(1, n + 1)]


def _check_invariants(members: list[Member], plan) -> None:
    """Every host without a copy gets exactly one; a seed holds a verified copy before the wave it
    serves in, serves at most one host per wave and only hosts with an address (it admits only
    those); at most one copy crosses the WAN besides the address-less hosts' own, unless no host
    could seed."""
    holds = {m.name: -1 for m in members if m.has_copy}
    by_name = {m.name: m for m in members}
    assert sorted(c.host for c in plan.copies) == sorted(m.name for m in members if not m.has_copy)
    served = set()
    for c in sorted(plan.copies, key=lambda c: c.wave):
        if not c.from_mirror:
            assert holds.get(c.source, 99) < c.wave, c
            assert by_name[c.source].address == c.source_address is not None
            assert (c.source, c.wave) not in served, f"{c.source} seeds twice in wave {c.wave}"
            assert by_name[c.host].address, f"{c.host} has no address a seed could admit"
            served.add((c.source, c.wave))
        holds[c.host] = c.wave
    addressless = sum(1 for m in members if not m.has_copy and not m.address)
    addressed_need = any(m.address and not m.has_copy for m in members)
    if any(m.address for m in members):
        assert plan.mirror_copies == addressless + (
            0 if any(m.has_copy and m.address for m in members) or not addressed_need else 1)


@pytest.mark.parametrize("n, waves", [(1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (8, 4), (9, 5), (64, 7)])
def test_holders_double_each_wave(n, waves):
    plan = plan_waves(_hosts(n))
    assert plan.waves == waves == ideal_waves(n) and plan.mirror_copies == 1
    assert [c.host for c in plan.copies if c.wave == 0] == ["h01"]
    holders = 1
    for wave in range(1, waves):
        new = [c for c in plan.copies if c.wave == wave]
        assert len(new) == min(holders, n - holders)  # every holder seeds one host
        holders += len(new)
    _check_invariants(_hosts(n), plan)


def test_four_hosts_one_two_four():
    plan = plan_waves(_hosts(4))
    assert [(c.wave, c.host, c.source) for c in plan.copies] == [
        (0, "h01", MIRROR), (1, "h02", "h01"), (2, "h03", "h01"), (2, "h04", "h02")]
    text = "\n".join(plan.lines())
    assert "wave 0: h01 <- the mirror: no host holds a verified copy: the one transfer over the WAN" in text
    assert f"wave 2: h04 <- h02 (10.0.0.2:{SEED_PORT}): h02 verified in wave 1; falls back to the mirror" in text
    assert "4 host(s), 3 wave(s), 1 copy(ies) over the WAN" in text
    assert plan.seed_start_wave("h01") == 0 and plan.seed_start_wave("h02") == 1
    assert plan.seed_start_wave("h03") is None and plan.seed_start_wave("h04") is None


def test_same_plan_whatever_the_inventory_order():
    members = _hosts(7, holders={"h05"})
    shuffled = members[:]
    random.Random(4).shuffle(shuffled)
    assert plan_waves(shuffled).copies == plan_waves(members).copies


def test_a_holder_seeds_and_nothing_crosses_the_wan():
    plan = plan_waves(_hosts(4, holders={"h03"}))
    assert plan.mirror_copies == 0 and plan.copy_for("h03") is None
    assert [(c.wave, c.host, c.source) for c in plan.copies] == [(1, "h01", "h03"), (2, "h02", "h03"), (2, "h04", "h01")]
    assert "held a verified copy before this deploy" in plan.copies[0].reason
    assert plan.seed_start_wave("h03") == 0  # serving before wave 1 begins


def test_everything_held_plans_nothing():
    plan = plan_waves(_hosts(3, holders={"h01", "h02", "h03"}))
    assert plan.copies == () and plan.waves == 0
    assert "h02: holds a verified copy, nothing to do" in "\n".join(plan.lines())


def test_hosts_without_an_address_fetch_from_the_mirror_and_never_seed():
    """A seed admits only its planned peers' addresses: a host without one cannot be let in."""
    members = [Member("a", None), Member("b", "10.0.0.2"), Member("c", None), Member("d", "10.0.0.4")]
    plan = plan_waves(members)
    assert plan.copy_for("b").from_mirror  # the WAN copy goes to a host that can pass it on
    assert all(c.source not in ("a", "c") for c in plan.copies)
    assert plan.copy_for("a").from_mirror and plan.copy_for("c").from_mirror and plan.copy_for("d").source == "b"
    assert "no lab address" in plan.copy_for("a").reason
    _check_invariants(members, plan)
    nobody = plan_waves([Member("a"), Member("b")])
    assert [c.source for c in nobody.copies] == [MIRROR, MIRROR] and nobody.mirror_copies == 2


def test_a_host_listed_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        plan_waves([Member("a", "1"), Member("a", "2")])


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
@settings(max_examples=examples(200), deadline=None)
def test_plan_invariants(spec):
    members = [Member(f"h{i:02d}", f"10.1.0.{i}" if addressed else None, held) for i, (addressed, held) in enumerate(spec)]
    _check_invariants(members, plan_waves(members))


VENV = "/opt/qwen27b/releases/1/venv"


def _fetch_tool(out: str) -> str:
    """The fetch command the plan names: qwen27b_onhost.fetch from the host's release venv."""
    venv = re.search(r"(/opt/qwen27b/releases/[0-9a-f]+/venv)/bin/python -m qwen27b_onhost\.fetch", out).group(1)
    return module_command(venv, "fetch")


def test_commands():
    plan = plan_waves(_hosts(2))
    fetch = f"{module_command(VENV, 'fetch')} --dest D --manifest M"
    mirror = "http://mirror.lab/x@1"
    assert fetch_command(fetch, plan.copies[0], mirror, "x@1", proxy_env="http_proxy=http://p:3128 ") == (
        f"http_proxy=http://p:3128 {fetch} --base {mirror}")
    peer = fetch_command(fetch, plan.copies[1], mirror, "x@1", proxy_env="http_proxy=http://p:3128 ")
    assert peer.startswith(f"no_proxy='*' NO_PROXY='*' {fetch} --base http://10.0.0.1:{SEED_PORT}/x@1 || {{ ")
    assert peer.endswith(f"http_proxy=http://p:3128 {fetch} --base {mirror}; }}")
    revision = "/var/lib/qwen27b/models/x@1"
    start = seed_start_commands(module_argv(VENV, "mirror"), revision, "10.0.0.1", seed_peers(plan, "h01"),
                                "/etc/qwen27b/seed.token", "qwen27b", seed_max_s(plan, "h01", 10**9),
                                "/var/lib/qwen27b", pythonpath=f"{VENV}/lib")
    argv = shlex.split(start[1])
    props = [a.split("=", 1)[1] for a in argv if a.startswith("--property=")]
    for prop in ("User=qwen27b", "Group=qwen27b", "CapabilityBoundingSet=", "NoNewPrivileges=yes",
                 "TemporaryFileSystem=/var/lib/qwen27b:ro", f"BindReadOnlyPaths={revision}",
                 "IPAddressDeny=any", "IPAddressAllow=10.0.0.1 10.0.0.2", f"RuntimeMaxSec={1 * (120 + 40)}",
                 f"Environment=PYTHONPATH={VENV}/lib"):
        assert prop in props, prop
    assert not any("CAP_" in p for p in props)
    assert argv[argv.index(f"{VENV}/bin/python"):] == [f"{VENV}/bin/python", "-m", "qwen27b_onhost.mirror", revision, "--host", "10.0.0.1",
                                            "--port", "8801", "--token-file", "/etc/qwen27b/seed.token",
                                            "--allow", "10.0.0.2"]
    assert "--token-file /etc/qwen27b/seed.token" in fetch_command(fetch, plan.copies[1], mirror, "x@1",
                                                                   token_file="/etc/qwen27b/seed.token").split("||")[0]
    assert subprocess.run(start[2].replace("range(150)", "range(2)").replace("10.0.0.1", "127.0.0.1")
                          .replace("8801", "9"), shell=True, capture_output=True, text=True).returncode == 1


def test_host_data_key():
    assert settings_for("h", {}).weights_fanout == "none"
    assert settings_for("h", {"qwen27b_weights_fanout": "tree", "qwen27b_model_source": "mirror",
                              "qwen27b_model_mirror": "http://m:8800"}).weights_fanout == "tree"
    with pytest.raises(BadHostData, match=r"qwen27b_weights_fanout: 'tre' is not a fan-out mode.*did you mean 'tree'"):
        settings_for("h", {"qwen27b_weights_fanout": "tre"})
    with pytest.raises(BadHostData, match="did you mean 'qwen27b_weights_fanout'"):
        settings_for("h", {"qwen27b_weights_fanot": "tree"})
    with pytest.raises(BadHostData, match="'tree' fans out a mirror download, but model_source is 'hub'"):
        settings_for("h", {"qwen27b_weights_fanout": "tree", "qwen27b_model_source": "hub"})


# ---------------------------------------------------------------- the planned commands (@fake hosts)

# the sm70 default (issue 49), with its DFlash2 draft, at revisions of their own: the files here are
# made up, and the stack's pinned sha256 hold for the pinned revisions only (qwen27b/plan/filepins.py)
REVISION = "fanout-test"
MODEL = f"QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@{REVISION}"
DRAFT = f"incoai--Qwen3.8-27B-DFlash2@{REVISION}"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("fanout-mirror")
    for name in (MODEL, DRAFT):
        d = root / name
        d.mkdir()
        for i in (1, 2):
            (d / f"model-0000{i}-of-00002.safetensors").write_bytes(f"{name}-{i}".encode() * 1000)
        (d / "config.json").write_text("{}")
        dir_manifest(d)
    server, _ = serve(str(root))
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def dry_run(tmp_path, mirror_url: str, fanout: str, holder_lines: list[str] | None = None,
            refused: int | None = None, flags: tuple = ()) -> str:
    """pyinfra --dry on 4 recorded fresh V100 hosts from one mirror; host `refused` is a CentOS 7
    recording instead (the gate refuses it, so the run exits 1)."""
    inventory = tmp_path / f"fan-{fanout}.py"
    inventory.write_text(
        "import re\n"
        "from inventory.recorded import _fake\n"
        "hosts = []\n"
        "for n in (1, 2, 3, 4):\n"
        f"    recording = 'centos7' if n == {refused!r} else 'v100x4-2204-fresh'\n"
        f"    name, data = _fake(recording, ssh_hostname=f'10.9.0.{{n}}', qwen27b_model_source='mirror',\n"
        f"                       qwen27b_stack_overrides={{'model_revision': {REVISION!r}, 'draft_revision': {REVISION!r}}},\n"
        f"                       qwen27b_model_mirror={mirror_url!r}, qwen27b_weights_fanout={fanout!r})\n"
        f"    if n == 3 and {holder_lines!r}:\n"
        f"        data['fake_responses'] = {{re.compile(r' /var/lib/qwen27b/models/QUASAR-QAT--Qwen3\\.8-27B-QUASAR-NVFP4@{REVISION} \\.qwen27b-hashes\\.json$'):\n"
        f"                                  {holder_lines!r}, **data['fake_responses']}}\n"
        "    hosts.append((f'@fake/fan-{n}', data))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), QWEN27B_REPORTS=str(tmp_path / "reports"))
    result = subprocess.run([sys.executable, "-m", "pyinfra", str(inventory), "deploy.py", "--dry", "-y", "-v", *flags], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == (0 if refused is None else 1) and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr


def _ops(out: str, host: str, what: str) -> list[str]:
    """The operation lines (name and commands) of one host's plan that mention `what`."""
    plan = re.search(rf"^== @fake/{host}: \d+ operation.*?(?=^\s*$|\Z)", out, re.M | re.S).group(0)
    lines, keep = [], False
    for line in plan.splitlines()[1:]:
        if not line.startswith("            $"):
            keep = what in line
        if keep:
            lines.append(line.strip())
    return lines


def test_fake_four_hosts_plan_waves_and_commands(tmp_path, mirror):
    root, url = mirror
    out = dry_run(tmp_path, url, "tree", flags=("--diff",))
    assert out.count(f"== weights fan-out of {MODEL} (qwen27b_weights_fanout: tree)\n") == 1  # planned once a run
    block = out.split(f"== weights fan-out of {MODEL} (qwen27b_weights_fanout: tree)\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines() == [
        "   wave 0: @fake/fan-1 <- the mirror: no host holds a verified copy: the one transfer over the WAN",
        "   wave 1: @fake/fan-2 <- @fake/fan-1 (10.9.0.1:8801): @fake/fan-1 verified in wave 0; falls back to the mirror if the seed fails",
        "   wave 2: @fake/fan-3 <- @fake/fan-1 (10.9.0.1:8801): @fake/fan-1 verified in wave 0; falls back to the mirror if the seed fails",
        "   wave 2: @fake/fan-4 <- @fake/fan-2 (10.9.0.2:8801): @fake/fan-2 verified in wave 1; falls back to the mirror if the seed fails",
        "   4 host(s), 3 wave(s), 1 copy(ies) over the WAN (ideal for 4: 3 wave(s), 1 WAN copy)"]
    fetch = (f"{_fetch_tool(out)} --dest /var/lib/qwen27b/models/{MODEL} "
             f"--manifest /opt/qwen27b/cache/{MODEL}.manifest.json")
    first = _ops(out, "fan-1", f"fan-out wave 0 of {MODEL}")
    assert first[0] == f"CHANGE  weights fan-out wave 0 of {MODEL}"
    assert first[1] == f"$ {fetch} --base {url}/{MODEL}"  # the one WAN copy
    assert first[3].startswith("$ systemd-run --unit=qwen27b-seed.service") and "--host 10.9.0.1 --port 8801" in first[3]
    assert _ops(out, "fan-1", f"fan-out wave 1 of {MODEL}") == [f"ok      weights fan-out wave 1 of {MODEL}"]
    assert _ops(out, "fan-1", f"fan-out of {MODEL}: stop") == [
        f"CHANGE  weights fan-out of {MODEL}: stop the seed server",
        "$ systemctl stop qwen27b-seed.service 2>/dev/null || true; systemctl reset-failed qwen27b-seed.service "
        "2>/dev/null || true; rm -f /etc/qwen27b/seed.token"]
    fourth = _ops(out, "fan-4", f"fan-out wave 2 of {MODEL}")
    assert fourth == [f"CHANGE  weights fan-out wave 2 of {MODEL}",
                      f"$ no_proxy='*' NO_PROXY='*' {fetch} --base http://10.9.0.2:8801/{MODEL} "
                      f"--token-file /etc/qwen27b/seed.token || "
                      f"{{ echo 'qwen27b: seed @fake/fan-2 failed; the mirror completes the copy' >&2; "
                      f"{fetch} --base {url}/{MODEL}; }}"]
    assert not _ops(out, "fan-4", "stop the seed server") and not _ops(out, "fan-4", "qwen27b-seed (serves")
    assert _ops(out, "fan-4", f"fan-out of {MODEL}: remove") == [
        f"CHANGE  weights fan-out of {MODEL}: remove the run's token", "$ rm -f /etc/qwen27b/seed.token"]
    # the seed: the service user, no capability, its one revision; the token only ever in a 0600 file
    seed = shlex.split(first[3][2:])
    assert "--property=User=qwen27b" in seed and "--property=CapabilityBoundingSet=" in seed
    assert f"--property=BindReadOnlyPaths=/var/lib/qwen27b/models/{MODEL}" in seed
    assert "--property=IPAddressAllow=10.9.0.1 10.9.0.2 10.9.0.3" in seed
    assert seed[seed.index("--allow"):] == ["--allow", "10.9.0.2", "--allow", "10.9.0.3"]
    assert "CAP_DAC_READ_SEARCH" not in out and "RuntimeMaxSec=3600" not in out
    for n in (1, 2, 3, 4):
        token = _ops(out, f"fan-{n}", "fan-out token")  # the model and its DFlash2 draft: the content on stdin, not the line
        assert [line for line in token if not line.startswith("$")] == ["CHANGE  fan-out token (0600, this run only)"] * 2
        assert all("cat > /etc/qwen27b/.seed.token.part && chown qwen27b:qwen27b" in line
                   for line in token if line.startswith("$"))
    # no per-run token (secrets.token_urlsafe(32): 43 URL-safe characters) anywhere, even with --diff
    assert not [t for t in re.findall(r"(?<![\w-])[\w-]{43}(?![\w-])", out) if set(t) != {"-"}]  # a table rule is no token
    # pyinfra runs an operation on all its hosts before the next: the waves in order, then the stop
    fan1 = [line.split(None, 1)[1] for line in _ops(out, "fan-1", f"of {MODEL}") if not line.startswith("$")]
    assert fan1 == [f"weights fan-out wave {k} of {MODEL}" for k in range(3)] + [f"weights fan-out of {MODEL}: stop the seed server"]


def test_fake_a_host_the_gate_refuses_gets_no_place_in_the_fan_out(tmp_path, mirror):
    """Host 2 is refused (CentOS 7) before its own turn comes: the plan, made while host 1 is
    planned, asks the gate about every host first, so nobody waits on a seed that never starts."""
    root, url = mirror
    out = dry_run(tmp_path, url, "tree", refused=2)
    assert out.count("== @fake/fan-2: REFUSED") == 1  # the gate's answer is kept: asked early, printed once
    block = out.split(f"== weights fan-out of {MODEL} (qwen27b_weights_fanout: tree)\n", 1)[1].split("\n\n", 1)[0]
    assert "fan-2" not in block and "3 host(s), 3 wave(s), 1 copy(ies) over the WAN" in block, block
    assert "wave 1: @fake/fan-3 <- @fake/fan-1" in block


def test_fake_holder_seeds_without_the_mirror(tmp_path, mirror):
    root, url = mirror
    import json
    files = json.loads((root / MODEL / "manifest.json").read_text())["files"]
    out = dry_run(tmp_path, url, "tree", [f"{meta['sha256']}  ./{name}" for name, meta in files.items()])
    block = out.split(f"== weights fan-out of {MODEL} (qwen27b_weights_fanout: tree)\n", 1)[1].split("\n\n", 1)[0]
    assert "0 copy(ies) over the WAN" in block and "wave 1: @fake/fan-1 <- @fake/fan-3" in block
    third = _ops(out, "fan-3", f"fan-out wave 0 of {MODEL}")
    assert third[0] == f"CHANGE  weights fan-out wave 0 of {MODEL}" and "--host 10.9.0.3" in third[2]
    assert not any(f"--dest /var/lib/qwen27b/models/{MODEL}" in line for line in _ops(out, "fan-3", ""))
    assert f"--dest /var/lib/qwen27b/models/{MODEL}" in "\n".join(_ops(out, "fan-1", ""))


def test_fake_default_is_one_mirror_fetch_per_host(tmp_path, mirror):
    root, url = mirror
    out = dry_run(tmp_path, url, "none")
    assert "weights fan-out" not in out
    for n in (1, 2, 3, 4):
        assert (
            f"$ {_fetch_tool(out)} --base {url}/{MODEL} --dest /var/lib/qwen27b/models/{MODEL} "
            f"--manifest /opt/qwen27b/cache/{MODEL}.manifest.json") in _ops(out, f"fan-{n}", "fetch the checkpoint from the mirror")


# ---------------------------------------------------------------- the fallback, for real (loopback)

def _half_server(payload: bytes):
    """A seed that dies mid-file: announces the whole file, sends half, closes the connection."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def run():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload[: len(payload) // 2])
            conn.close()

    threading.Thread(target=run, daemon=True).start()
    return listener


@pytest.mark.parametrize("seed", ["down", "dies mid-file"])
def test_a_failed_seed_falls_back_to_the_mirror_and_resumes(tmp_path, seed):
    import json
    import socket

    name = "x--ckpt@1"
    src = tmp_path / "mirror" / name
    src.mkdir(parents=True)
    payload = os.urandom(3 << 20)
    (src / "model-00001-of-00001.safetensors").write_bytes(payload)
    (src / "config.json").write_text("{}")
    dir_manifest(src)
    listing = tmp_path / "listing.json"
    listing.write_text(json.dumps({"files": json.loads((src / "manifest.json").read_text())["files"]}))
    server, _ = serve(str(tmp_path / "mirror"))
    if seed == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens there once closed
        peer = None
    else:
        peer = _half_server(payload)
        port = peer.getsockname()[1]
    try:
        plan = plan_waves([Member("a", "127.0.0.1", True), Member("b", "127.0.0.2")])
        dest = tmp_path / "dest"
        fetch = f"{sys.executable} {ROOT / 'qwen27b' / 'onhost' / 'fetch.py'} --dest {dest} --manifest {listing}"
        command = fetch_command(fetch, plan.copy_for("b"), f"http://127.0.0.1:{server.server_address[1]}/{name}",
                                name, port=port)
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "qwen27b: seed a failed; the mirror completes the copy" in result.stderr
        assert (dest / "model-00001-of-00001.safetensors").read_bytes() == payload
        asked = [r for p, r in server.handler.requests if p.endswith(".safetensors")]
        # a seed that died mid-file left a part file: the mirror sends only the rest
        assert asked == ([None] if seed == "down" else [f"bytes={len(payload) // 2}-"])
    finally:
        server.shutdown()
        if peer is not None:
            peer.close()


@pytest.mark.skipif(subprocess.run(["sh", "-c", "systemd-analyze --help | grep -q -- --offline"]).returncode != 0,
                    reason="systemd-analyze security --offline needs systemd >= 250")
def test_the_seed_unit_verifies_and_scores_like_the_service(tmp_path):
    """The transient unit's properties as a unit file: systemd-analyze accepts every one, and its
    exposure stays within the main unit's goal (2.5; the root seed with CAP_DAC_READ_SEARCH was 6.1)."""
    plan = plan_waves(_hosts(2))
    argv = shlex.split(seed_start_commands(["python3", "/usr/bin/true"], "/var/lib/qwen27b/models/x@1", "10.0.0.1",
                                           seed_peers(plan, "h01"), "/etc/qwen27b/seed.token", "qwen27b", 160,
                                           "/var/lib/qwen27b")[1])
    props = [a.split("=", 1)[1] for a in argv if a.startswith("--property=")]
    unit = tmp_path / "qwen27b-seed.service"
    unit.write_text("[Service]\n" + "\n".join(props) + "\nExecStart=/usr/bin/python3 "
                    + shlex.join(argv[argv.index("python3") + 1:]) + "\n")
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "notice"}
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, env=env)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
                              capture_output=True, text=True, env=env)
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout).group(1))
    assert score <= 2.5, security.stdout


def test_fake_added_host_is_seeded_by_a_holder_outside_the_limit(tmp_path, mirror):
    """`--limit @fake/fan-1` (adding a host): fan-3, outside the run, holds the verified revision.
    pyinfra keeps it in the inventory but runs nothing there, so the plan takes it as a seed whose
    server the run starts and stops from the controller (the commands: outside_seed_commands,
    the same as an in-run seed's but from its running release), and fan-1's fetch goes to it,
    not over the WAN. fan-2 and fan-4, outside too, hold nothing and play no part."""
    root, url = mirror
    import json
    from qwen27b.plan.fanout import Member, plan_waves
    from qwen27b.plan.stack import load_stack
    from qwen27b.controller.weightsfanout import outside_seed_commands

    files = json.loads((root / MODEL / "manifest.json").read_text())["files"]
    out = dry_run(tmp_path, url, "tree", [f"{meta['sha256']}  ./{name}" for name, meta in files.items()],
                  flags=("--limit", "@fake/fan-1"))
    block = out.split(f"== weights fan-out of {MODEL} (qwen27b_weights_fanout: tree)\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines() == [
        "   wave 1: @fake/fan-1 <- @fake/fan-3 (10.9.0.3:8801): @fake/fan-3 held a verified copy before this deploy; falls "
        "back to the mirror if the seed fails (outside --limit: its seed server is started from the controller)",
        "   1 host(s) (+1 seed(s) outside --limit), 2 wave(s), 0 copy(ies) over the WAN (ideal for 1: 1 wave(s), 1 WAN copy)"]
    names = [line.split(None, 1)[1] for line in _ops(out, "fan-1", f"of {MODEL}") if not line.startswith("$")]
    assert names == [f"weights fan-out of {MODEL}: start the seed server on @fake/fan-3 (outside --limit)",
                     f"weights fan-out wave 0 of {MODEL}", f"weights fan-out wave 1 of {MODEL}",
                     f"weights fan-out of {MODEL}: stop the seed server on @fake/fan-3 (outside --limit)",
                     f"weights fan-out of {MODEL}: remove the run's token"]
    fetch = _ops(out, "fan-1", f"fan-out wave 1 of {MODEL}")[1]
    assert fetch.startswith("$ no_proxy='*' NO_PROXY='*' ") and f"--base http://10.9.0.3:8801/{MODEL} --token-file" in fetch
    assert "@fake/fan-2" not in block and "@fake/fan-4" not in block and "[@fake/fan-3] Success" not in out
    # what the controller runs on fan-3: the seed from its current release, admitting fan-1 only
    plan = plan_waves([Member("@fake/fan-1", "10.9.0.1"), Member("@fake/fan-3", "10.9.0.3", True, in_run=False)])
    paths = load_stack()["paths"]
    commands = outside_seed_commands(plan, plan.members[1], f"/var/lib/qwen27b/models/{MODEL}", paths, 2 ** 30)
    seed = shlex.split(commands[1])
    assert seed[seed.index("/opt/qwen27b/current/venv/bin/python"):][:3] == [
        "/opt/qwen27b/current/venv/bin/python", "-m", "qwen27b_onhost.mirror"]
    assert "--property=Environment=PYTHONPATH=/opt/qwen27b/current/venv/lib" in seed
    assert seed[seed.index("--allow"):] == ["--allow", "10.9.0.1"] and "--property=IPAddressAllow=10.9.0.3 10.9.0.1" in seed
    assert "--token-file" in seed and seed[seed.index("--token-file") + 1] == "/etc/qwen27b/seed.token"


def test_hosts_outside_the_run_only_seed():
    """A holder outside --limit seeds like one in the run (from wave 1), is never a receiver, and
    one outside the run without a copy is no member at all."""
    plan = plan_waves([Member("new-1", "10.0.0.1"), Member("new-2", "10.0.0.2"),
                       Member("old-1", "10.0.0.9", True, in_run=False)])
    assert [(c.host, c.wave, c.source) for c in plan.copies] == [("new-1", 1, "old-1"), ("new-2", 2, "old-1")]
    assert plan.mirror_copies == 0 and [m.name for m in plan.outside_seeds()] == ["old-1"]
    with pytest.raises(ValueError, match="outside the run is a member only as a seed"):
        plan_waves([Member("new-1", "10.0.0.1"), Member("old-1", "10.0.0.9", False, in_run=False)])
