"""Progress lines of the long steps (qwen27b/controller/progress.py).

The real CLI: `pyinfra @local tests/data/progress_deploy.py -y` under a pseudo-terminal (python's
pty) draws the watched step's line (bytes of total, percent, rate, ETA) through the real probe
(`du` over the @local connector), pyinfra's callbacks and the terminal board; the same run with
its output in a pipe draws nothing. The roles' own lines (weights, install, the load's shards) on
a real test host are in tests/e2e/test_deploy.py. The pure parts below: number formats, the
rate and ETA, vLLM's shard line.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from qwen27b.controller import postdeploy as V
from qwen27b.controller.progress import Board, Meter, _Above, bytes_line, human_bytes, human_duration
from tests.support.terminal import ANSI, run_on_a_terminal
from tests.support.paths import ROOT

WEIGHTS_LINE = re.compile(r"\[@local\] +weights +\d+\.\d MiB of 8\.0 MiB \(\d+%\), \d+\.\d (?:KiB|MiB)/s, ETA \d+s")


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYINFRA", "QWEN27B"))}
    env.update(PYTHONPATH=str(ROOT), PROGRESS_DIR=str(tmp_path / "weights"), QWEN27B_REPORTS=str(tmp_path / "reports"),
               TERM="xterm")
    (tmp_path / "weights").mkdir()
    return env


def test_a_watched_step_draws_bytes_rate_and_eta_on_a_terminal(tmp_path):
    rc, transcript = run_on_a_terminal([sys.executable, "-m", "pyinfra", "@local", "tests/data/progress_deploy.py", "-y"],
                                       _env(tmp_path), ROOT, columns=120, timeout=120)
    assert rc == 0, transcript[-3000:]
    text = ANSI.sub("", transcript)
    drawn = WEIGHTS_LINE.findall(text)
    assert len(drawn) >= 3, text[-3000:]  # it updates while the step runs
    assert "\x1b[1F\x1b[J" in transcript  # one line, redrawn in place (up one line, clear below)
    assert "qwen27b run summary: 1 of 1 host(s) ok" in text  # the lines were cleared before the summary
    assert os.environ.get("PYINFRA_PROGRESS") is None


def test_nothing_is_drawn_when_the_output_is_not_a_terminal(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pyinfra", "@local", "tests/data/progress_deploy.py", "-y"],
                            cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "weights" / "model.part").stat().st_size == 8 * 1048576
    assert "weights " not in result.stderr and "\x1b[" not in result.stderr and "MiB/s" not in result.stderr


def test_numbers():
    assert human_bytes(512) == "512 B" and human_bytes(1536) == "1.5 KiB" and human_bytes(20.4 * 2**30) == "20.4 GiB"
    assert human_duration(42) == "42s" and human_duration(228) == "3m48s" and human_duration(3725) == "1h02m"


def test_rate_is_over_the_recent_window_and_eta_follows_it():
    meter = Meter(total=1000, window=10)
    for second in range(0, 31):  # 10 B/s for 20 s, then 50 B/s
        meter.add(second, second * 10 if second <= 20 else 200 + (second - 20) * 50)
    assert meter.rate == 50 and meter.eta == (1000 - 700) / 50
    assert bytes_line("weights", meter) == "weights  700 B of 1000 B (70%), 50 B/s, ETA 6s"
    fresh = Meter(total=None)
    fresh.add(0, 4096)
    assert bytes_line("install", fresh) == "install  4.0 KiB"  # no rate from one sample, no ETA without a total
    done = Meter(total=100)
    done.add(0, 90)
    done.add(1, 120)
    assert bytes_line("install", done, "compiling bytecode") == "install  120 B of 100 B (100%), 30 B/s, compiling bytecode"


def test_vllm_shard_lines_and_the_load_line():
    journal = ("Loading safetensors checkpoint shards:   0% Completed | 0/5 [00:00<?, ?it/s]\n"
               "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:31<00:46, 15.6s/it]")
    assert V.shards(journal) == (2, 5) and V.shards("") is None
    assert V.shards("Loading safetensors checkpoint shards (eager): 100% Completed | 1/1 [00:01<00:00]") == (1, 1)
    assert V.load_line(45.2, (2, 5), "activating/start-post") == \
        "load     loading weights: shards 2/5, 45 s (unit activating/start-post)"
    assert "shards 1/1 (warming up)" in V.load_line(50, (1, 1), None)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_board_keeps_its_lines_below_what_else_is_written():
    terminal = _Terminal()
    board = Board()
    board.real, board.active = terminal, True
    board.set("gpu-a", "weights  1.0 GiB")
    board.set("gpu-b", "install  2.0 GiB")
    above = _Above(board, terminal)
    above.write("    [gpu-a] Success\n")
    board.set("gpu-a", "weights  1.5 GiB")
    out = terminal.getvalue()
    # two lines drawn; cleared (up 2, clear) before the foreign line, drawn again after it
    assert out.count("\x1b[2F\x1b[J") == 2 and out.endswith("[gpu-a] weights  1.5 GiB\n    [gpu-b] install  2.0 GiB\n")
    assert out.index("    [gpu-a] Success\n") < out.rindex("weights  1.5 GiB")
    above.write("partial")  # a writer mid-line: nothing is drawn until its newline
    board.set("gpu-b", "install  2.5 GiB")
    assert terminal.getvalue().endswith("partial")
    above.write(" line\n")
    assert terminal.getvalue().endswith("install  2.5 GiB\n")


def test_the_load_tick_reads_the_named_unit_and_draws_its_line(monkeypatch):
    """verify's per-host load line (controller/startwatch.py `_load_tick`) as it runs on a terminal:
    one remote read of the unit it watches (a copy's `qwen27b@NAME.service` too) and its shard count; the remote
    call is replaced by the two lines the host prints (CI has no terminal: the e2e twin is
    tests/e2e/test_deploy.py's tty deploy)."""
    from qwen27b.controller import startwatch

    asked, drawn = [], []
    monkeypatch.setattr(startwatch.progress, "drawing", lambda: True)
    monkeypatch.setattr(startwatch.progress, "show", lambda name, line: drawn.append((name, line)))
    monkeypatch.setattr(startwatch, "host_lines", lambda command: asked.append(command) or [
        "activating/start-post", "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:31<00:46, 15.6s/it]"])
    tick = startwatch._load_tick("gpu-a", "qwen27b@b.service")
    assert tick(45.2) == "activating/start-post"
    assert "systemctl show -p ActiveState,SubState --value qwen27b@b.service" in asked[0]
    assert "--value qwen27b@b.service)" in asked[0]  # this start's journal, by its invocation
    assert drawn == [("gpu-a", "load     loading weights: shards 2/5, 45 s (unit activating/start-post)")]
    monkeypatch.setattr(startwatch.progress, "drawing", lambda: False)
    assert startwatch._load_tick("gpu-a") is None  # not a terminal: no line, no remote read


def test_verify_sees_a_started_server_within_one_poll_of_its_health(monkeypatch):
    """wait_ready on a clock of its own: /health answers 503 until the server's 31st second, then 200.
    verify must see it within READY_POLL_MAX_S (2 s); with the old backoff to 10 s it saw it at
    40.8 s (the clean-clone run's reports: starts of ~25-31 s seen at 30.8 or 40.8 s)."""
    now = [0.0]
    monkeypatch.setattr(V.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(V.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))

    class Answer:
        def __init__(self, status):
            self.status = status

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def health(url, timeout=10, **kwargs):
        assert url == "http://h:8000/health"
        return Answer(200 if now[0] >= 31 else 503)

    monkeypatch.setattr(V, "_request", health)
    said = []
    elapsed = V.wait_ready("http://h:8000", 600, say=said.append)
    assert 31 <= elapsed <= 33
    assert said and all(line.startswith("loading weights... ") for line in said) and len(said) <= 4
