"""What one deploy run remembers between its roles and hosts, owned by the run's pyinfra State.

pyinfra runs the deploy file once per host in one process; the roles share answers across hosts
(the validated inventory, each host's gate decision, the mirror's manifest, the fan-out plan, the
run's seed token) and per host (notes, restart triggers, rollback targets, verify results). They
live on the State object itself, so a second State in the same process (a test, an API user)
starts empty and can never read a stale answer; nothing is keyed by id(), which Python reuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ATTRIBUTE = "_qwen27b_run"


@dataclass
class RunState:
    settings: dict | None = None  # host name -> hostdata.Settings, validated once for the whole inventory
    lab_key: tuple | None = None  # (file, how to use it) of the key made for hosts that name none (apikey.py)
    decisions: dict = field(default_factory=dict)  # host name -> gate.Decision | gate.RefusedHost
    venv_read: set = field(default_factory=set)  # hosts whose plan rows took their release venv's wheels (once)
    refused: dict[str, str] = field(default_factory=dict)  # host name -> cause, for the run summary
    unreachable: dict[str, str] = field(default_factory=dict)  # host name -> its SSH error, one line
    raised: dict[str, str] = field(default_factory=dict)  # host name -> what planning raised
    unverified: dict[str, str] = field(default_factory=dict)  # host name -> why verify cannot reach its service
    interrupted_at: dict[str, str] = field(default_factory=dict)  # host name -> the operation Ctrl-C stopped
    notes: dict[str, list[str]] = field(default_factory=dict)  # host name -> plan notes, printed as one block
    restart_ops: dict[str, list] = field(default_factory=dict)  # host name -> (what, operation) whose change restarts
    serving_changes: dict[str, dict] = field(default_factory=dict)  # host name -> unit -> what its restart changes (roles/service.py; verify's check)
    previous: dict[str, list] = field(default_factory=dict)  # host name -> what its rollback undoes (roles/_common)
    results: list = field(default_factory=list)  # postdeploy.HostResult of each verified host
    carried: dict[str, tuple] = field(default_factory=dict)  # host name -> the release record's attempts its flags came from (plan/retry.py carry_over)
    manifests: dict[str, dict] = field(default_factory=dict)  # mirror base URL -> its manifest
    fanout_plans: dict[tuple[str, str], object] = field(default_factory=dict)  # (base, target) -> FanoutPlan
    seed_token: str | None = None  # the fan-out seeds' bearer token, made once per run
    progress: dict = field(default_factory=dict)  # (host name, op hash) -> progress.Probe: drawn while it runs
    outside_seeds: set = field(default_factory=set)  # (host, stopped?) of seeds outside --limit handled this run
    planned: set = field(default_factory=set)  # hosts whose deploy file ran to its end (its plan printed)
    aborted: set = field(default_factory=set)  # hosts whose deploy file raised (a bug): pyinfra stops the run
    reach: dict = field(default_factory=dict)  # host name -> reachprobe.Row list, probed on --dry (reachprobe.dry_reach)
    driver_first: set = field(default_factory=set)  # hosts whose run installs the driver only: re-run after its reboot
    upload_errors: dict = field(default_factory=dict)  # (host name, op hash) -> why an upload raised (operations.CheckedUpload)
    before_switch: dict = field(default_factory=dict)  # host name -> the serving release measured before its restart (controller/pairmeasure.py)
    fact_cache: object | None = None  # factcache.FactCache: fact answers kept while nothing changes a host


def of(state) -> RunState:
    """The run state hung on `state` (created on first use)."""
    run = getattr(state, ATTRIBUTE, None)
    if run is None:
        run = RunState()
        setattr(state, ATTRIBUTE, run)
    return run


def current() -> RunState:
    """The run state of the State pyinfra is running now."""
    from pyinfra.context import ctx_state

    return of(ctx_state.get())
