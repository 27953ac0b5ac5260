"""Read-only shell scripts run on inventory hosts: one script per host, its output split back into
sections, and (for the tools beside the deploy) the inventory reached through pyinfra's own API.

`script()` prints each command's output between markers carrying a fresh nonce, so a host's
output (a journal line, a file) cannot forge a section end; `parse_script_output()` splits it.
Both are pure (tests/unit/slow/test_doctor.py runs a script through `sh -s`).

`load_inventory()` / `run_everywhere()` / `on_every_host()`: the inventory file loaded exactly
as `pyinfra INVENTORY deploy.py` loads it (pyinfra_cli's make_inventory, group_data/ included)
and each host reached through its own connector (ssh with ssh_port / ssh_user / ssh_key /
ssh_password, @local, @fake, @docker...), with the host's `_sudo` / `_sudo_user` / `_su_user` ...
data honoured the way a fact honours it, every host at once on pyinfra's greenlet pool
(`on_every_host` for a tool that runs more than one command per host, as doctor does). A host that cannot be reached gives
its connector's one-line error, never a traceback.
"""

from __future__ import annotations

import fnmatch
import os
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")
NOCMD = "##PYINFRA_NOCMD##"  # what pyinfra's requires_command guard prints when the binary is absent


def new_nonce() -> str:
    return secrets.token_hex(6)


def guard(binary: str, command: str) -> str:
    """`command` if `binary` is installed, else pyinfra's marker (the parsers know it)."""
    return f"if command -v {binary} >/dev/null 2>&1; then ( {command} ); else echo '{NOCMD}'; fi"


def script(cmds: dict[str, str], nonce: str, stdout_only: frozenset[str] | set[str] = frozenset(),
           preamble: bool = True) -> str:
    """One shell script printing each command's output between markers, then its exit code.
    Keys in `stdout_only` get stdout alone (their stderr goes to /dev/null), the rest both.
    `preamble=False` leaves the environment as it is (fact reads: the answer pyinfra's own gets)."""
    lines = ["export LC_ALL=C.UTF-8 SYSTEMD_PAGER= SYSTEMD_COLORS=0 PAGER=cat"] if preamble else []
    for key, command in cmds.items():
        stderr = "2>/dev/null" if key in stdout_only else "2>&1"
        lines += [f"echo '@@{nonce}@@ BEGIN {key}'", f"( {command}\n) </dev/null {stderr}",
                  f"printf '\\n@@{nonce}@@ END {key} %s\\n' \"$?\""]
    return "\n".join(lines) + "\n"


def parse_script_output(text: str, nonce: str, strip: bool = True) -> tuple[dict[str, str], dict[str, int]]:
    """The script's output -> (output by key, exit code by key); a section cut short is absent.
    `strip=False` keeps each output's trailing newlines (exactly what the command printed)."""
    outputs, codes = {}, {}
    pattern = re.compile(rf"@@{re.escape(nonce)}@@ BEGIN (\S+)\n(.*?)\n@@{re.escape(nonce)}@@ END \1 (\d+)\n", re.S)
    for match in pattern.finditer(text):
        outputs[match[1]] = match[2].rstrip("\n") if strip else match[2]
        codes[match[1]] = int(match[3])
    return outputs, codes


def render_output(outputs: dict[str, str], nonce: str, codes: dict[str, int] | None = None) -> str:
    """What `script` prints for these outputs: recorded hosts (@fake) replay it."""
    codes = codes or {}
    return "".join(f"@@{nonce}@@ BEGIN {key}\n{text}\n\n@@{nonce}@@ END {key} {codes.get(key, 0)}\n"
                   for key, text in outputs.items())


# --------------------------------------------------------------------------- pyinfra

def load_inventory(path: str, limit: list[str] | None = None, cwd: str | None = None, parallel: int | None = None):
    """(pyinfra State, the selected hosts in inventory order). `limit` as pyinfra's --limit: a
    group name or a glob on host names, repeatable; raises ValueError when nothing matches.
    `parallel`: hosts at once (pyinfra's --parallel; its default is 20 per CPU)."""
    from pyinfra.api import Config, State
    from pyinfra.api.exceptions import NoGroupError
    from pyinfra.context import ctx_inventory, ctx_state
    from pyinfra_cli.inventory import make_inventory

    cwd = cwd or os.getcwd()
    if cwd not in sys.path:  # as pyinfra's CLI: an inventory file may import modules beside it
        sys.path.append(cwd)
    state = State()
    state.cwd = cwd
    ctx_state.set(state)
    inventory = make_inventory(path, cwd=cwd)
    ctx_inventory.set(inventory)
    hosts = list(inventory)
    if limit:
        chosen = set()
        for pattern in limit:
            try:
                matched = inventory.get_group(pattern)
            except NoGroupError:
                matched = [h for h in hosts if fnmatch.fnmatch(h.name, pattern)]
            if not matched:
                raise ValueError(f"no host matches --limit {pattern}")
            chosen.update(matched)
        hosts = [h for h in hosts if h in chosen]
    state.init(inventory, Config(PARALLEL=parallel) if parallel else Config(), initial_limit=hosts if limit else None)
    no_delay_on_connect(state)
    return state, hosts



def selected_hosts(tool: str, inventory: str, limit: list[str] | None, parallel: int | None = None):
    """load_inventory for an operator command: (state, hosts), or None once it has told stderr why
    (an inventory that does not load, or no host selected): the command then exits 2."""
    try:
        state, hosts = load_inventory(inventory, limit, parallel=parallel)
    except Exception as error:  # noqa: BLE001 (pyinfra raises many kinds for a bad inventory file)
        print(f"{tool}: cannot load inventory {inventory}: {error}", file=sys.stderr)
        return None
    if not hosts:
        print(f"{tool}: no host selected", file=sys.stderr)
        return None
    return state, hosts

# pyinfra asks for a sudo password with getpass when sudo says it needs one; with no terminal that is
# an EOFError deep in a fact read (issue 32). What it means, and what to do, instead:
SUDO_PASSWORD_NEEDED = ("sudo on this host needs a password and this run has no terminal to ask for it",
                        "give this SSH user passwordless sudo (a NOPASSWD line in /etc/sudoers.d), or run on a "
                        "terminal with --use-sudo-password")


@dataclass
class Answer:
    """One host's answer: `error` set when it could not be reached (`unreachable`) or the command
    could not run; otherwise stdout/stderr and whether the command exited 0."""

    host: str
    ok: bool = False
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    unreachable: bool = False
    seconds: float = 0.0


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


def host_arguments(state, host) -> dict:
    """The host's connector arguments (`_sudo`, `_sudo_user`, `_use_sudo_password`, `_su_user`, `_env`...)
    from its data and the run's config, exactly as pyinfra applies them to a fact or an operation."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

    arguments, _ = pop_global_arguments(state, host, {})
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS}


def on_host(host, command, *, state=None, connector: dict | None = None, via=None, **options):
    """THE one way a command reaches a host outside pyinfra's operations and facts: with the host's
    connector arguments, so a lab deploying as a non-root user with `_sudo = True` gets sudo here as
    in every operation (issue 32: verify's rollback ran its restore without sudo and failed
    silently). `connector`: the arguments already resolved (an operation's own, the fact cache's);
    `options`: `_timeout`, `_stdin`, `print_output`... `via`: another connection to this host (the
    progress probe's own, `side_connection`) instead of the one pyinfra's operations use. Returns
    pyinfra's (ok, CommandOutput). tests/unit/slow/test_sudo_path.py fails on any other `run_shell_command`
    call in the project."""
    from pyinfra.api import StringCommand

    executor = dict(connector) if connector is not None else host_arguments(host.state if state is None else state, host)
    executor.update(options)
    return (via or host).run_shell_command(command if isinstance(command, StringCommand) else StringCommand(command),
                                           **executor)


def no_delay(connector) -> bool:
    """TCP_NODELAY on an SSH connection's own socket; True once set.

    Why: neither paramiko nor pyinfra sets a socket option, so Nagle's algorithm holds each small SSH
    packet until the one before is acknowledged, and Linux delays that acknowledgement up to 40 ms:
    every remote command paid it. Measured on a test host over a paramiko connection as pyinfra's
    (`sudo -H -n sh -c true`, median of 20, 2026-12-06): 52-64 ms with Nagle, 10-18 ms without; a
    no-op deploy runs ~110 commands per host. OpenSSH's own client sets it for sessions too. Other
    connectors (@local, @fake, @docker) and a connection through a ProxyCommand or a jump host have
    no TCP socket here: nothing to do."""
    client = getattr(connector, "client", None)
    transport = client.get_transport() if client is not None and hasattr(client, "get_transport") else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return False
    return True


def no_delay_on_connect(state) -> None:
    """no_delay for every host `state` connects from now on (a pyinfra callback on host_connect):
    the deploy's State (config.py, controller/runlife.watch_connections) and the tools' (load_inventory)."""
    from pyinfra.api.state import BaseStateCallback

    class NoDelay(BaseStateCallback):
        @staticmethod
        def host_connect(state, host) -> None:
            no_delay(host.connector)

    state.add_callback_handler(NoDelay())


def side_connection(host):
    """A second SSH connection to `host` (None for other connectors, or when it cannot be made),
    for commands run while one of pyinfra's operations runs on the first.

    Why: paramiko renegotiates the session keys every 512 MiB sent, and a channel that closes on that
    connection meanwhile deadlocks its reader (paramiko#822, open since 2016): the connection is
    dropped after 30 s. A probe polling every second during the 878 MiB wheelhouse upload closes a
    channel a second, and in CI the upload died of it (EOFError, stop 36). On a connection of its
    own, the probe's channels never meet the upload's key exchange."""
    from pyinfra.connectors.ssh import SSHConnector

    if not isinstance(host.connector, SSHConnector):
        return None
    connection = SSHConnector(host.state, host)
    try:
        connection.connect()
    except Exception:  # noqa: BLE001 - a side connection is an extra: the caller goes without
        return None
    no_delay(connection)
    return connection


def close_side_connection(connection) -> None:
    client = getattr(connection, "client", None)
    if client is not None:
        client.close()


def run_command(state, host, command: str, timeout: int = 60, stdin: str | None = None) -> Answer:
    """Connect (if not yet) and run one shell command with the host's connector arguments
    (`stdin`: written to the command's standard input, never on its command line)."""
    from pyinfra.api.exceptions import ConnectError

    started = time.monotonic()
    answer = Answer(host.name)
    try:
        host.connect(show_errors=False, raise_exceptions=True)
    except ConnectError as error:
        answer.error, answer.unreachable = _one_line(error), True
    except Exception as error:  # a connector may raise anything for bad host data
        answer.error, answer.unreachable = f"{type(error).__name__}: {_one_line(error)}", True
    if answer.error is None:
        options = {"_timeout": timeout, **({"_stdin": stdin} if stdin is not None else {})}
        try:
            ok, output = on_host(host, command, state=state, **options)
            answer.ok = ok
            answer.stdout = "\n".join(output.stdout_lines) + "\n"
            answer.stderr = "\n".join(output.stderr_lines)
        except EOFError:  # pyinfra's sudo password prompt, with nothing to read it from
            answer.error = "{}: {}".format(*SUDO_PASSWORD_NEEDED)
        except Exception as error:  # timeouts, a dropped connection, a sudo password asked
            answer.error = f"{type(error).__name__}: {_one_line(error)}"
    answer.seconds = time.monotonic() - started
    return answer


def no_sections_why(answer: Answer) -> str:
    """What the host printed instead of a script's sections (its last line), for the error."""
    return (answer.stderr.strip().splitlines() or answer.stdout.strip().splitlines() or ["no output"])[-1][:200]


def on_every_host(state, hosts, work: Callable[[object], T], failed: Callable[[object, str], T]) -> list[T]:
    """`work(host)` on every host at once (pyinfra's pool), results in `hosts` order, `failed(host,
    why)` for a host whose work raised; then every connection closed."""
    import gevent

    greenlets = [state.pool.spawn(work, host) for host in hosts]
    gevent.joinall(greenlets)
    results = [greenlet.value if greenlet.successful() else failed(host, f"internal error: {_one_line(greenlet.exception)}")
               for host, greenlet in zip(hosts, greenlets)]
    for host in hosts:
        if host.connected:
            try:
                host.disconnect()
            except Exception:  # closing is best effort
                pass
    return results


def run_everywhere(state, hosts, command_for: Callable[[object], str], timeout: int = 60) -> list[Answer]:
    """`command_for(host)` on every host at once (pyinfra's pool), answers in `hosts` order;
    then every connection closed."""
    commands = {host.name: command_for(host) for host in hosts}
    return on_every_host(state, hosts, lambda host: run_command(state, host, commands[host.name], timeout),
                         lambda host, why: Answer(host.name, error=why))
