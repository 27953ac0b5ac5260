"""Every qwen27b_* key a host's data may hold, as the Settings dataclass (field name = key minus
'qwen27b_'), the gateway's keys, and BadHostData, the refusal that names host, key and fix. A module
of its own (issue 50 item 3, cut from hostdata.py) so the checks beside it (addresses, urlsecret,
copykeys, nodekeys) and hostdata.settings_for share them without an import circle."""

from __future__ import annotations

from dataclasses import dataclass, fields


class BadHostData(ValueError):
    """Inventory data that cannot be deployed; str() names host, key and fix."""

    def __init__(self, host: str, key: str, problem: str, fix: str):
        self.host, self.key, self.problem, self.fix = host, key, problem, fix
        super().__init__(f"{host}: {key}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class Settings:
    """One host's validated qwen27b data (the field name is the inventory key minus 'qwen27b_')."""

    profile: str | None = None  # None: chosen from the GPUs; "cpu-smoke" for the CPU profile
    # a name of the stack's engine profile catalog (plan/catalog.py); None: the generation's default
    engine_profile: str | None = None
    stack_overrides: dict | None = None  # merged into the stack profile (see stack.resolve_stack)
    tensor_parallel_size: int | None = None  # None: all (visible) GPUs
    gpu_indices: list | None = None  # None: every GPU; else CUDA_VISIBLE_DEVICES
    port: int = 8000  # the OpenAI API's port on the host
    bind_address: str | None = None  # None: the host's lab address when known, else 127.0.0.1
    served_model_name: str | None = None  # None: the stack model's served_name
    # controller-side file holding the API key (mode 0600); left out: the lab key the controller makes
    # (controller/apikey.py); "none": an open API, by choice
    api_key_file: str | None = None
    serve_flags: dict | None = None  # pinned vllm serve flags, e.g. {"--max-model-len": 4096}
    # auto | mtp | dflash2 | off (True/False: auto/off, the older spelling): plan/engine.py picks
    # the method and depth from the stack's evidence
    speculative: bool | str = "auto"
    model: str | None = None  # a key of the stack's models table to serve; None: the profile's own
    # --reasoning-parser / --enable-auto-tool-choice --tool-call-parser (plan/engine.py agent_parsers):
    # None: on where the checkpoint's family and the build have them; False: off; True: on or refused
    agent_parsers: bool | None = None
    prefix_caching: bool = True  # vLLM's automatic prefix caching (--enable-prefix-caching)
    skip_reboot: bool = False  # never reboot this host; the plan says a reboot is pending
    mok_key_path: str | None = None  # MOK signing key for secure boot hosts
    hold_kernel: bool = False  # apt-mark hold the running kernel too
    min_free_disk_gib: int = 10  # headroom beyond the weights on the model disk
    # the model revisions' dir on a big disk (/data/qwen27b/models where /var is small; plan/modelsdir.py)
    models_dir: str | None = None
    health_interval_s: int = 30  # how often qwen27b-health.timer runs the health check
    health_failures_before_restart: int = 3  # consecutive critical checks before the (rate-limited) restart
    python_mirror: str | None = None  # UV_PYTHON_INSTALL_MIRROR for air-gapped labs
    # Sources a lab can reach (issue 30, qwen27b/plan/sources.py): a base URL standing for https://github.com/
    # (the engine wheel, uv's Python builds), an HF_ENDPOINT for `hf download`, uv's default index and torch's

    release_mirror: str | None = None  # a base URL standing for https://github.com/ (the engine wheel, uv's Python builds)
    hf_endpoint: str | None = None  # an HF_ENDPOINT mirror for `hf download`
    modelscope_endpoint: str | None = None  # MODELSCOPE_ENDPOINT for `modelscope download` (model_source modelscope)
    pypi_index: str | None = None  # uv's default index instead of pypi.org
    torch_index: str | None = None  # the torch wheels' index instead of download.pytorch.org
    # a base URL standing for archive.ubuntu.com and developer.download.nvidia.com: apt reads only it
    apt_mirror: str | None = None
    wheelhouse_dir: str | None = None  # controller dir with the vLLM build's wheels + manifest.json
    require_hashes: bool | None = None  # refuse any artifact the stack does not pin by sha256 (the gate names each); None: the profile's default (filepins.hash_policy)
    wheel_mirror: str | None = None  # a lab mirror holding every wheel (uv --no-index --find-links) when no wheelhouse is pushed
    model_source: str | None = None  # hub | mirror | controller; None: the stack model's default_source
    model_mirror: str | None = None  # base URL of a lab mirror holding <id>@<revision>/ with manifest.json
    model_local_dir: str | None = None  # controller dir holding the checkpoint (model_source controller)
    draft_local_dir: str | None = None  # controller dir holding the DFlash2 draft
    hf_token_file: str | None = None  # controller file (0600) with a Hugging Face token
    http_proxy: str | None = None  # every fetch the host makes: apt, uv/pip, hf download, the Python download, qwen27b-fetch
    keep_model_revisions: int = 1  # old revisions kept for rollback
    keep_releases: int = 1  # old release dirs (~3.5 GB each) kept besides the current one; the previous always stays
    # a release verify measured worse than the one it replaced (plan/regression.py, the stack's serve.regression
    # limits) is rolled back at once, as a failed verify is; off: reported, and `qwen27b rollout` stops there
    rollback_on_regression: bool = False
    dflash_cli: bool = False  # also install PyPI's `dflash` CLI (benchmarks against the server)
    firewall_allow: list | None = None  # networks allowed to reach the port (nftables); None: no rule
    metrics_allow: list | None = None  # scrapers: /metrics without the key, the health endpoint, node_exporter
    # a lab's own unit on qwen27b's unit names (not rendered by qwen27b): kept, stopped and disabled by the deploy,
    # put back by rollback / uninstall (plan/foreignunit.py); unset, the host is refused naming it
    take_over_unit: bool = False
    node_exporter: bool = False  # install Debian/Ubuntu's prometheus-node-exporter (textfile dir for qwen27b.prom)
    health_port: int = 9120  # the health verdict over HTTP (qwen27b-health-http.socket), on the bind address
    # none | tree: with model_source mirror, one host fetches from the mirror and hosts holding a
    # verified copy seed the others in waves (1 -> 2 -> 4 ...): 1x the model over the WAN (qwen27b/plan/fanout.py)
    weights_fanout: str = "none"
    # Multi-node serving (qwen27b/plan/multinode.py): hosts naming the same group serve one model
    # together when it does not fit one of them (TP within a host, PP across the hosts, vLLM's Ray backend)

    # the serving group this host belongs to (docs/scale-out.md)
    node_group: str | None = None  # e.g. "pair-a"; every member names it
    node_role: str | None = None  # "head" (runs the API and the Ray head) or "worker"; one head per group
    node_address: str | None = None  # this host's address on the link between the members; default ssh_hostname
    node_interface: str | None = None  # the NIC of that link (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    interconnect_gbps: float | None = None  # the link's speed in Gbit/s (10 for 10 GbE): the planner checks it
    # several copies on one machine (qwen27b/plan/instances.py): [{name, gpus, port, api_key_file?}, ...]
    instances: list | None = None
    # used cards (issue 27, plan/gpuwear.py): a power cap set at boot by qwen27b-gpu-power.service, watts
    # for every GPU or {nvidia-smi index: watts}; checked against each card's range; None: left as found
    power_limit_w: int | dict | None = None
    ecc: str | None = None  # "on": nvidia-smi -e 1 where ECC is off (after a reboot); None: left as found
    # uninstall.py only (pyinfra INVENTORY uninstall.py --data qwen27b_uninstall_weights=true): what else goes

    uninstall_weights: bool = False  # the model revisions under /var/lib/qwen27b/models (20+ GiB) too
    uninstall_driver: bool = False  # unhold and purge the NVIDIA driver packages, remove the nouveau blacklist
    uninstall_chat_data: bool = False  # a gateway's chat page: its users and chats too

    @property
    def speculative_mode(self) -> str:
        """qwen27b_speculative as one of SPECULATIVE_MODES (True/False are auto/off)."""
        if isinstance(self.speculative, bool):
            return "auto" if self.speculative else "off"
        return self.speculative


# Keys read on the gateway hosts only (the qwen27b_gateway group): their meaning and the checks
# across hosts are in qwen27b/plan/gateway.py; typed here like every other key.
GATEWAY_TYPES: dict[str, tuple[type, ...]] = {
    "gateway_port": (int,),  # where clients reach the lab's one OpenAI endpoint (default 8000)
    "gateway_bind_address": (str,),  # None: the gateway host's lab address
    "gateway_key_files": (list,),  # controller-side 0600 key files, or {file, name, requests_per_minute, concurrent} (required)
    "gateway_backends": (list,),  # inventory host names; None: every host outside the gateway group
    "gateway_request_timeout_s": (int,),  # longest request; also bounds a drain's wait
    "gateway_metrics_allow": (list,),  # networks whose Prometheus may read the usage per key (:9121)
    "gateway_tls_cert": (str,),  # controller-side PEM certificate (chain) for TLS; with gateway_tls_key
    "gateway_tls_key": (str,),  # controller-side 0600 PEM private key of that certificate
    "gateway_tls_lab_ca": (str,),  # controller-side dir of a lab CA made and kept by qwen27b (instead of the two above)
    "gateway_fair_share": (bool,),  # default true: with 2+ keys, no key holds every slot of the pool
    "gateway_log_bodies": (bool,),  # default false: the request log keeps prompts and answers (privacy!)
    # the chat page on the gateway host (qwen27b/plan/chatpage.py)

    "chat_page": (bool,),  # default false: Open WebUI behind the gateway's nginx
    "chat_page_port": (int,),  # on the gateway's address (default 8080)
    "chat_page_admin_email": (str,),  # the admin account the deploy makes (default admin@qwen27b.lab)
    "chat_page_accounts": (dict,),  # {page account e-mail: gateway key name}
}


PREFIX = "qwen27b_"


OPEN_API = "none"  # qwen27b_api_key_file: none, the explicit choice of an API without a key


GATEWAY_KEYS = [PREFIX + name for name in GATEWAY_TYPES]


KEYS = [PREFIX + f.name for f in fields(Settings)] + GATEWAY_KEYS


NODE_EXPORTER_PORT = 9100  # prometheus-node-exporter's default (--web.listen-address=:9100), left as is


NODE_EXPORTER_UNIT = "prometheus-node-exporter.service"  # Debian's and Ubuntu's name for it
