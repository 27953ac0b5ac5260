"""Recorded hosts: pyinfra @fake hosts answering with real machines' command output.

    pyinfra inventory/recorded.py deploy.py --dry -y

shows, for each recorded machine, exactly what the deploy would do or why it refuses - without
touching anything. The recordings live in tests/fixtures/hosts/<name>/ (each has a README saying
which machine it stands for).
"""

from pathlib import Path

from tests.support.recorded import fake_responses

RECORDINGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hosts"


def _fake(name: str, recording: str | None = None, **data):
    """A recorded host; `recording` lets one recording stand for several machines of one kind. Each
    serves without a key unless it names one (`qwen27b_api_key_file: none`): the lab key the controller
    makes otherwise is random, and the converged recordings would have to hold its sha256."""
    return (f"@fake/{name}", {"fake_responses": fake_responses(RECORDINGS / (recording or name)), "fake_delay": 0,
                              "fake_delay_jitter": 0, "qwen27b_api_key_file": "none", **data})


# Two workstations with 2x V100 16 GB each, linked by 10 GbE, pooled for a 64k-token context that one
# of them cannot hold (qwen27b/plan/multinode.py: TP 2 within each, PP 2 across, vLLM's Ray backend).
PAIR = {"qwen27b_node_group": "pair-a", "qwen27b_node_interface": "enp65s0f0", "qwen27b_interconnect_gbps": 10,
        "qwen27b_serve_flags": {"--max-model-len": 65536}}

# Two copies of the model on one 4x V100 box, each TP 2 on its own GPUs and port (qwen27b/plan/instances.py).
COPIES = {"qwen27b_instances": [{"name": "a", "gpus": [0, 1], "port": 8000}, {"name": "b", "gpus": [2, 3], "port": 8001}]}


# An offline lab's mirrors: the wheels (`qwen27b mirror --wheels`) and a Hugging Face mirror (HF_ENDPOINT)
OFFLINE = {"qwen27b_hf_endpoint": "http://192.168.10.5:8090", "qwen27b_wheel_mirror": "http://192.168.10.5:8800/wheels/"}


recorded_hosts = [
    _fake("v100x4-2204-fresh"),
    _fake("v100x1-2004"),
    _fake("v100x2-16gb"),
    _fake("v100x2-mixed"),  # one 16 GB and one 32 GB V100: sized as two 16 GB cards (a long pinned context is refused naming the 32 GB one)
    _fake("v100x2-mixed-32gb-only", "v100x2-mixed", qwen27b_gpu_indices=[1]),  # that fix applied
    _fake("v100x4-converged"),
    _fake("t4x1-2204"),
    _fake("a100x2-2204"),
    _fake("nogpu-2204"),
    _fake("centos7"),
    _fake("v100x1-secureboot"),
    # ... with its MOK key imported, not yet enrolled (mokutil --list-new lists it): the reboot is the key's, at the console
    _fake("v100x1-secureboot-mok", qwen27b_mok_key_path="/var/lib/shim-signed/mok/MOK.priv"),
    _fake("h200"),
    _fake("h100"),  # a real H100 (2026-12-07): every fact from its raw bytes, escape codes in `topo -m` included
    _fake("h100-b"),  # a second machine of that image: every fact, the disk included, from one machine
    _fake("v100x1-open-loaded"),
    _fake("v100x2-open-unloaded", qwen27b_skip_reboot=True),
    _fake("v100x2-r470"),
    _fake("v100x2-r470-held"),  # the same with the old branch held: the replacement releases the hold
    _fake("v100x4-pg500"),
    _fake("v100x1-pg500"),  # one PG500-216, no driver: too small at 16 GB, so the driver first, the serving after
    _fake("v100x4-noheaders"),
    _fake("v100x4-wedged"),  # nvidia-smi never returns: the bounded fact reads stop, refused naming the hang and the fix
    _fake("v100x4-dkms-failed"),  # a failed R580 build (gcc 11 for a gcc-12 kernel): refused with the fix
    _fake("v100x4-newer-kernel"),
    _fake("v100x2-old-vllm"),
    _fake("v100x2-lab-unit"),  # the lab's own hand-written qwen27b.service (vLLM on 0.0.0.0:8000): refused naming it
    _fake("v100x2-lab-unit-take-over", "v100x2-lab-unit", qwen27b_take_over_unit=True),  # kept, stopped, deployed over
    _fake("v100x2-cuda-drivers"),  # R570 from NVIDIA's CUDA repository (cuda-drivers): the source change and every removal listed  # an old vLLM container on 0.0.0.0:8000 holding both GPUs: refused naming it  # a newer kernel installed, not booted: its headers come with the driver
    _fake("v100x4-converged-8g"),
    # issue 52: R580 upgraded in place by unattended-upgrades, the old module still loaded (the two-line mismatch)
    _fake("v100x2-r580-mismatch"),
    # issue 52: the non-server R580 from the graphics-drivers PPA, pinned, in unattended-upgrades' origins: kept, held, its source said
    _fake("v100x2-ppa-580"),
    _fake("v100x2-16gb-pair-head", "v100x2-16gb", qwen27b_node_role="head", qwen27b_node_address="10.10.0.1",
          qwen27b_bind_address="192.168.10.31", **PAIR),
    _fake("v100x2-16gb-pair-worker", "v100x2-16gb", qwen27b_node_role="worker", qwen27b_node_address="10.10.0.2",
          **PAIR),
    # the 4x V100 box served as two TP-2 copies (qwen27b_instances: qwen27b@a, qwen27b@b), fresh and converged
    _fake("v100x4-copies", "v100x4-2204-fresh", ssh_hostname="10.0.0.7", qwen27b_firewall_allow=["10.0.0.0/24"],
          **COPIES),
    _fake("v100x4-copies-converged", ssh_hostname="10.0.0.8", **COPIES),
    # the same box after copy b was dropped from the inventory: b's unit, health timer and files are removed
    _fake("v100x4-copies-drop-b", ssh_hostname="10.0.0.9", qwen27b_instances=COPIES["qwen27b_instances"][:1]),
    # and a box that served the two copies, back to one service: both copies and their template removed first
    _fake("v100x4-copies-to-one", ssh_hostname="10.0.0.10"),
    # GPU links decide the all-reduce per TP group (qwen27b/plan/topology.py): PCIe pairs, PCIe across
    # sockets without P2P, a DGX-1 hybrid cube mesh, and a 3090 + V100-SXM2 pair box served on the pair
    _fake("v100x2-pcie"),
    _fake("v100x4-pcie"),
    _fake("v100x8-sxm2-dgx1"),
    _fake("mixed-3090-v100x2", qwen27b_gpu_indices=[1, 2]),
    # the TP group and the copies picked by their links: TP 2 of DGX-1 GPUs 0,5,6,7 (0 reaches the
    # others over SYS: 5,6 on NVLink), and one copy of 2 GPUs on the 3090 + V100 pair box (the NV6 pair)
    _fake("v100x8-dgx1-tp2-of-4", "v100x8-sxm2-dgx1", qwen27b_gpu_indices=[0, 5, 6, 7], qwen27b_tensor_parallel_size=2),
    _fake("mixed-3090-v100x2-copy", "mixed-3090-v100x2", qwen27b_instances=[{"name": "a", "gpus": 2, "port": 8000}]),
    # models on the big disk (issue 52 item 4): /var too small for the checkpoint (refused, the fix names
    # qwen27b_models_dir), and the same box with the models dir on /data
    _fake("v100x4-small-var"),
    _fake("v100x4-data-disk", qwen27b_models_dir="/data/qwen27b/models"),
    # four TP-2 copies by count on the DGX-1 (issue 52 item 6): its four NV2 pairs, 8 NVLinks, not 0-1 NV1 + ...: 6
    _fake("v100x8-dgx1-copies-4x2", "v100x8-sxm2-dgx1",
          qwen27b_instances=[{"name": n, "gpus": 2, "port": 8000 + i} for i, n in enumerate("abcd")]),
    # used cards (issue 27, qwen27b/plan/gpuwear.py): a GPU left out (repeated Xid 79, link at x4), a warning
    # naming the GPU, a host refused (every GPU worn), a converged host with persistence off, a power cap
    _fake("v100x4-wear-xid79"),
    _fake("v100x4-wear-warn"),
    _fake("v100x2-pcie-worn"),
    _fake("v100x4-converged-nopm"),
    _fake("v100x4-power-cap", "v100x4-converged-nopm", qwen27b_power_limit_w={1: 250, 3: 275}, qwen27b_ecc="on"),
    # sources a lab can reach (issue 30, qwen27b/plan/sources.py): the 20.04 host offline with wheel and
    # model mirrors but no Python mirror (uv would fetch Python from GitHub: warned), with one, and a lab
    # using a GitHub release mirror, an HF_ENDPOINT mirror and its own PyPI and PyTorch indexes
    _fake("v100x1-2004-offline", "v100x1-2004", **OFFLINE),
    _fake("v100x1-2004-offline-pymirror", "v100x1-2004", qwen27b_python_mirror="http://192.168.10.5:8800/python",
          **OFFLINE),
    _fake("v100x1-2004-lab-sources", "v100x1-2004", qwen27b_release_mirror="https://gh.mirror.lab/",
          qwen27b_hf_endpoint="https://hf-mirror.lab", qwen27b_pypi_index="https://pypi.mirror.lab/simple/",
          qwen27b_torch_index="https://pypi.mirror.lab/whl/cu128"),
    # ... and a lab that takes its checkpoint from ModelScope (a mirror of it on the lab network): the
    # ModelScope ids and revisions, the `modelscope` client pinned into the release venv
    _fake("v100x1-2004-modelscope", "v100x1-2004", qwen27b_model_source="modelscope",
          qwen27b_modelscope_endpoint="http://192.168.10.5:8900"),
    # ... and the CPU build from the lab's PyPI mirror (its torch+cpu too: a simple index made from the
    # wheelhouse, as the e2e serves it), the checkpoint from ModelScope's
    _fake("debian12-cpu-lab-index", "debian12-cpu", qwen27b_profile="cpu-smoke",
          qwen27b_pypi_index="http://192.168.10.5:8800/simple/", qwen27b_model_source="modelscope",
          qwen27b_modelscope_endpoint="http://192.168.10.5:8900"),
    # ... and the offline host with every source in the lab, apt too (the mirror's login goes to apt_auth.conf, 0600)
    _fake("v100x1-2004-offline-apt", "v100x1-2004", qwen27b_apt_mirror="http://apt:lab-apt-pw@192.168.10.5:8800/",
          qwen27b_python_mirror="http://192.168.10.5:8800/python", **OFFLINE),
]
