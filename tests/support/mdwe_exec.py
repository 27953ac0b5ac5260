"""Run a command with the kernel's memory-deny-write-execute on (prctl PR_SET_MDWE, Linux 6.3+), as
systemd's MemoryDenyWriteExecute=yes holds the gateway's nginx on a host: a process that makes
memory executable after writing it (a JIT) fails here as it would there.

    python3 -m tests.support.mdwe_exec COMMAND [ARGS...]     # exit 125 when the kernel lacks it
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def supported() -> bool:
    """Whether this kernel has PR_SET_MDWE (asked of a child, which then exits)."""
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        os._exit(0 if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) == 0 else 1)
    return os.waitpid(pid, 0)[1] == 0


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        print(f"mdwe_exec: prctl(PR_SET_MDWE) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(125)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
