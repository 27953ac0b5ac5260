"""The operations pyinfra queued for a host, as text: what a dry run would do, command by command.

pyinfra's own `--dry` prints counts only; the lab admin (and the golden tests) want the commands.
"""

from __future__ import annotations

import hashlib

from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand


def _command_text(command) -> str:
    if isinstance(command, StringCommand):
        return command.get_masked_value()
    if isinstance(command, FileUploadCommand):
        secret = any(word in str(command.dest) for word in ("key", "token"))
        content = command.src.getvalue() if hasattr(command.src, "getvalue") and not secret else None
        digest = f" (sha1 {hashlib.sha1(content.encode()).hexdigest()[:12]})" if isinstance(content, str) else ""
        return f"upload{digest} -> {command.dest}"
    if isinstance(command, FunctionCommand):
        return f"python: {getattr(command.function, '__name__', command.function)}"
    return str(command)


# checks run every deploy and the host lock is taken and given back: none of them is a change
CHECK_PREFIX = ("verify:", "lock:", "unlock:")


def planned_operations(state, host) -> list[tuple[str, bool, list[str]]]:
    """(operation name, will it change the host, the commands) for each op queued for host, in order.

    The host's own call order: pyinfra's `state.get_op_order()` sorts every host's operations
    (a graph of all hosts, each time: quadratic over a run that prints each host's plan), and each
    host's operations form one chain in that graph, so its order restricted to this host is this."""
    out = []
    for op_hash in host.op_hash_order:
        data = state.ops[host].get(op_hash)
        if data is None:
            continue
        name = ", ".join(sorted(state.op_meta[op_hash].names))
        changes = bool(data.operation_meta.will_change) and not name.startswith(CHECK_PREFIX)
        commands = [_command_text(c) for c in data.command_generator()] if changes else []
        out.append((name, changes, commands))
    return out
