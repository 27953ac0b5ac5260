#!/usr/bin/env python3
"""Weights fan-out benchmark on real test hosts: the WAN bytes and the wall time of placing a
multi-GB checkpoint on N hosts, each transfer side by side with plain rsync on the same link.

    sudo .venv/bin/python benchmarks/fanout.py                     # 4 hosts, 2 GiB, WAN 50 MB/s
    sudo .venv/bin/python benchmarks/fanout.py --hosts 3 --size-gib 1 --wan-mbs 25 --keep

What it does (root; tests.support.testhosts):
1. boots N nspawn hosts (profile `fanout-bench`) and links them as on a lab LAN
   (NspawnHosts.link_peers: routes between their namespaces, forwarding on their veths only);
   installs rsync on them (apt through the test hosts' proxy) and on this machine;
2. generates a checkpoint-like dir once (random `model-0000i-of-0000K.safetensors` + config.json,
   manifest.json from qwen27b.controller.artifacts.dir_manifest) under $QWEN27B_CACHE/fanout-bench/;
3. serves it from a loopback mirror (qwen27b.onhost.mirror.serve: Range requests, request log) behind an
   emulated WAN: a TCP relay on loopback whose download direction shares one token bucket of
   --wan-mbs MB/s among all connections (one site uplink), counting the bytes that cross it. The
   hosts reach it through their proxy bridge, as in the e2e tests;
4. runs the real weights role (benchmarks/fanout_deploy.py: preflight + weights, with
   pyinfra) in three cases: one host alone; N hosts each from the mirror
   (`qwen27b_weights_fanout: none`); N hosts with `tree` fan-out. Each case starts from hosts
   without the checkpoint; afterwards every host's copy is checked with sha256sum -c;
5. after each case, the same transfers again with plain `rsync -a` of the same files over the same
   link with the same concurrency: mirror legs through the same WAN relay and proxy to an rsync
   daemon next to the mirror; peer legs from an rsync daemon on the seeding host;
6. the resume case: one host fetching from the mirror is rebooted in the middle of its third
   shard; the deploy is run again; the mirror's request log shows which files were asked for.

Timing: a fan-out copy is timed from its operation's start to the host's "Success" in pyinfra's
output (so it includes the sha256 check of every file and, on a seeding host, starting the seed
server); an rsync copy is timed on the host around the rsync command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qwen27b.controller.artifacts import cache_root, dir_manifest  # noqa: E402
from qwen27b.onhost.mirror import serve  # noqa: E402
from tests.support.testhosts import NspawnHosts, TestHostsError  # noqa: E402

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the cpu-smoke profile's checkpoint id ...
REVISION = "fanout-bench"  # ... at a revision of our own: the generated files
SAFE = "HuggingFaceTB--SmolLM2-135M-Instruct@" + REVISION
TARGET = f"/var/lib/qwen27b/models/{SAFE}"
SCRATCH = "/var/tmp/q27-rsync-baseline"
PEER_RSYNC_PORT = 8873
PEER_RSYNC_CONF = "/run/q27-bench-rsyncd.conf"
PEER_RSYNC_PID = "/run/q27-bench-rsyncd.pid"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MB = 1e6


def log(msg: str) -> None:
    print(f"[fanout-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the emulated WAN

class WanLink:
    """TCP relays on loopback sharing one token bucket for the download direction: the uplink of
    the mirror's site. `down` counts the bytes that crossed it, per listener."""

    def __init__(self, rate: float | None):
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()
        self.down: dict[str, int] = {}
        self._sockets: list[socket.socket] = []
        self._open = True

    def _pace(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            start = max(self._next, now - 0.02)  # no credit saved up while idle
            self._next = start + n / self.rate
            until = self._next
        delay = until - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def listen(self, name: str, target_port: int) -> int:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        self._sockets.append(server)
        self.down[name] = 0
        threading.Thread(target=self._accept, args=(name, server, target_port), daemon=True).start()
        return server.getsockname()[1]

    def _accept(self, name: str, server: socket.socket, target_port: int) -> None:
        while self._open:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", target_port))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, name), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counted: str | None) -> None:
        try:
            while True:
                block = src.recv(1 << 16)
                if not block:
                    break
                if counted:
                    self._pace(len(block))
                    self.down[counted] += len(block)
                dst.sendall(block)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RD)

    def close(self) -> None:
        self._open = False
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


# ---------------------------------------------------------------- the checkpoint

def make_checkpoint(base: Path, size_gib: float, files: int) -> tuple[Path, dict]:
    """A checkpoint-like dir of random shards (cached by size and count): mirror_root/SAFE/."""
    mirror_root = base / f"{size_gib:g}gib-{files}files"
    directory = mirror_root / SAFE
    done = directory / ".complete"
    if not done.exists():
        shutil.rmtree(mirror_root, ignore_errors=True)
        directory.mkdir(parents=True)
        shard = int(size_gib * 2**30) // files
        log(f"generating {files} x {shard / 2**20:.0f} MiB of random shards in {directory}")
        for i in range(1, files + 1):
            with open(directory / f"model-{i:05d}-of-{files:05d}.safetensors", "wb") as out:
                left = shard
                while left:
                    n = min(left, 8 << 20)
                    out.write(os.urandom(n))
                    left -= n
        (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                           "note": "fanout benchmark: random shards"}) + "\n")
        dir_manifest(directory)
        done.write_text("")
    dir_manifest(directory)
    files_meta = json.loads((directory / "manifest.json").read_text())["files"]
    return mirror_root, files_meta


# ---------------------------------------------------------------- helpers on the hosts

class Bench:
    def __init__(self, args):
        self.args = args
        self.lab = NspawnHosts(args.profile)
        self.work = Path(args.work).absolute()  # scratch: inventories, rsyncd.conf, deploy reports
        self.out = Path(args.out).absolute()  # what is kept: tables.txt, results.json, the deploy logs
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.results: dict = {"cases": [], "copies": [], "resume": None}

    # -- setup
    def up(self) -> None:
        t0 = time.monotonic()
        self.lab.up(self.args.hosts)
        self.lab.link_peers()
        self.hosts = [(h["name"], h["address"]) for h in self.lab.hosts][: self.args.hosts]
        log(f"{len(self.hosts)} hosts up and linked in {time.monotonic() - t0:.1f} s: "
            + ", ".join(f"{n} {a}" for n, a in self.hosts))
        if shutil.which("rsync") is None:
            log("installing rsync on this machine (apt-get)")
            subprocess.run(["apt-get", "install", "-y", "-q", "rsync"], check=True, capture_output=True,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        need = [n for n, _ in self.hosts if self.ssh(n, "command -v rsync", check=False).returncode]
        if need:
            log(f"installing rsync on {', '.join(need)} (apt through the test hosts' proxy)")
            self.parallel({n: "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive "
                              "apt-get install -y -q --no-install-recommends rsync >/dev/null" for n in need}, timeout=600)

    def ssh(self, name: str, command: str, check: bool = True, timeout: float = 900):
        return self.lab.ssh(name, command, check=check, timeout=timeout)

    def parallel(self, commands: dict[str, str], timeout: float = 900) -> dict[str, subprocess.CompletedProcess]:
        out: dict[str, subprocess.CompletedProcess] = {}
        threads = [threading.Thread(target=lambda n=n, c=c: out.__setitem__(n, self.ssh(n, c, timeout=timeout)))
                   for n, c in commands.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        missing = set(commands) - set(out)
        if missing:
            raise RuntimeError(f"command failed on {sorted(missing)} (see the error above)")
        return out

    def reset_hosts(self, names: list[str]) -> None:
        """Hosts without the checkpoint (and without qwen27b's dirs) for the next case."""
        self.parallel({n: "systemctl stop qwen27b-seed.service 2>/dev/null || true; "
                          f"rm -rf /var/lib/qwen27b /opt/qwen27b /run/qwen27b {SCRATCH}" for n in names})

    # -- the mirror side
    def start_mirror(self) -> None:
        self.mirror_root, self.manifest = make_checkpoint(cache_root() / "fanout-bench", self.args.size_gib,
                                                          self.args.files)
        self.model_bytes = sum(m["size"] for m in self.manifest.values())
        self.mirror, _ = serve(str(self.mirror_root))
        self.mirror.handle_error = lambda request, address: None  # a host rebooted mid-file: no traceback
        conf = self.work / "rsyncd.conf"
        conf.write_text(f"pid file = {self.work / 'rsyncd.pid'}\nuse chroot = no\nuid = root\ngid = root\n"
                        f"[ckpt]\n    path = {self.mirror_root}\n    read only = yes\n")
        rsync_port = _free_port()
        self.rsyncd = subprocess.Popen(["rsync", "--daemon", "--no-detach", "--address", "127.0.0.1",
                                        "--port", str(rsync_port), "--config", str(conf)],
                                       stdout=subprocess.DEVNULL, stderr=open(self.work / "rsyncd.log", "wb"))
        self.procs.append(self.rsyncd)
        rate = self.args.wan_mbs * MB if self.args.wan_mbs else None
        self.wan = WanLink(rate)
        self.wan_http = self.wan.listen("http", self.mirror.server_address[1])
        self.wan_rsync = self.wan.listen("rsync", rsync_port)
        _wait_port(rsync_port)
        log(f"mirror {self.model_bytes / 2**30:.2f} GiB in {len(self.manifest)} files; WAN relay "
            f"{'%g MB/s shared' % self.args.wan_mbs if rate else 'unthrottled'}: http 127.0.0.1:{self.wan_http}, "
            f"rsync 127.0.0.1:{self.wan_rsync}")

    # -- the deploy
    def inventory(self, names: list[str], mode: str) -> Path:
        data = {"qwen27b_profile": "cpu-smoke", "qwen27b_model_source": "mirror",
                "qwen27b_model_mirror": f"http://127.0.0.1:{self.wan_http}",
                "qwen27b_http_proxy": "http://127.0.0.1:3128",
                "qwen27b_stack_overrides": {"model_revision": REVISION}, "qwen27b_weights_fanout": mode}
        path = self.work / f"inventory-{mode}-{len(names)}.py"
        path.write_text(
            "import runpy\n"
            f"_hosts = runpy.run_path({str(self.lab.inventory)!r})['testhosts']\n"
            f"NAMES = {names!r}\nDATA = {data!r}\n"
            "fanbench = [(n, {**{k: v for k, v in d.items() if k != 'testhost_root'}, **DATA})\n"
            "            for n, d in _hosts if n in NAMES]\n")
        return path

    def deploy(self, names: list[str], mode: str, label: str, background: bool = False):
        """pyinfra with the weights-only deploy; each output line timestamped as it arrives."""
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE", "QWEN27B_CACHE")}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", QWEN27B_REPORTS=str(self.work / "reports"))
        argv = [sys.executable, "-m", "pyinfra", str(self.inventory(names, mode)), "benchmarks/fanout_deploy.py", "-y"]
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(proc)
        run = {"label": label, "proc": proc, "lines": [], "t0": time.monotonic()}

        def reader():
            with open(self.out / f"deploy-{label}.log", "w") as out:
                for line in proc.stdout:
                    stamp = time.monotonic() - run["t0"]
                    run["lines"].append((stamp, ANSI.sub("", line.rstrip("\n"))))
                    out.write(f"{stamp:8.2f} {line}")
            proc.wait()
            run["wall"] = time.monotonic() - run["t0"]

        run["thread"] = threading.Thread(target=reader, daemon=True)
        run["thread"].start()
        if not background:
            self.finish(run)
        return run

    def finish(self, run, timeout: float = 1800) -> None:
        run["thread"].join(timeout)
        if run["thread"].is_alive():
            _stop(run["proc"])
            run["thread"].join(30)
        run["rc"] = run["proc"].returncode

    @staticmethod
    def op_times(run) -> dict[tuple[str, str], tuple[float, float, str]]:
        """(operation, host) -> (operation start, host done, status) from pyinfra's output."""
        out, op, started = {}, None, 0.0
        for stamp, line in run["lines"]:
            m = re.match(r"--> Starting operation: (.*)$", line.strip())
            if m:
                op, started = m.group(1).strip(), stamp
                continue
            m = re.match(r"\[([^\]]+)\]\s+(Success|No changes|Error)", line.strip())
            if m and op:
                out[(op, m.group(1))] = (started, stamp, m.group(2))
        return out

    def verify(self, names: list[str]) -> int:
        sums = "".join(f"{m['sha256']}  {n}\n" for n, m in sorted(self.manifest.items()))
        cmd = f"cd {TARGET} && printf %s {shlex.quote(sums)} | sha256sum --quiet -c - && echo VERIFIED"
        out = {}
        threads = [threading.Thread(target=lambda n=n: out.__setitem__(n, self.ssh(n, cmd, check=False)))
                   for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum("VERIFIED" in out[n].stdout for n in names)

    # -- the rsync baseline
    def rsync_wave(self, copies: list[dict]) -> None:
        """Run the rsync twin of each copy in `copies` at the same time (same concurrency as the
        fan-out), into a scratch dir; fills copy['rsync_s']."""
        commands = {}
        for c in copies:
            if c["source"] == "mirror":
                src = f"rsync://127.0.0.1:{self.wan_rsync}/ckpt/{SAFE}/"
                env = "RSYNC_PROXY=127.0.0.1:3128 "
            else:
                src = f"rsync://{c['source_address']}:{PEER_RSYNC_PORT}/models/{SAFE}/"
                env = ""
            rsync = f"{env}rsync -a --exclude manifest.json --exclude .complete --exclude '.*' {src} {SCRATCH}/"
            timer = ("import subprocess, sys, time; t = time.monotonic(); "
                     "r = subprocess.run(sys.argv[1], shell=True).returncode; "
                     "print('ELAPSED %.3f' % (time.monotonic() - t)); sys.exit(r)")
            commands[c["host"]] = f"rm -rf {SCRATCH}; python3 -c {shlex.quote(timer)} {shlex.quote(rsync)}"
        out = self.parallel(commands)
        for c in copies:
            c["rsync_s"] = float(re.search(r"ELAPSED ([0-9.]+)", out[c["host"]].stdout).group(1))
        self.parallel({c["host"]: f"rm -rf {SCRATCH}" for c in copies})

    def peer_rsyncd(self, seeds: dict[str, str], start: bool) -> None:
        if not seeds:
            return
        if start:
            conf = (f"pid file = {PEER_RSYNC_PID}\nuse chroot = no\nuid = root\ngid = root\n"
                    "[models]\n    path = /var/lib/qwen27b/models\n    read only = yes\n")
            self.parallel({n: f"printf %s {shlex.quote(conf)} > {PEER_RSYNC_CONF} && rsync --daemon --address {a} "
                              f"--port {PEER_RSYNC_PORT} --config {PEER_RSYNC_CONF}" for n, a in seeds.items()})
        else:  # by the PID it wrote
            self.parallel({n: f"test -s {PEER_RSYNC_PID} && kill $(cat {PEER_RSYNC_PID}) || true" for n in seeds})

    # -- the cases
    def case(self, label: str, names: list[str], mode: str) -> dict:
        log(f"case {label}: {len(names)} host(s), fan-out {mode}")
        self.reset_hosts([n for n, _ in self.hosts])
        self.mirror.handler.requests.clear()
        wan0 = self.wan.down["http"]
        run = self.deploy(names, mode, label)
        wan = self.wan.down["http"] - wan0
        if run["rc"] != 0:
            tail = "\n".join(line for _, line in run["lines"][-40:])
            raise RuntimeError(f"deploy for case {label} failed (rc {run['rc']}):\n{tail}")
        ops = self.op_times(run)
        copies = []
        address = dict(self.hosts)
        if mode == "tree":
            plan = _plan_lines(run)
            for line in plan:
                m = re.match(r"wave (\d+): (\S+) <- (the mirror|(\S+) \(([\d.]+):\d+\))", line)
                if m:
                    copies.append({"case": label, "wave": int(m.group(1)), "host": m.group(2),
                                   "source": "mirror" if m.group(3) == "the mirror" else m.group(4),
                                   "source_address": m.group(5)})
            for c in copies:
                start, end, status = ops[(f"weights fan-out wave {c['wave']} of {SAFE}", c["host"])]
                c["fetch_s"] = end - start
        else:
            for n in names:
                start, end, status = ops[("fetch the checkpoint from the mirror", n)]
                copies.append({"case": label, "wave": 0, "host": n, "source": "mirror", "source_address": None,
                               "fetch_s": end - start})
        verified = self.verify(names)
        first = min(ops[k][0] for k in ops if k[0].startswith(("weights fan-out wave", "fetch the checkpoint")))
        last = max(ops[k][1] for k in ops if k[0].startswith(("weights fan-out", "fetch the checkpoint")))
        result = {"case": label, "hosts": len(names), "mode": mode, "wall_s": run["wall"], "transfer_s": last - first,
                  "wan_bytes": wan, "model_bytes": self.model_bytes, "verified": verified,
                  "load_1min": round(os.getloadavg()[0], 1),  # the 2 cores are shared with other jobs
                  "mirror_file_requests": sum(1 for p, _ in self.mirror.handler.requests if not p.endswith("manifest.json"))}
        log(f"case {label}: wall {run['wall']:.1f} s, transfers {last - first:.1f} s, WAN {wan / self.model_bytes:.2f}x "
            f"the model, {verified}/{len(names)} verified; now the rsync twins")
        if not self.args.no_rsync:
            seeds = {c["source"]: address[c["source"]] for c in copies if c["source"] != "mirror"}
            self.peer_rsyncd(seeds, start=True)
            try:
                for wave in sorted({c["wave"] for c in copies}):
                    self.rsync_wave([c for c in copies if c["wave"] == wave])
            finally:
                self.peer_rsyncd(seeds, start=False)
        for c in copies:
            c["bytes"] = self.model_bytes
        self.results["cases"].append(result)
        self.results["copies"] += copies
        self.save()
        return result

    def resume_case(self) -> None:
        """Reboot a host in the middle of its third shard; run the deploy again; what is asked for."""
        name = self.hosts[0][0]
        log(f"resume case on {name}: reboot in the middle of the third shard, then deploy again")
        self.reset_hosts([n for n, _ in self.hosts])
        shards = sorted(n for n in self.manifest if n.endswith(".safetensors"))
        third = shards[2]
        size = self.manifest[third]["size"]
        self.mirror.handler.requests.clear()
        wan0 = self.wan.down["http"]
        before_third = sum(self.manifest[n]["size"] for n in sorted(self.manifest) if n < third)
        run = self.deploy([name], "none", "resume-interrupted", background=True)
        deadline = time.monotonic() + 900
        while self.wan.down["http"] - wan0 < before_third + size // 2:
            if run["proc"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the deploy ended before the interruption point")
            time.sleep(0.05)
        log(f"{name}: rebooting at {(self.wan.down['http'] - wan0) / 2**20:.0f} MiB over the WAN")
        with contextlib.suppress(TestHostsError):  # the session may die with the host
            self.ssh(name, "systemctl reboot", check=False, timeout=30)
        self.finish(run, timeout=180)
        interrupted_wan = self.wan.down["http"] - wan0
        self.lab.wait_ssh(name)
        self.lab.wait_system(name)
        listing = self.ssh(name, f"cd {TARGET} && stat -c '%n %s' * 2>/dev/null || true").stdout
        state = {}
        for line in listing.splitlines():
            fname, _, nbytes = line.rpartition(" ")
            state[fname] = int(nbytes)
        before = self.mirror.handler.requests[:]
        self.mirror.handler.requests.clear()
        wan1 = self.wan.down["http"]
        rerun = self.deploy([name], "none", "resume-rerun")
        resent = self.wan.down["http"] - wan1
        ok = self.verify([name]) == 1
        rows = []
        for fname in sorted(self.manifest):
            full = self.manifest[fname]["size"]
            if state.get(fname) == full:
                had = "complete"
            elif fname + ".part" in state:
                had = f"part {state[fname + '.part'] / 2**20:.0f} of {full / 2**20:.0f} MiB"
            else:
                had = "not started"
            asked = [r for p, r in self.mirror.handler.requests if p.endswith("/" + fname)]
            rows.append({"file": fname, "before": had,
                         "rerun_requests": ", ".join(r or "whole file" for r in asked) or "none"})
        self.results["resume"] = {"host": name, "interrupted_rc": run["rc"], "rerun_rc": rerun["rc"],
                                  "wan_before_interrupt": interrupted_wan, "wan_rerun": resent,
                                  "model_bytes": self.model_bytes, "verified": ok, "rows": rows,
                                  "requests_before": len(before), "rerun_wall_s": rerun["wall"]}
        self.save()

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2) + "\n")

    def close(self) -> None:
        for proc in self.procs:
            _stop(proc)
        with contextlib.suppress(AttributeError):
            self.wan.close()
            self.mirror.shutdown()
        if self.args.keep:
            log(f"hosts left up (profile {self.args.profile}): python3 -m tests.support.testhosts --profile "
                f"{self.args.profile} down")
            return
        with contextlib.suppress(TestHostsError):
            self.lab.down()


def _plan_lines(run) -> list[str]:
    lines, inside = [], False
    for _, line in run["lines"]:
        if line.startswith("== weights fan-out of"):
            inside = True
            continue
        if inside:
            if not line.strip():
                break
            lines.append(line.strip())
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def _stop(proc: subprocess.Popen) -> None:
    """One process this benchmark started, by its PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------- tables

def tables(results: dict) -> str:
    cases = results["cases"]
    one = next((c for c in cases if c["case"] == "one"), None)
    out = ["", "fan-out cases (weights role only; every case from hosts without the checkpoint)", ""]
    head = ["case", "hosts", "fan-out", "wall s", "transfers s", "x one host", "WAN bytes / model", "verified",
            "load"]
    rows = []
    for c in cases:
        ratio = f"{c['wall_s'] / one['wall_s']:.2f}" if one else "-"
        rows.append([c["case"], str(c["hosts"]), c["mode"], f"{c['wall_s']:.1f}", f"{c['transfer_s']:.1f}", ratio,
                     f"{c['wan_bytes'] / c['model_bytes']:.2f}", f"{c['verified']}/{c['hosts']}",
                     f"{c.get('load_1min', '-')}"])
    out += _table(head, rows)
    out.append("transfers s: from the first transfer operation's start to the last one's end (wall s adds pyinfra's "
               "connect, facts and preflight); load: 1-min load average of this 2-core machine after the case")
    out += ["", "each copy vs plain rsync of the same files, same link, same concurrency, same run", ""]
    head = ["case", "wave", "copy", "GiB", "qwen27b s", "MB/s", "rsync s", "MB/s", "ratio"]
    rows = []
    for c in results["copies"]:
        src = "mirror (WAN)" if c["source"] == "mirror" else c["source"]
        mbs = c["bytes"] / c["fetch_s"] / MB
        r = c.get("rsync_s")
        rows.append([c["case"], str(c["wave"]), f"{src} -> {c['host']}", f"{c['bytes'] / 2**30:.2f}", f"{c['fetch_s']:.1f}",
                     f"{mbs:.0f}", f"{r:.1f}" if r else "-", f"{c['bytes'] / r / MB:.0f}" if r else "-",
                     f"{r / c['fetch_s']:.2f}" if r else "-"])
    out += _table(head, rows)
    out.append("ratio = qwen27b-fetch throughput / rsync throughput (1.00 = as fast as rsync; qwen27b s "
               "includes the sha256 check of every file)")
    res = results.get("resume")
    if res:
        out += ["", f"resume: {res['host']} rebooted in the middle of the third shard, then the deploy run again", ""]
        out += _table(["file", "on the host after the reboot", "asked of the mirror on the re-run"],
                      [[r["file"], r["before"], r["rerun_requests"]] for r in res["rows"]])
        out.append(f"WAN bytes: {res['wan_before_interrupt'] / 2**20:.0f} MiB before the reboot + "
                   f"{res['wan_rerun'] / 2**20:.0f} MiB on the re-run = "
                   f"{(res['wan_before_interrupt'] + res['wan_rerun']) / res['model_bytes']:.2f}x the model; "
                   f"re-run {res['rerun_wall_s']:.1f} s, verified: {'yes' if res['verified'] else 'NO'}")
    return "\n".join(out) + "\n"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--size-gib", type=float, default=2.0, help="checkpoint size (keep it to the disk: "
                    "each host holds a copy, plus one rsync copy at a time)")
    ap.add_argument("--files", type=int, default=8, help="number of shards")
    ap.add_argument("--wan-mbs", type=float, default=50.0, help="emulated WAN, MB/s shared by all hosts (0: none)")
    ap.add_argument("--profile", default="fanout-bench")
    ap.add_argument("--cases", default="one,each,tree,resume")
    ap.add_argument("--no-rsync", action="store_true", help="skip the rsync twins")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "fanout-results"),
                    help="tables.txt, results.json and the deploy logs go here")
    ap.add_argument("--work", default=str(cache_root() / "fanout-bench" / "work"), help="scratch files")
    ap.add_argument("--keep", action="store_true", help="leave the hosts up")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("benchmarks/fanout.py needs root (test hosts)", file=sys.stderr)
        return 2
    free = shutil.disk_usage(cache_root() if cache_root().exists() else "/").free
    need = args.size_gib * 2**30 * (args.hosts + 2) * 1.1
    if need > free:
        print(f"needs ~{need / 2**30:.0f} GiB free for {args.hosts} copies + the mirror + an rsync copy; "
              f"{free / 2**30:.0f} GiB free: lower --size-gib", file=sys.stderr)
        return 2
    bench = Bench(args)
    cases = args.cases.split(",")
    try:
        bench.up()
        bench.start_mirror()
        names = [n for n, _ in bench.hosts]
        bench.results["setup"] = {"hosts": names, "size_gib": args.size_gib, "files": args.files,
                                  "wan_mbs": args.wan_mbs, "model_bytes": bench.model_bytes}
        if "one" in cases:
            bench.case("one", names[:1], "none")
        if "each" in cases:
            bench.case("each", names, "none")
        if "tree" in cases:
            bench.case("tree", names, "tree")
        if "resume" in cases:
            bench.resume_case()
        bench.reset_hosts(names)
    finally:
        bench.close()
    text = (f"weights fan-out: {len(bench.hosts)} nspawn hosts, checkpoint {bench.model_bytes / 2**30:.2f} GiB in "
            f"{args.files} shards + config.json, WAN {args.wan_mbs:g} MB/s shared\n" + tables(bench.results))
    (bench.out / "tables.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
