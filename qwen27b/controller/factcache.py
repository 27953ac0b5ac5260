"""A per-run memo of fact answers, so a fact is read from a host once while nothing changes it.

pyinfra 3.10 keeps no fact cache: every `host.get_fact` runs its command, and every operation's
generator runs twice (to plan, then to execute), so a no-op re-run read each fact two or three
times (docs/deploy-bench.md). Here an answer is kept per State (on its runstate: a second
State in the process never sees it), per host, per fact, arguments and connector arguments
(`_sudo`, `_su_user`, ...), and dropped whenever a command may have changed the host:

* while planning (pyinfra's Prepare stage) nothing runs on a host, so every answer stays;
* while executing, every operation's command generator is wrapped (the `operation_host_start`
  callback, before pyinfra iterates it): each command it yields drops the host's answers before
  it runs and again after, and facts read while it runs (a `python.call` function reading facts
  between its own commands) are not kept. An operation that yields nothing leaves them all.
  `changes_only(op, Fact, ...)` narrows that for an operation whose commands change only what
  those facts read (the deploy lock: only `DeployLock`).

Answers are deep-copied in and out (a caller may change what it got). A read that failed the
host, a short fact, the clock (`server.Date`), one with global arguments in its call and one
with preconditions are never kept. pyinfra offers no hook around fact reads, so `install` sets
`get_fact` on each Host of the State (the instance, not the class: other States' hosts are
untouched). A kept answer is the plan's: a unit that crashes between planning and executing
is found by verify, not by the second read pyinfra would have made.

`prefetch` reads several facts in one remote command (a script of each fact's own command,
sections split by a fresh nonce) and keeps each answer as that fact's own read would have
returned it (an answer it cannot parse back, e.g. a @fake host's, leaves the fact to its own read).
"""

from __future__ import annotations

import copy
import posixpath
from functools import lru_cache
from inspect import signature

from paramiko import SSHException
from pyinfra import logger
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, all_global_arguments, pop_global_arguments
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.facts import FactBase, ShortFactBase
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_state

from qwen27b.plan.gpubound import controller_timeout, stack_bound

from . import runstate
from .remote import NOCMD, guard, new_nonce, on_host, parse_script_output, script

GLOBAL_KEYS = frozenset(name for name, _ in all_global_arguments())
KEYED = tuple(CONNECTOR_ARGUMENT_KEYS) + ("_ignore_errors",)  # what changes a read's answer or its failure


class FactCache:
    """One State's answers: host -> key -> value; `busy[host]`: a command of it is running."""

    def __init__(self) -> None:
        self.answers: dict = {}
        self.busy: dict = {}
        self.narrow: dict[str, frozenset[str]] = {}  # op hash -> names of the facts its commands change
        self.defaults: dict = {}  # host -> (config, its default connector arguments, their key text)
        self.op_texts: dict = {}  # host -> (the running op's global arguments, defaults' text, key text)

    def key(self, state, host, cls, args, kwargs):
        """The memo key, or None when this read is not kept."""
        if kwargs.keys() & GLOBAL_KEYS or host.current_deploy_kwargs or not _cacheable(cls):
            return None
        try:
            bound = _command_signature(cls).bind(*args, **kwargs)
        except TypeError:
            return None  # pyinfra raises it on the read itself
        bound.apply_defaults()
        return cls, repr(sorted(bound.arguments.items())), self._connector_text(state, host)

    def _connector_text(self, state, host) -> str:
        """The connector arguments of a read, as key text: the defaults, with the running operation's
        own over them (kept per operation: pyinfra builds its arguments dict once and never changes it)."""
        defaults, text = self._defaults(state, host)
        current = host.current_op_global_arguments
        if not current:
            return text
        memo = self.op_texts.get(host)
        if memo is None or memo[0] is not current or memo[1] is not text:
            connector = {**defaults, **{k: current[k] for k in KEYED if k in current}}
            memo = self.op_texts[host] = (current, text, repr(sorted(connector.items())))
        return memo[2]

    def _defaults(self, state, host) -> tuple[dict, str]:
        """The connector arguments a read outside any operation gets (host data, config), and their
        text in a key: computed once per host and config, as pyinfra's pop_global_arguments is costly."""
        config = ctx_config.get() if ctx_config.isset() else state.config
        memo = self.defaults.get(host)
        if memo is None or memo[0] is not config:
            arguments, _ = pop_global_arguments(state, host, {})
            defaults = {k: arguments[k] for k in KEYED if k in arguments}
            memo = self.defaults[host] = (config, defaults, repr(sorted(defaults.items())))
        return memo[1], memo[2]

    def drop(self, host, only: frozenset[str] | None = None) -> None:
        if only is None:
            self.answers.pop(host, None)
            return
        held = self.answers.get(host, {})
        for key in [key for key in held if key[0].__name__ in only]:
            del held[key]

    def watch(self, host, op_hash: str, make):
        """`make` (an operation's command generator) as one that drops answers around each command."""
        only = self.narrow.get(op_hash)

        def generator():
            for command in make():
                scope = None if isinstance(command, FunctionCommand) else only  # a function may do anything
                self.drop(host, scope)
                self.busy[host] = self.busy.get(host, 0) + 1
                try:
                    yield command
                finally:
                    self.busy[host] -= 1
                    self.drop(host, scope)

        generator.qwen27b_watched = True
        return generator


CLOCKS = frozenset({"server.Date"})  # the time now: a kept answer would be the plan's time


@lru_cache(maxsize=None)
def _command_signature(cls):
    """The signature of a fact's command() (self bound): inspect's getcallargs costs ~50 us a read."""
    return signature(cls().command)


def _cacheable(cls) -> bool:
    return (isinstance(cls, type) and issubclass(cls, FactBase) and not issubclass(cls, ShortFactBase)
            and cls.check_preconditions is FactBase.check_preconditions and cls.name not in CLOCKS)


def cache_of(state) -> FactCache | None:
    return runstate.of(state).fact_cache if state is not None else None


class _WatchOperations(BaseStateCallback):
    @staticmethod
    def operation_host_start(state, host, op_hash) -> None:
        cache = cache_of(state)
        data = state.ops.get(host, {}).get(op_hash)
        if cache is None or data is None or getattr(data.command_generator, "qwen27b_watched", False):
            return
        data.command_generator = cache.watch(host, op_hash, data.command_generator)


BOUND = stack_bound()


def fact_timeout(cls) -> int | None:
    """How long the controller waits for a read of `cls` (issue 52 item 2): a fact holding bounded GPU
    commands (`bounded_commands`, plan/gpubound.py) gets their bounds plus a margin; others none (a fact
    hashing 20 GiB of weights must not be cut short). Kept by this bound even where the host's process
    cannot be killed (a D-state nvidia-smi holds the output pipe open past timeout's KILL)."""
    commands = getattr(cls, "bounded_commands", 0)
    return controller_timeout(commands, BOUND) if commands else None


def _bounded(cls, kwargs: dict) -> dict:
    seconds = fact_timeout(cls)
    return kwargs if seconds is None or "_timeout" in kwargs else {**kwargs, "_timeout": seconds}


def install(state) -> FactCache:
    """Keep fact answers for this State's run (idempotent)."""
    run = runstate.of(state)
    if run.fact_cache is not None:
        return run.fact_cache
    cache = run.fact_cache = FactCache()
    state.add_callback_handler(_WatchOperations())
    for each in state.inventory:
        _hook(each)
    return cache


def _hook(host) -> None:
    if "get_fact" in vars(host):
        return
    original = type(host).get_fact.__get__(host)

    def get_fact(cls, *args, **kwargs):
        state = host.state
        cache = cache_of(state)
        if cache is None or cache.busy.get(host):
            return original(cls, *args, **_bounded(cls, kwargs))
        key = cache.key(state, host, cls, args, kwargs)  # before the bound: a bounded read is kept as any
        if key is None:
            return original(cls, *args, **_bounded(cls, kwargs))
        held = cache.answers.setdefault(host, {})
        if key in held:
            return copy.deepcopy(held[key])
        value = original(cls, *args, **_bounded(cls, kwargs))
        if host not in state.failed_hosts and not cache.busy.get(host):
            cache.answers.setdefault(host, {})[key] = copy.deepcopy(value)
        return value

    host.get_fact = get_fact  # pyinfra's Host has no __setattr__: an instance attribute


def changes_only(op, *facts: type) -> None:
    """Declare that `op`'s commands change only what these facts read: the others stay kept."""
    cache = cache_of(ctx_state.get())
    op_hash = getattr(op, "_hash", None)  # pyinfra's OperationMeta names its op by this hash
    if cache is not None and op_hash is not None:
        cache.narrow[op_hash] = frozenset(f.__name__ for f in facts)


def prefetch(reads: list[tuple[type, dict]], on=None) -> None:
    """Read these (fact, kwargs) in one remote command while planning; later reads are answered
    from the memo. Only speed depends on it: anything it cannot batch is read later, one by one."""
    state = ctx_state.get()
    target = on if isinstance(on, Host) else ctx_host.get()  # the Host itself, not pyinfra's context proxy
    cache = cache_of(state)
    if cache is None or state.current_stage != StateStage.Prepare or cache.busy.get(target):
        return
    held = cache.answers.setdefault(target, {})
    todo, seen = {}, set()
    for cls, kwargs in reads:
        key = cache.key(state, target, cls, (), kwargs)
        if key is None or key in held or key in seen or cls.shell_executable:
            continue
        seen.add(key)
        todo[f"f{len(todo)}"] = (cls(), kwargs, key)  # one instance: some facts' process() reads what command() kept
    if len(todo) < 2:
        return
    connector = dict(cache._defaults(state, target)[0])
    if list(connector.get("_success_exit_codes") or [0]) != [0]:
        return
    nonce = new_nonce()
    commands = {name: _fact_command(fact, kwargs) for name, (fact, kwargs, _) in todo.items()}
    text = script(commands, nonce, stdout_only=frozenset(commands), preamble=False)
    if not target.connected:
        target.connect(reason="to load facts", raise_exceptions=True)
    executor = {k: v for k, v in connector.items() if k in CONNECTOR_ARGUMENT_KEYS}
    bounds = [fact_timeout(type(fact)) or 0 for fact, _, _ in todo.values()]
    if any(bounds) and not executor.get("_timeout"):  # a wedged GPU: stop waiting, then read one by one (bounded);
        executor["_timeout"] = sum(bounds)  # each bound's margin covers the batch's unbounded reads (dpkg, apt-cache, du)
    try:
        ok, output = on_host(target, text, connector=executor, print_output=state.print_fact_output,
                             print_input=state.print_fact_input)
    except (TimeoutError, OSError, SSHException) as error:
        logger.debug("prefetch on %s failed (%s): reading one by one", target.name, error)
        return
    if not ok:
        return
    sections, codes = parse_script_output("\n".join(output.stdout_lines) + "\n", nonce, strip=False)
    for name, (fact, kwargs, key) in todo.items():
        if codes.get(name) != 0 or name not in sections:
            continue  # a failing read is left to pyinfra's own, which reports it
        value = _answer(fact, kwargs, _lines(sections[name]))
        if value is not _UNREAD:
            held[key] = copy.deepcopy(value)


def put_reads(dest: str, create_remote_dir: bool = True) -> list[tuple[type, dict]]:
    """What pyinfra's files.put reads for `dest` on a host that has it (for prefetch)."""
    from pyinfra.facts.files import Directory, File, Sha1File

    reads = [(File, {"path": dest}), (Sha1File, {"path": dest})]
    parent = posixpath.dirname(dest)
    return reads + ([(Directory, {"path": parent})] if create_remote_dir and parent else [])


def service_reads(service: str) -> list[tuple[type, dict]]:
    """What pyinfra's systemd.service(running=..., enabled=...) reads for a system unit (for prefetch)."""
    from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

    return [(fact, {"services": [service]}) for fact in (SystemdStatus, SystemdEnabled)]


_UNREAD = object()


def _fact_command(fact, kwargs: dict) -> str:
    command = fact.command(**kwargs) if callable(fact.command) else fact.command
    command = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
    needs = fact.requires_command(**kwargs)
    return guard(needs, command) if needs else command


def _lines(section: str) -> list[str]:
    """A section's text as pyinfra's connector splits stdout: one line per newline, the last
    newline ending the last line (not starting an empty one)."""
    if section == "":
        return []
    lines = section.split("\n")
    return lines[:-1] if section.endswith("\n") else lines


def _answer(fact, kwargs: dict, lines: list[str]):
    """What pyinfra's read returns for this output while planning, or _UNREAD."""
    if lines == [NOCMD] and fact.requires_command(**kwargs):
        return fact.default()  # the binary is absent: pyinfra returns the default while planning
    if not lines:
        return fact.default()
    try:
        return fact.process(lines)
    except Exception:  # noqa: BLE001 (pyinfra's own read logs it and fails the host)
        return _UNREAD

