"""Allow-lists for every stack value that reaches a shell command, a unit, an env file or a config
file on a host: one pattern per stack key, each with why it is that narrow. Checked on a host's
overrides before any host is touched (hostdata) and on the merged stack (stack.resolve_stack), so
stack.yaml itself is held to them too. The roles still quote every value where it is used
(shlex.quote, unitwords.systemd_quote, unitwords.env_value): the patterns are the first fence, not the only.

A key is named by its path in a profile ("vllm.version", "serve.env") or in a model entry
("model.revision", "draft.speculative.method").
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    pattern: str  # must match the whole value (re.fullmatch), ASCII only
    why: str  # where the value goes, hence the pattern
    example: str

    def ok(self, value) -> bool:
        return isinstance(value, str) and value.isascii() and re.fullmatch(self.pattern, value) is not None


_DEB = Rule(r"[a-z0-9][a-z0-9.+-]{0,99}", "an apt package name: apt-get's argv and the apt hold list", "nvidia-driver-580-server")
_WORD = Rule(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", "a vLLM flag value in the unit's ExecStart", "float16")
_SOURCE = Rule(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", "a source id cited in the plan", "vllm-39878")
_URL = Rule(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%+-]*)*",
            "a pip argument (index or wheel URL): https, plain path characters, no query, no userinfo",
            "https://download.pytorch.org/whl/cu128")
_CC = Rule(r"[0-9]{1,2}\.[0-9]", "a compute capability the gate compares as numbers", "7.0")
_TEXT = Rule(r"[ -~]{0,300}", "text shown in the plan only: printable ASCII, no newline", "a note")

STACK_RULES: dict[str, Rule] = {
    "description": _TEXT,
    "compute_capability.min": _CC,
    "compute_capability.max": _CC,
    "driver.package": _DEB,
    "driver.source": _SOURCE,
    "cuda.toolkit": Rule(r"[0-9]{1,2}\.[0-9]{1,2}", "the PATH line of /etc/profile.d/qwen27b-cuda.sh (sourced by login "
                         "shells), the service env's CUDA_HOME and the gate's major-version check", "12.8"),
    "cuda.why": _TEXT,
    "cuda.package": _DEB,
    "cuda.keyring_deb": Rule(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}\.deb", "a file name under /tmp in the download and in "
                             "`dpkg -i`", "cuda-keyring_1.1-1_all.deb"),
    "cuda.source": _SOURCE,
    "packages": _DEB,  # each item
    "python.version": Rule(r"3\.[0-9]{1,2}", "`python<version> -m venv`, `uv python install <version>`, uv --python",
                           "3.12"),
    "python.route": Rule(r"uv|system", "which Python install route the toolchain role takes", "uv"),
    "python.source": _SOURCE,
    "vllm.build": Rule(r"1cat|upstream|cpu", "a row of vllm_builds (what the gate checks kernels against)", "1cat"),
    "vllm.dist": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", "a pip requirement name `dist==version`", "vllm"),
    "vllm.version": Rule(r"[0-9]+(?:\.[0-9]+){0,3}(?:(?:a|b|rc|\.post|\.dev)[0-9]+)?(?:\+[A-Za-z0-9.]+)?",
                         "a PEP 440 version in `pip install dist==version` and the release hash", "1.5.0"),
    "vllm.filename": Rule(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,150}\.whl", "a wheel file name shown in the plan", "x-1.0-py3-none-any.whl"),
    "vllm.url": _URL,
    "vllm.sha256": Rule(r"[0-9a-fA-F]{64}", "the #sha256= fragment pip checks", "ab" * 32),
    "vllm.smoke_imports": Rule(r"[A-Za-z_][A-Za-z0-9_]{0,63}(?:\.[A-Za-z_][A-Za-z0-9_]{0,63})*",
                               "a module name inside the smoke test's `python -c 'import ...'`", "flash_attn_v100"),
    "vllm.source": _SOURCE,
    "torch.index_url": _URL,
    "torch.requirement": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?:(?:==|>=|<=|~=|!=|<|>)[0-9][0-9A-Za-z.*+]{0,30})?"
                              r"(?:,(?:==|>=|<=|~=|!=|<|>)[0-9][0-9A-Za-z.*+]{0,30}){0,3}",
                              "a pip requirement (name and version bounds, no spaces, no URL)", "torch>=2.8,<2.11"),
    "torch.required_arch": Rule(r"sm_[0-9]{2,3}a?", "a string literal inside the smoke test's `python -c`", "sm_70"),
    "torch.source": _SOURCE,
    # the planner sizes memory by them (checkpoint.DTYPE_BYTES): a name it does not know is refused
    "serve.dtype": Rule(r"auto|float16|bfloat16|float32", "--dtype in ExecStart, and the planner's bytes per value",
                        "float16"),
    "serve.attention_backend": _WORD,
    "serve.kv_cache_dtype": Rule(r"auto|float16|bfloat16|fp8|fp8_e5m2|fp8_e4m3", "--kv-cache-dtype in ExecStart, and "
                                 "the planner's KV bytes per token", "auto"),
    "serve.source": _SOURCE,
    "serve.kv_cache_source": _SOURCE,
    "require_hashes_source": _SOURCE,
    "model.files.source": _SOURCE,
    "serve.profile_source": _SOURCE,
    "speculative_auto": Rule(r"mtp|dflash2", "a speculative method the planner may pick (plan/engine.py)", "mtp"),
    "serve.headroom_source": _SOURCE,
    "serve.quiet_endpoints": Rule(r"/[A-Za-z0-9_/-]{0,63}", "a URL path in --disable-access-log-for-endpoints "
                                  "(joined with ',' in ExecStart)", "/health"),
    "serve.quiet_endpoints_source": _SOURCE,
    "serve.executor": Rule(r"uni|mp", "--distributed-executor-backend in ExecStart (the CPU profile only: "
                           "no profile a serving group can use has it)", "uni"),
    "serve.executor_source": _SOURCE,
    "serve.omp_threads_source": _SOURCE,
    "serve.liveness.source": _SOURCE,
    "serve.warmup.source": _SOURCE,
    "serve.regression.source": _SOURCE,
    # verify's measuring prompts (plan/regression.py): sent in a JSON request body only, never a shell or a file
    "serve.regression.prompts": Rule(r"[ -~]{1,2000}", "a prompt of verify's measuring set: printable ASCII, no newline",
                                     "Explain in three sentences why the sky is blue."),
    "serve.env": Rule(r"[A-Za-z0-9_.,:/@+=-]{0,200}", "an unquoted value in /etc/qwen27b/qwen27b.env "
                      "(systemd EnvironmentFile=): no quotes, spaces, $ or backslashes", "PCI_BUS_ID"),
    "model": Rule(r"[a-z0-9][a-z0-9.-]{0,63}", "a key of the stack's models table", "qwen3.8-27b-nvfp4"),
    "draft": Rule(r"[a-z0-9][a-z0-9.-]{0,63}", "a key of the stack's models table", "qwen3.8-27b-dflash2"),
    # model / draft entries
    "model.id": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}",
                     "`hf download <id>`, the model dir name and the unit's Description (no '..')",
                     "nvidia/Qwen3.8-27B-NVFP4"),
    "model.revision": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", "`hf download --revision`, the model dir name and "
                           "the prune `rm -rf` (a commit or a tag; no '..', no leading '-')", "0123abcd"),
    # ModelScope's id and revision (stack.on_source puts them in place of model.id / model.revision)
    "model.modelscope.id": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}",
                                "`modelscope download <id>`, then as model.id", "nvidia/Qwen3.8-27B-NVFP4"),
    "model.modelscope.revision": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", "`modelscope download --revision`, then as "
                                      "model.revision", "master"),
    "model.served_name": Rule(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}", "--served-model-name in the unit and the "
                              "health timer's ExecStart, unquoted", "qwen3.8-27b"),
    "model.format": _WORD,
    "model.metadata": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", "a folder under qwen27b/plan/checkpoints (no '/', no '..')",
                           "nvidia--Qwen3.8-27B-NVFP4"),
    "model.default_source": Rule(r"hub|mirror|controller", "one of the model sources", "hub"),
    "model.local_dir": Rule(r"[A-Za-z0-9_./~+-]{1,255}", "a controller path under the cache", "models/x"),
    "model.source": _TEXT,
    # the checkpoint's parser family: a key of the stack's agent_parsers table (plan/engine.py), whose
    # names reach the unit's ExecStart (checked there too)
    "model.agent_parsers": Rule(r"[a-z0-9_]{1,40}", "a key of the stack's agent_parsers table", "qwen3"),
    "model.agent_parsers_off": Rule(r"[a-z0-9][a-z0-9-]{0,63}", "a source id (the recorded reason the parsers stay off)",
                                    "cpu-parsers-recorded"),
    "model.speculative.method": _WORD,
    "model.speculative.draft_sample_method": _WORD,
    "model.speculative.kv_cache_dtype": _WORD,
}
# The draft's entry is a model entry too.
STACK_RULES.update({"draft." + k[len("model."):]: r for k, r in list(STACK_RULES.items()) if k.startswith("model.")})

# serve.env names: a shell/systemd variable name; never one the renderer sets itself (the route
# guard's PYTHONPATH, the offline switches, the GPU list), a loader hook or a secret (a 0644 file).
ENV_NAME = Rule(r"[A-Z_][A-Z0-9_]{0,63}", "a variable name in the service's env file", "VLLM_USE_V2_MODEL_RUNNER")
ENV_RESERVED = {"HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "QWEN27B_METRICS_ALLOW",
                "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONSTARTUP", "PYTHONHOME",
                # a serving group's (render_group.group_env): one value per member, from its host data
                "VLLM_HOST_IP", "VLLM_PORT", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "RAY_ADDRESS",
                "RAY_USAGE_STATS_ENABLED"}
SECRET_NAME = re.compile(r"KEY|TOKEN|PASSWORD|SECRET|CREDENTIAL", re.I)
# names whose value makes a process load or run code: vLLM's plugin entry points, a warning
# category (PYTHONWARNINGS imports its module), the shell's start-up file, the breakpoint hook,
# the dynamic loader's variables (LD_*)
CODE_LOADERS = {"VLLM_PLUGINS", "PYTHONWARNINGS", "BASH_ENV", "ENV", "PYTHONBREAKPOINT", "PYTHONINSPECT",
                "PYTHONEXECUTABLE", "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "PERL5OPT", "NODE_OPTIONS"}
# The serve.env names that pass (issue 51: a deny-list let GCONV_PATH, NCCL_NET_PLUGIN,
# NCCL_TUNER_PLUGIN, TRITON_LIBCUDA_PATH and VLLM_ALLOW_RUNTIME_LORA_UPDATING through, each a library
# loaded or a route opened). Tuning knobs only: none names a file to load, a directory to write or a
# route to open. Another one is added here, with its reason, never passed unseen.
ENV_ALLOWED = frozenset({
    # the profiles' own (stack.yaml serve.env, vllm_builds.*.env)
    "VLLM_USE_V2_MODEL_RUNNER", "CUDA_DEVICE_ORDER", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_SM70_DFLASH2_QUANT_LM_HEAD", "NCCL_P2P_DISABLE",
    # vLLM's engine and logging knobs
    "VLLM_ATTENTION_BACKEND", "VLLM_LOGGING_LEVEL", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENGINE_ITERATION_TIMEOUT_S",
    "VLLM_RPC_TIMEOUT", "VLLM_SLEEP_WHEN_IDLE", "VLLM_SKIP_P2P_CHECK", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "VLLM_LOG_STATS_INTERVAL", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_MARLIN_USE_ATOMIC_ADD", "VLLM_DISABLE_COMPILE_CACHE",
    # NCCL's transport and tuning (its plugins, NCCL_*_PLUGIN, load libraries: not here)
    "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE", "NCCL_DEBUG", "NCCL_CUMEM_ENABLE", "NCCL_ALGO", "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NVLS_ENABLE", "NCCL_IB_HCA", "NCCL_NET_GDR_LEVEL", "NCCL_BUFFSIZE",
    # CUDA, PyTorch and the thread pools
    "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "MAX_JOBS",
})

# Host data paths that land in a host-side config file or command.
MOK_KEY_PATH = Rule(r"/[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*", "a double-quoted line of DKMS's framework.conf "
                    "(sourced by DKMS's shell): an absolute path of plain characters", "/var/lib/shim-signed/mok/MOK.priv")
WHEELHOUSE_NAME = Rule(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", "the wheelhouse dir's name, part of the host path in "
                       "`pip install --find-links`", "vllm-0.32.0-cp311")
# A pinned vLLM flag's value, single-quoted by unitwords.systemd_quote in ExecStart: printable ASCII
# without the quote and backslash a single-quoted systemd word cannot hold the same way a shell reads it.
SERVE_FLAG_VALUE = Rule(r"[ -&(-\[\]-~]{0,1000}", "a value in the unit's ExecStart (single-quoted there)",
                        "hermes")


# A checkpoint file's pinned sha256 (models[].files.list.<name>.sha256, qwen27b/plan/filepins.py): the
# on-host check compares it and prints it; the file names themselves are held to filepins.NAME.
FILE_SHA256 = Rule(r"[0-9a-f]{64}", "a pinned sha256 the on-host check compares and prints", "0" * 64)


def rule_for(path: str) -> Rule | None:
    head, _, rest = path.partition(".files.list.")
    if head in ("model", "draft") and rest.endswith(".sha256"):
        return FILE_SHA256
    return STACK_RULES.get(path)


def problem(path: str, value) -> tuple[str, str] | None:
    """(problem, fix) when a stack value at `path` breaks its rule, else None. Lists are checked item
    by item; serve.env key by key; a value with no rule (numbers, switches) is left to the type check."""
    if path == "serve.env":
        if not isinstance(value, dict):
            return f"expected a dict of NAME: value, got {type(value).__name__}", "e.g. {'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'}"
        values = STACK_RULES["serve.env"]
        for name, item in value.items():
            if not ENV_NAME.ok(name):
                return f"{name!r} is not an environment variable name", f"use A-Z, 0-9 and _ only ({ENV_NAME.why})"
            if name in ENV_RESERVED:
                return f"{name} is set by qwen27b itself (or hooks the loader)", "leave it out"
            if name in CODE_LOADERS or name.startswith("LD_"):
                return f"{name} makes the service load or run other code", "leave it out"
            if SECRET_NAME.search(name):
                return (f"{name} looks like a secret: the env file is 0644",
                        "put the API key in qwen27b_api_key_file, the hub token in qwen27b_hf_token_file")
            if name not in ENV_ALLOWED:
                return (f"{name} is not one of the serve.env names qwen27b passes (tuning knobs that load no "
                        "code, write nowhere and open no route: qwen27b/plan/allowlist.py ENV_ALLOWED)",
                        "leave it out, or add it to ENV_ALLOWED with its reason (a systemd drop-in is the "
                        "lab's own way, outside qwen27b's checks)")
            number = isinstance(item, (int, float)) and not isinstance(item, bool)
            if not values.ok(str(item) if number else item):
                return (f"{name}={item!r} is not a plain value ({values.why})",
                        f"use letters, digits and _ . , : / @ + = - only, e.g. {values.example!r}")
        return None
    rule = rule_for(path)
    if rule is None or value is None:
        return None
    for item in value if isinstance(value, list) else [value]:
        if not rule.ok(item) or ".." in item or item.startswith("-"):
            return (f"{item!r} is not allowed here ({rule.why})",
                    f"use a value matching {rule.pattern}, e.g. {rule.example!r}")
    return None


def walk(tree: dict, prefix: str = ""):
    """(dotted path, leaf value) for every leaf of a nested dict (serve.env counts as one leaf)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path != "serve.env":
            yield from walk(value, path + ".")
        else:
            yield path, value
