"""`qwen27b doctor`: the seed article's troubleshooting chain (section 6.2), automated.

    qwen27b doctor INVENTORY [--limit NAME ...] [--json] [--save DIR] [--timeout S] [--parallel N]
    qwen27b doctor --replay DIR [--json]

Per host, in the seed's order, each step a set of checks with a verdict (ok / warn / fail /
skip), the evidence and the fix:

  1. symptom      does the service start; did it fail at load or at inference (the unit's state,
                  its journal split into runs by systemd's invocation id, the failure placed
                  before or after vLLM's "Application startup complete"), /health. Only the
                  current invocation is judged, with the runs systemd restarted automatically
                  into it; failures before the last deliberate start are history (info)
  2. inputs       the model path (`models/current` resolves, config.json parses), the weights
                  format actually there (quantization_config / hf_quant_config.json) against the
                  stack's, the DFlash2 draft, prompt lengths against --max-model-len
  3. environment  driver (proprietary vs open on Volta, nvidia-smi), Xids, CUDA (driver vs torch
                  runtime), torch version and arch list in the release venv, the vLLM build, Docker
  4. parameters   the running `vllm serve` flags (ExecStart, drop-ins included) against what the
                  planner chooses now (qwen27b.plan.gate.decide on facts read the way the preflight
                  reads them), whether the running sizes fit at all (the planner with them pinned),
                  KV cache usage and preemptions from /metrics
  5. tool limits  the quantization the build supports on this GPU (stack `vllm_builds`) and the
                  stack's `known_bugs` table, matched by installed version and symptom

A failure found in the journal is attributed to the step that owns its cause (a corrupt
config.json to step 2, "Minimum capability: 75" to step 3, "CUDA out of memory" to step 4...):
step 1 reports the symptom, and the headline names the first failing *cause* step in chain
order (2..5), or step 1 when none explains the symptom.

A host serving copies (qwen27b_instances: qwen27b@NAME.service each) is judged copy by copy: the
whole chain on each copy's unit, journal, env file (its flags and GPUs), /health and /metrics, a
report per copy under its name (Report.copies); the model, venv and facts are the host's.

Design: collecting and judging are separate. `collect()` (collection.py) reads every host at
once through pyinfra's own connectors, the inventory loaded as the deploy loads it
(qwen27b.controller.remote: ssh_port / ssh_user / ssh_key / ssh_password / paramiko settings,
_sudo, @local, @fake), one shell script per phase over one connection, and returns a
`HostSnapshot` (model.py: command outputs by key); `diagnose()` (diagnosis.py) is a pure function
of a snapshot, the stack file and the host's inventory data: parse.py and journal.py parse,
context.py holds what every step reads, diagnose_<step>.py judge one step each, so every verdict
is unit-tested from recorded snapshots (tests/fixtures/journals/). output.py prints the table,
cli.py is `main(argv)`. Nothing here changes a host.
"""

from .cli import main
from .collection import collect
from .diagnosis import diagnose
from .model import FAIL, INFO, OK, SKIP, STEPS, WARN, Check, HostSnapshot, Report
from .output import table
from .parse import exec_argv

__all__ = ["FAIL", "INFO", "OK", "SKIP", "STEPS", "WARN", "Check", "HostSnapshot", "Report", "collect", "diagnose",
           "exec_argv", "main", "table"]
