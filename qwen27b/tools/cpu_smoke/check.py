"""``check``: a fresh venv from the wheelhouse, a real ``vllm serve`` on loopback, real requests.

Also the server helpers the unit tier's session fixture reuses (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from qwen27b.controller.cpu_build import (DEFAULT_TORCH_FIND_LINKS, SERVED_MODEL_NAME, VLLM_VERSION,
                                          install_argv, offline_pip_env, post_install_commands,
                                          serve_command, serve_env)

from .common import _find_python, _run, _say, dir_size, fetch_clients, human, read_manifest
from .model import build_model
from .wheelhouse import build_wheelhouse

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, starttime) of a live pid, from /proc."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """{pid: starttime} of every live descendant of ``pid`` (Linux /proc)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st:
                children.setdefault(st[0], []).append((int(entry), st[1]))
    out, todo = {}, [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            if child not in out:
                out[child] = start
                todo.append(child)
    return out


def stop_server(proc: subprocess.Popen, grace: float = 15.0) -> float:
    """SIGTERM the server; after ``grace`` s SIGKILL it and its descendants, by PID."""
    t0 = time.monotonic()
    kids = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _say(f"server {proc.pid} still running after {grace:.0f} s: SIGKILL")
        proc.kill()
        proc.wait()
    kids.update(descendants(proc.pid))
    deadline = time.monotonic() + max(0.0, grace - (time.monotonic() - t0))
    while True:
        alive = {p: s for p, s in kids.items() if (_proc_stat(p) or (0, None))[1] == s}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    for pid in alive:
        _say(f"SIGKILL straggler {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return time.monotonic() - t0


def wait_health(base: str, proc: subprocess.Popen, log: Path, timeout: float = 600.0) -> float:
    import httpx
    t0 = time.monotonic()
    next_note = 10.0
    while True:
        elapsed = time.monotonic() - t0
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            raise SystemExit(f"vllm serve exited with {proc.returncode} before /health:\n"
                             + "\n".join(tail))
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return elapsed
        except httpx.HTTPError:
            pass
        if elapsed >= next_note:
            last = ""
            try:
                lines = log.read_text(errors="replace").strip().splitlines()
                last = lines[-1][-120:] if lines else ""
            except OSError:
                pass
            _say(f"waiting for /health: {elapsed:.0f} s ... {last}")
            next_note += 10.0
        if elapsed > timeout:
            raise SystemExit(f"no /health 200 after {timeout:.0f} s (log: {log})")
        time.sleep(1.0)


def stream_chat(base: str, model: str, prompt: str = "你好", max_tokens: int = 64) -> dict:
    """One streamed chat completion; TTFT and decode rate measured client-side."""
    import httpx
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    t_first = t_last = None
    text, usage, finish, chunks = [], None, None, 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for choice in obj.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    now = time.monotonic()
                    t_first = t_first or now
                    t_last = now
                    chunks += 1
                    text.append(delta)
                finish = choice.get("finish_reason") or finish
    t_end = time.monotonic()
    if t_first is None:
        raise SystemExit("the stream returned no content")
    completion = (usage or {}).get("completion_tokens", chunks)
    decode_s = (t_last - t_first) if t_last and t_last > t_first else None
    return {"ttft_s": t_first - t0, "total_s": t_end - t0, "completion_tokens": completion,
            "prompt_tokens": (usage or {}).get("prompt_tokens"), "finish_reason": finish,
            "decode_tok_s": (completion - 1) / decode_s if decode_s else None,
            "overall_tok_s": completion / (t_end - t0), "text": "".join(text)}


def run_check(cache: Path, *, wheelhouse: Path, model_dir: Path, python: str | None = None,
              reuse_venv: bool = False, find_links: Sequence[str] = DEFAULT_TORCH_FIND_LINKS,
              health_timeout: float = 600.0) -> dict:
    import httpx
    build_wheelhouse(wheelhouse, find_links=find_links)
    build_model(model_dir, cache, python=python, find_links=find_links, wheelhouse=wheelhouse)
    py = _find_python(python)
    root = cache / "check"
    venv = root / "venv"
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {
        "wheelhouse_bytes": sum(f["size"] for f in read_manifest(wheelhouse)["files"].values()),
        "wheelhouse_files": len(read_manifest(wheelhouse)["files"]),
    }

    # fresh venv, offline install
    marker = venv / ".qwen27b-installed"
    if reuse_venv and marker.is_file():
        _say(f"reusing {venv}")
        results["venv_install_s"] = None
    else:
        if venv.exists():
            shutil.rmtree(venv)
        t0 = time.monotonic()
        _run([py, "-m", "venv", str(venv)])
        _run(install_argv(str(venv), str(wheelhouse)), env=offline_pip_env(os.environ))
        results["venv_install_s"] = time.monotonic() - t0
        marker.write_text(VLLM_VERSION + "\n")
    # the download clients (the `modelscope` CLI): the tests drive them against local hub servers;
    # also into a venv kept from before they were added
    if not (venv / "bin" / "modelscope").exists():
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse),
              *fetch_clients()], env=offline_pip_env(os.environ))
    t0 = time.monotonic()
    for cmd in post_install_commands(str(venv), VLLM_VERSION):
        _run(["sh", "-c", cmd])
    results["post_install_s"] = time.monotonic() - t0
    results["venv_bytes"] = dir_size(venv)

    # real server
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = root / "vllm-serve.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
           **serve_env(str(root / "vllm-cache"))}
    argv = serve_command(str(venv), str(model_dir), SERVED_MODEL_NAME, "127.0.0.1", port)
    _say("$ " + " ".join(f"{k}={v}" for k, v in serve_env(str(root / "vllm-cache")).items())
         + " " + shlex.join(argv))
    t0 = time.monotonic()
    with open(log, "wb") as logf:
        proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(root))
    _say(f"vllm serve pid {proc.pid}, log {log}")
    try:
        results["startup_s"] = wait_health(base, proc, log, timeout=health_timeout)
        _say(f"/health 200 after {results['startup_s']:.1f} s")
        models = httpx.get(f"{base}/v1/models", timeout=10).json()
        ids = [m["id"] for m in models.get("data", [])]
        _say(f"/v1/models: {ids}")
        if SERVED_MODEL_NAME not in ids:
            raise SystemExit(f"{SERVED_MODEL_NAME} not served: {ids}")
        version = httpx.get(f"{base}/version", timeout=10).json().get("version")
        results["server_version"] = version
        chat = stream_chat(base, SERVED_MODEL_NAME)
        results.update({k: v for k, v in chat.items()})
        _say(f"chat ({chat['completion_tokens']} tokens, finish {chat['finish_reason']}): "
             f"{chat['text']!r}")
        results["rss_bytes"] = sum(_rss(p) for p in [proc.pid, *descendants(proc.pid)])
    finally:
        results["stop_s"] = stop_server(proc)
        _say(f"server stopped in {results['stop_s']:.1f} s (rc {proc.returncode})")
    (root / "last-check.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_table(results)
    return results


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def print_table(r: Mapping[str, object]) -> None:
    def secs(key):
        return "-" if r.get(key) is None else f"{r[key]:.1f} s"

    def rate(key):
        return "-" if r.get(key) is None else f"{r[key]:.1f} tok/s"
    rows = [
        ("wheelhouse size", f"{human(r['wheelhouse_bytes'])} ({r['wheelhouse_files']} wheels)"),
        ("venv install (--no-index)", secs("venv_install_s")),
        ("venv size", human(r["venv_bytes"])),
        ("start-up to /health 200", secs("startup_s")),
        ("TTFT (streamed chat)", f"{r['ttft_s'] * 1000:.0f} ms"),
        ("decode rate", rate("decode_tok_s")),
        ("overall (tokens / request time)", rate("overall_tok_s")),
        ("completion tokens", str(r.get("completion_tokens"))),
        ("server RSS (all processes)", human(r.get("rss_bytes") or 0)),
        ("stop (SIGTERM -> gone)", secs("stop_s")),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    print(f"{'measure'.ljust(width)} | value")
    print(f"{'-' * width}-+-{'-' * 24}")
    for k, v in rows:
        print(f"{k.ljust(width)} | {v}")
