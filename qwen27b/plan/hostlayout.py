"""Where a deploy puts things on a host (issue 31): one frozen object made from the stack's `paths`
(`ResolvedStack.layout`), holding them and every path derived from them, so that a file's place is
written once: the roles, the unit templates' context, the rollback, the uninstall, doctor and status
ask it. A leaf of plan/ (no imports from its siblings): stack.py builds it."""

from __future__ import annotations

from dataclasses import dataclass, fields

UNIT_DIR = "/etc/systemd/system"  # systemd's, where every unit file of the deploy goes
RECORD_NAME = "release.json"  # in config (the running release's) and in the rollback dir (the kept one)
ROLLBACK_SUBDIR = "rollback"
TAKEOVER_SUBDIR = "takeover"  # in state: a lab's own unit taken over (plan/foreignunit.py)


def revision_dir_name(entry: dict) -> str:
    """The directory a model revision lives in under paths.models: 'org--name@revision'."""
    return f"{entry['id'].replace('/', '--')}@{entry['revision']}"


def with_models_dir(paths: dict, models_dir: str | None) -> dict:
    """The stack's `paths` with host data's models dir (qwen27b_models_dir, checked by
    plan/modelsdir.py) and the `current` link in it; unchanged without one."""
    if not models_dir or models_dir == paths["models"]:
        return paths
    current = paths["current_model"].rsplit("/", 1)[-1]
    return {**paths, "models": models_dir, "current_model": f"{models_dir}/{current}"}


@dataclass(frozen=True)
class HostLayout:
    """The stack's `paths` (stack.yaml), as fields, and the places derived from them."""

    root: str
    releases: str
    current_release: str
    state: str
    models: str
    current_model: str
    cache: str
    config: str
    bin: str
    python: str
    host_cache: str
    wheelhouse: str
    service_user: str  # the account the service runs as, named beside its paths in the stack

    @classmethod
    def of(cls, paths: dict) -> HostLayout:
        return cls(**{field.name: paths[field.name] for field in fields(cls)})

    # --- the running release, through its symlink ----------------------------------------------
    @property
    def current_venv(self) -> str:
        return f"{self.current_release}/venv"

    # --- files in config -------------------------------------------------------------------------
    @property
    def env_file(self) -> str:
        """The service's env file (qwen27b.env): rendered by the service role, kept for rollback."""
        return f"{self.config}/qwen27b.env"

    @property
    def api_key_env_file(self) -> str:
        """The unit's 0600 VLLM_API_KEY env file: written by the service role, read by systemd
        (EnvironmentFile=) and by doctor's keyed /metrics read."""
        return f"{self.config}/api-key.env"

    @property
    def url_env_file(self) -> str:
        """The root-only env file holding the URLs with a password (roles/_common.URL_VARS)."""
        return f"{self.config}/urls.env"

    @property
    def release_record(self) -> str:
        """The running release's record (plan/lifecycle.Record)."""
        return f"{self.config}/{RECORD_NAME}"

    @property
    def takeover_dir(self) -> str:
        """A lab's own unit taken over (qwen27b_take_over_unit, plan/foreignunit.py): its copy, its env
        file's, restore.sh (root-only)."""
        return f"{self.state}/{TAKEOVER_SUBDIR}"

    @property
    def rollback_dir(self) -> str:
        """The running release's unit, env and record, kept while a deploy replaces them (the verify
        role's automatic rollback and the on-demand one restore from here)."""
        return f"{self.config}/{ROLLBACK_SUBDIR}"

    @property
    def draft_link(self) -> str:
        """The draft checkpoint's symlink beside the served model's (DFlash2)."""
        return f"{self.models}/draft"

    @property
    def firewall_rules(self) -> str:
        """The firewall role's nftables rule file."""
        return f"{self.config}/firewall.nft"

    def instance_env_file(self, name: str) -> str:
        """A copy's env file (qwen27b_instances), beside the service's; name may be systemd's %i."""
        return f"{self.config}/qwen27b@{name}.env"

    def instance_api_key_env_file(self, name: str) -> str:
        return f"{self.config}/qwen27b@{name}-api-key.env"

    @property
    def hub_token_file(self) -> str:
        """The hub token, on the host only between its upload and the download (docs/security.md)."""
        return f"{self.config}/hf-token"

    @property
    def seed_token_file(self) -> str:
        """The fan-out's seed token (weights role), and the part file it is written through."""
        return f"{self.config}/seed.token"

    @property
    def seed_token_part(self) -> str:
        return f"{self.config}/.seed.token.part"

    # --- files in state ------------------------------------------------------------------------
    @property
    def health_status(self) -> str:
        """The health check's JSON status file (qwen27b-health --status-file): written by the timer's
        check, read by the verify role and `qwen27b status`."""
        return f"{self.state}/health.json"

    def copy_health_status(self, copy: str) -> str:
        """A copy's own status file (qwen27b_instances): health@NAME.json."""
        return f"{self.state}/health@{copy}.json"

    @property
    def restart_request(self) -> str:
        """Left by the health check for the health unit's root ExecStopPost to restart the service."""
        return f"{self.state}/health-restart.request"

    def copy_restart_request(self, copy: str) -> str:
        """A copy's own restart request (qwen27b_instances)."""
        return f"{self.state}/health-restart@{copy}.request"

    # --- tools, releases, models, units --------------------------------------------------------
    @property
    def uv(self) -> str:
        """The uv binary on the host (the vllm role installs with it; uv's Python route needs it)."""
        return f"{self.bin}/uv"

    def release_dir(self, stack_hash: str) -> str:
        return f"{self.releases}/{stack_hash}"

    def release_venv(self, stack_hash: str) -> str:
        return f"{self.release_dir(stack_hash)}/venv"

    def mirror_manifest(self, name: str) -> str:
        """A checkpoint's manifest pushed for qwen27b-fetch (name: its revision dir's)."""
        return f"{self.host_cache}/{name}.manifest.json"

    def pins_file(self, name: str) -> str:
        """A checkpoint's pinned sha256 pushed for qwen27b_onhost.pincheck (name: its revision dir's)."""
        return f"{self.host_cache}/{name}.pins.json"

    def model_dir(self, entry: dict) -> str:
        """A model revision's versioned directory (the weights role fills it, the service links it)."""
        return f"{self.models}/{revision_dir_name(entry)}"

    @staticmethod
    def unit_file(unit: str) -> str:
        return f"{UNIT_DIR}/{unit}"
