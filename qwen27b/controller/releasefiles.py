"""What a release runs by on a host besides its symlinks (issue 56): the files a deploy keeps in the
rollback dir before it replaces them and a rollback restores, so that whatever is per release comes
back with it. docs/lifecycle.md ("What a rollback restores") lists every per-release value and where
it lives: in the release dir (carried by the link switch), in these files (kept and restored), or
host-wide (not per release: stays as the last deploy set it)."""

from __future__ import annotations

from qwen27b.controller.render_copies import INSTANCE_UNIT, copy_health_units, instance_files
from qwen27b.onhost.contract import HEALTH_UNIT, SERVICE_UNIT
from qwen27b.plan.hostlayout import HostLayout


def serving_files(paths: dict) -> list[str]:
    """One service's: the env file, the main unit, its health check's unit (the model label of
    qwen27b_build_info, the served name, the speculative method) and the release record
    (qwen27b.plan.lifecycle), the record last. Kept aside before a deploy replaces them, restored on
    rollback."""
    at = HostLayout.of(paths)
    return [at.env_file, at.unit_file(SERVICE_UNIT), *kept_health_units(), at.release_record]


def copies_serving_files(paths: dict, names: list[str]) -> list[str]:
    """serving_files of a host serving copies: each copy's env file, the templated unit, each copy's
    health check unit and the release record (last, as serving_files has it). Their names in the
    rollback dir are distinct."""
    return ([instance_files(paths, name)["env_file"] for name in names] + [HostLayout.unit_file(INSTANCE_UNIT)]
            + kept_health_units(names) + [HostLayout.of(paths).release_record])


def kept_health_units(names: list[str] | None = None) -> list[str]:
    """The health checks' unit files among the serving files (one service's, or each copy's when
    `names`). A rollback dir kept by a qwen27b before issue 56 lacks them: the rollback restores them
    where they were kept and says it leaves them otherwise (lifecycle.plan_rollback's `optional`)."""
    return ([HostLayout.unit_file(copy_health_units(name)[0]) for name in names] if names is not None
            else [HostLayout.unit_file(HEALTH_UNIT)])
