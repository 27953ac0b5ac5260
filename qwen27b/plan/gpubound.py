"""A bound on every GPU command a fact, the prefetch or doctor runs (issue 52 item 2).

A wedged GPU makes `nvidia-smi` block in the driver forever; the deploy used to hang silently at
fact gathering. Two guards, both from the stack file's `gpu_command_bound` (with its sources):

* on the host, each GPU command goes through `nvidia_smi` / `bounded` (the one builder): coreutils
  `timeout -k KILL S`. When it ends the command (exit 124, or 137 where KILL was needed) the fact
  prints one line starting with MARKER, naming the command and the bound, and stops (its other GPU
  commands would hang too). The fact then answers that (facts._ParsedFact.process): NvidiaGpus a
  "gpu-hung" problem entry, the other GPU facts their empty answer;
* on the controller, a fact holding N bounded commands is read with pyinfra's `_timeout` of
  `controller_timeout(N)`: a D-state nvidia-smi ignores KILL, `timeout` waits for it and the output
  pipe stays open, so only the controller can stop waiting (controller/factcache.py).

`hang_trouble` is the verdict: the host is refused naming the hang, the Xid lines the kernel log
holds (read without nvidia-smi, bounded too) and the fix (reset the GPU or reboot).
Pure: no pyinfra, no host I/O.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from qwen27b.plan.stack import load_stack

MARKER = "qwen27b-bound:"
HUNG_EXITS = (124, 137)  # timeout(1): ended with TERM / had to send KILL
HUNG = "gpu-hung"
RESET_FIX = ("the GPU or its driver is wedged: stop what uses the GPUs and reset them as root (`nvidia-smi -r`; "
             "if that hangs too, reboot; a GPU that wedges again after a reboot needs its board checked), "
             "then re-run the deploy")


@dataclass(frozen=True)
class Bound:
    seconds: int
    kill_after_s: int
    margin_s: int

    @classmethod
    def of(cls, stack: dict) -> Bound:
        entry = stack["gpu_command_bound"]
        values = [entry["seconds"], entry["kill_after_s"], entry["margin_s"]]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise ValueError(f"stack gpu_command_bound: seconds, kill_after_s, margin_s must be positive integers, "
                             f"got {values}")
        return cls(*values)


def stack_bound() -> Bound:
    """The bound of the shipped stack file (the fact classes' commands are built from it at import)."""
    return Bound.of(load_stack())


def bounded(command: str, bound: Bound) -> str:
    """`command` (a shell command line starting with a program) under coreutils timeout."""
    return f"timeout -k {bound.kill_after_s} {bound.seconds} {command}"


def nvidia_smi(args: str, bound: Bound, redirect: str = "2>&1") -> str:
    """`nvidia-smi ARGS REDIRECT` bounded; when the bound ends it, the MARKER line on stdout and the
    fact's command stops there (`exit 0`: every fact command runs in its own subshell)."""
    what = shlex.quote(" ".join(["nvidia-smi", *args.split()[:1]]).split("=")[0])  # its first word: the query
    return (f"{bounded('nvidia-smi ' + args, bound)} {redirect}; q=$?; "
            f"if [ \"$q\" = {HUNG_EXITS[0]} ] || [ \"$q\" = {HUNG_EXITS[1]} ]; then "
            f"echo \"{MARKER} \"{what}\" did not return within {bound.seconds} s (timeout exit $q)\"; exit 0; fi")


def controller_timeout(commands: int, bound: Bound) -> int:
    """How long the controller waits for a fact holding `commands` bounded commands."""
    return commands * (bound.seconds + bound.kill_after_s) + bound.margin_s


def unanswered(fact: str, seconds: int) -> str:
    """The refusal's cause when the controller stopped waiting for a bounded fact: the host's own
    bound did not end it (a GPU command in uninterruptible sleep ignores KILL)."""
    return (f"the {fact} fact did not answer within {seconds} s, though its GPU commands run under timeout: "
            "an nvidia-smi stuck in the driver (uninterruptible sleep, KILL ignored) - a GPU or the NVIDIA "
            "driver is wedged; read the Xid lines with `journalctl -k | grep Xid` or `dmesg | grep Xid`")


def hung_line(lines: list[str]) -> str | None:
    """The MARKER line's message (without the marker) when a bounded command timed out, else None."""
    for line in lines:
        if line.startswith(MARKER):
            return line[len(MARKER):].strip()
    return None


def hung_problem(message: str) -> dict:
    """NvidiaGpus' answer for a timed-out nvidia-smi: one "problem" entry (gate.HostFacts splits it off)."""
    return {"problem": HUNG, "bus_id": None, "message": message}


def hang_cause(problems: list[dict], xids: list[dict], limit: int = 3) -> str | None:
    """The refusal's cause when a GPU command hung, with the newest Xid lines; None when none hung."""
    hung = [p["message"] for p in problems if p.get("problem") == HUNG]
    if not hung:
        return None
    cause = f"{hung[0]}: a GPU or the NVIDIA driver does not answer (the fact read was stopped at its bound)"
    shown = [f"{x.get('time')} Xid {x.get('xid')} on {x.get('pci')}" for x in list(xids or [])[-limit:]]
    if shown:
        cause += "; the kernel log's last Xid lines: " + " | ".join(shown)
    else:
        cause += "; no Xid line in the kernel log (journalctl -k / dmesg)"
    return cause
