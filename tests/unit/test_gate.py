"""The compatibility gate on facts parsed from recorded machines (and variations of them).

The V100 recordings are hand-written in the real command formats (see each host's README);
the gate itself is pure, so these tests run no pyinfra and touch no host.
"""

import json

import pytest

from qwen27b.controller import facts as F
from qwen27b.plan.gate import decide
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.stack import load_stack
from recordings import recorded_facts
from tests.support.paths import TESTS
from tests.support.gate_run import STACK, refused, run


def test_fresh_22_04_with_4_v100s_gets_the_volta_stack():
    d = run("v100x4-2204-fresh")
    assert d.profile == "sm70" and len(d.gpus) == 4
    assert d.choice("driver").value == "nvidia-driver-580-server" and d.choice("driver").action == "install"
    # 1Cat 1.5.1 builds its TileLang kernels at first use: the 12.8 toolkit's compiler is installed
    assert d.choice("cuda").value == "cuda-toolkit-12-8" and d.choice("cuda").action == "install"
    assert "TileLang" in d.choice("cuda").reason and "1cat-release-151]" in d.choice("cuda").reason
    assert d.choice("python").value == "3.12" and d.choice("python").action == "install"
    assert d.choice("vllm").value == "1cat_vllm==1.5.1"
    assert not any("has no sha256" in w for w in d.warnings), d.warnings
    assert d.serve.value("--dtype") == "float16" and d.serve.value("--attention-backend") == "FLASH_ATTN_V100"
    assert d.serve.value("--tensor-parallel-size") == "4" and d.serve.has("--speculative-config")
    assert any("nouveau is loaded" in w for w in d.warnings)


def test_converged_host_keeps_driver_and_python():
    d = run("v100x4-converged")
    assert d.choice("driver").action == "keep" and d.choice("python").action == "keep"
    assert not any("PCIe" in w or "Xid" in w for w in d.warnings)


def test_a100_gets_upstream_vllm_and_t4_is_too_small():
    d = run("a100x2-2204")
    assert d.profile == "sm75plus" and d.choice("vllm").value == "vllm==0.32.0"
    assert not d.serve.has("--attention-backend") and d.serve.value("--dtype") == "auto"
    assert "too little memory on 1x Tesla T4" in refused("t4x1-2204").cause


def test_unsupported_os_and_no_gpu():
    assert "unsupported OS CentOS Linux 7" in refused("centos7").cause
    r = refused("nogpu-2204")
    assert "no NVIDIA GPU found" in r.cause and "cpu-smoke" in r.fix


def test_debian_12_is_for_the_cpu_profile_only():
    assert "CPU smoke profile only" in refused("debian12-cpu", pci_gpus=recorded_facts("v100x1-2004").pci_gpus).cause
    d = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke"})
    assert d.profile == "cpu-smoke" and d.gpus == [] and d.serve.value("--dtype") == "bfloat16"
    assert not any(c.what in {"driver", "cuda"} for c in d.choices)


def test_open_driver_on_volta_is_refused():
    r = refused("v100x4-2204-fresh", {"qwen27b_stack_overrides": {"driver": {"package": "nvidia-driver-580-open"}}})
    assert "GSP" in r.cause and "nvidia-driver-580" in r.fix
    loaded_open = {"loaded": True, "flavor": "open", "version": "580.95.05"}
    assert "open NVIDIA kernel module" in refused("v100x4-converged", kernel_module=loaded_open).cause


def test_cuda_13_on_volta_is_refused():
    r = refused("v100x4-2204-fresh", {"qwen27b_stack_overrides": {"cuda": {"toolkit": "13.0"}}})
    assert "CUDA 13.0" in r.cause and "Volta support removed" in r.cause


def test_upstream_vllm_or_its_profile_on_volta_is_refused():
    r = refused("v100x4-2204-fresh", {"qwen27b_stack_overrides": {"vllm": {"build": "upstream"}}})
    assert "no kernels for compute capability 7.0" in r.cause and "1Cat" in r.fix
    r = refused("v100x4-2204-fresh", {"qwen27b_profile": "sm75plus"})
    assert "is for compute capability 7.5" in r.cause and "sm70" in r.fix


def test_secure_boot_needs_a_mok_key():
    assert "Secure Boot is on" in refused("v100x1-secureboot").cause
    assert run("v100x1-secureboot", {"qwen27b_mok_key_path": "/root/mok/MOK.priv"}).profile == "sm70"


def test_too_little_disk_is_refused():
    fresh = recorded_facts("v100x4-2204-fresh")
    r = refused("v100x4-2204-fresh", disk={**fresh.disk, "free_bytes": 20 * 2**30})
    assert "too little disk" in r.cause and "20.0 GiB free" in r.cause


def test_degraded_pcie_and_xid_79_warn_with_the_seed_advice():
    d = run("v100x4-degraded")
    assert any("GPU 2 PCIe link degraded: x8 of x16" in w for w in d.warnings)
    xid = [w for w in d.warnings if w.startswith("Xid 79")]
    assert xid and "Above 4G Decoding" in xid[0] and "X99" in xid[0]


def test_gpu_indices_and_tp_are_checked_against_the_host():
    assert "lists GPU(s) [7]" in refused("v100x4-2204-fresh", {"qwen27b_gpu_indices": [0, 7]}).cause
    assert "more than the 4 GPU(s)" in refused("v100x4-2204-fresh", {"qwen27b_tensor_parallel_size": 8}).cause
    d = run("v100x4-2204-fresh", {"qwen27b_gpu_indices": [2, 3]})
    assert d.serve.value("--tensor-parallel-size") == "2" and [g.index for g in d.gpus] == [2, 3]


def test_unknown_gpu_is_refused():
    odd = [{"slot": "0000:3b:00.0", "class": "0302", "device_id": "abcd", "description": "NVIDIA Corporation Device"}]
    assert "unknown NVIDIA GPU 10de:abcd" in refused("v100x4-2204-fresh", pci_gpus=odd).cause


def test_bind_address_comes_from_the_lab_address():
    d = decide("h", recorded_facts("v100x1-2004"), STACK, settings_for("h", {}), bind_address="192.168.10.21")
    assert d.serve.value("--host") == "192.168.10.21"
    assert run("v100x1-2004").serve.value("--host") == "127.0.0.1"


# --- bad host data that only the host's GPUs can judge ---------------------------------------------

@pytest.mark.parametrize("data, key, text", [
    pytest.param({"qwen27b_gpu_indices": [0, 7]}, "qwen27b_gpu_indices", "lists GPU(s) [7] but the host has [0, 1, 2, 3]",
                 id="gpu-index-not-on-host"),
    pytest.param({"qwen27b_tensor_parallel_size": 8}, "qwen27b_tensor_parallel_size", "8 is more than the 4 GPU(s)",
                 id="tp-above-host-gpus"),
    pytest.param({"qwen27b_tensor_parallel_size": 3}, "qwen27b_tensor_parallel_size", "3 does not divide the 4 GPUs",
                 id="tp-not-dividing-host-gpus"),
    pytest.param({"qwen27b_serve_flags": {"--tensor-parallel-size": 3}}, "qwen27b_serve_flags --tensor-parallel-size",
                 "3 does not divide the 4 GPUs", id="pinned-tp-not-dividing-host-gpus"),
    pytest.param({"qwen27b_gpu_indices": [0, 1, 2], "qwen27b_tensor_parallel_size": 3}, "qwen27b_tensor_parallel_size",
                 "does not divide the model's 24 attention / 4 KV heads", id="tp-not-dividing-model-heads"),
])
def test_bad_data_against_the_host_names_host_key_and_fix(data, key, text):
    r = refused("v100x4-2204-fresh", data)
    assert key in r.cause and text in r.cause and r.fix, str(r)


# --- nvidia-smi failure modes (recorded outputs in tests/facts/NvidiaGpus/) ----------------------

def smi(case: str) -> list:
    """The NvidiaGpus fact parsed from one recorded nvidia-smi output."""
    output = json.loads((TESTS / "facts" / "NvidiaGpus" / f"{case}.json").read_text())["output"]
    return F.NvidiaGpus().process(output)


@pytest.mark.parametrize("case, cause, fix", [
    pytest.param("driver-library-mismatch", "Driver/library version mismatch: the NVIDIA driver was upgraded without a "
                 "reboot (NVML library 580.105 installed, kernel module 580.95.05 still loaded)", "reboot to load the new driver (580.105)",
                 id="driver-library-mismatch"),
    pytest.param("nvml-unknown-error", "nvidia-smi: Failed to initialize NVML: Unknown Error", "reinstall the driver or reboot",
                 id="nvml-unknown-error"),
    pytest.param("device-handle-unknown-error", "cannot reach 1 GPU(s): Unable to determine the device handle for GPU "
                 "0000:86:00.0: Unknown Error", "reseat the card", id="device-handle-unknown-error"),
    pytest.param("device-handle-gpu-is-lost", "GPU is lost", "RMA the card", id="device-handle-gpu-is-lost"),
])
def test_nvidia_smi_failures_are_refused_with_what_to_do(case, cause, fix):
    r = refused("v100x4-converged", gpus=smi(case))
    assert cause in r.cause and fix in r.fix, str(r)


def test_gpu_lost_with_xid_79_gives_the_seed_advice():
    xid = {"time": None, "pci": "0000:86:00", "xid": 79, "text": "GPU has fallen off the bus."}
    r = refused("v100x4-converged", gpus=smi("device-handle-unknown-error"), xids=[xid])
    assert "Xid 79" in r.cause and "Above 4G Decoding" in r.fix


def test_corrupted_inforom_warns_and_the_gpus_still_serve():
    d = run("v100x4-converged", gpus=smi("inforom-corrupted"))
    assert len(d.gpus) == 4 and d.serve.value("--tensor-parallel-size") == "4"
    inforom = [w for w in d.warnings if "infoROM" in w]
    assert inforom == [w for w in inforom if w.startswith("GPU 2 (0000:86:00.0) infoROM is corrupted")] and inforom
    assert "check the board / reseat" in inforom[0] and "RMA" in inforom[0]


def test_nvidia_smi_problems_do_not_matter_on_the_cpu_profile():
    d = run("debian12-cpu", {"qwen27b_profile": "cpu-smoke"}, gpus=smi("driver-library-mismatch"))
    assert d.profile == "cpu-smoke" and not any("infoROM" in w for w in d.warnings)


def test_an_unpinned_cuda_keyring_is_named_in_the_plan_and_a_pinned_one_is_used():
    """stack.yaml pins the cuda-keyring .deb's sha256 for ubuntu2204, none for ubuntu2004: when the
    CUDA repo is needed the plan says the 20.04 download is unverified; 22.04's row carries the hash
    that roles/cuda.py passes to files.download (tests/unit/slow/test_security.py checks the planned command)."""
    old = run("v100x1-2004")  # sm70 needs the toolkit (1Cat 1.5.1's TileLang JIT)
    assert any("cuda-keyring_1.1-1_all.deb for ubuntu2004 has no sha256" in w for w in old.warnings), old.warnings
    new = run("v100x4-2204-fresh")
    assert not any("cuda-keyring" in w for w in new.warnings)
    assert len(new.os_row["cuda_keyring_sha256"]) == 64 and new.os_row["source"] == "cuda-keyring-pins"
    unneeded = {"qwen27b_stack_overrides": {"cuda": {"needed_by_vllm": False}}}
    assert not any("cuda-keyring" in w for w in run("v100x1-2004", unneeded).warnings)  # nothing downloaded


# --- real-world host states (issue 14); recordings hand-written in the real formats, h200 genuine ---


def test_healthy_driver_outside_apt_is_kept_without_reboot():
    """The genuine H200 recording: R580 from no apt package, nvidia-smi answering."""
    d = run("h200")
    assert d.driver.action == "keep" and not d.driver.reboot and d.driver.hold == ()
    assert d.choice("driver").value == "580.159.04 (outside apt)" and "installed outside apt" in d.choice("driver").reason
    assert d.driver.headers is None and any("linux-headers-6.18.44-fc-v973-gpu" in w for w in d.warnings)


def test_healthy_driver_from_cuda_drivers_is_kept_and_held():
    packages = {"cuda-drivers": "580.95.05-1", "cuda-drivers-580": "580.95.05-1"}
    d = run("v100x4-converged", packages=packages)
    assert d.driver.action == "keep" and d.driver.hold == ("cuda-drivers", "cuda-drivers-580")
    assert "from apt (cuda-drivers 580.95.05-1" in d.choice("driver").reason


def test_open_driver_loaded_on_volta_is_purged_and_replaced():
    d = run("v100x1-open-loaded")
    assert d.driver.action == "replace" and d.driver.reboot and d.driver.package == "nvidia-driver-580-server"
    assert d.driver.remove == ("nvidia-dkms-580-open", "nvidia-driver-580-open", "nvidia-kernel-source-580-open")
    assert "open kernel module is loaded" in d.choice("driver").reason


def test_open_driver_installed_not_loaded_is_purged_and_skip_reboot_says_so():
    d = run("v100x2-open-unloaded", {"qwen27b_skip_reboot": True})
    assert d.driver.remove == ("nvidia-dkms-580-open", "nvidia-driver-580-open", "nvidia-kernel-source-580-open")
    assert "installed, not loaded" in d.driver.reason and "reboot pending (qwen27b_skip_reboot)" in d.driver.reason


def test_open_module_from_a_run_installer_is_refused_with_the_uninstaller():
    loaded_open = {"loaded": True, "flavor": "open", "version": "580.95.05"}
    r = refused("v100x4-2204-fresh", kernel_module=loaded_open)
    assert "no nvidia-*-open package owns it" in r.cause and "nvidia-uninstall" in r.fix


def test_r470_too_old_to_answer_is_upgraded_from_pci_ids():
    d = run("v100x2-r470")
    assert [g.name for g in d.gpus] == ["Tesla V100-PCIE-32GB"] * 2  # from lspci: nvidia-smi could not say
    assert d.driver.action == "replace" and "nvidia-driver-470" in d.driver.remove
    assert "too old for nvidia-smi to report compute_cap" in d.driver.reason
    wrong = {"loaded": True, "flavor": "proprietary", "version": "470.256.02"}
    r = refused("v100x4-2204-fresh", kernel_module=wrong)  # the same driver, no apt package: a .run install
    assert "installed outside apt" in r.cause and "nvidia-uninstall" in r.fix


def test_pg500_volta_variant_is_known_from_pci_ids():
    d = run("v100x4-pg500")
    assert d.profile == "sm70" and [g.name for g in d.gpus] == ["GV100GL [Tesla PG500-216]"] * 4
    assert {g.memory_mib for g in d.gpus} == {16160}  # its name says no size: planned at the smallest V100


def test_headers_missing_from_every_archive_is_refused_before_the_driver():
    r = refused("v100x4-noheaders")
    assert "linux-headers-5.15.0-60-generic is in no configured apt archive" in r.cause
    assert "apt-get update" in r.fix and "linux-headers-generic" in r.fix
    assert run("v100x4-2204-fresh").driver.headers == "linux-headers-5.15.0-125-generic"


def test_installed_cuda_13_toolkit_on_volta_is_left_alone_and_said_so():
    """For a build that needs no compiler (cuda.needed_by_vllm false); sm70's 1Cat 1.5.1 needs 12.8's."""
    packages = dict(recorded_facts("v100x4-converged").packages, **{"cuda-toolkit-13-0": "13.0.2-1"})
    assert run("v100x4-converged", packages=packages).choice("cuda").action == "keep"  # its 12.8 toolkit
    unneeded = {"qwen27b_stack_overrides": {"cuda": {"needed_by_vllm": False}}}
    d = run("v100x4-converged", unneeded, packages=packages)
    reason = d.choice("cuda").reason
    assert d.choice("cuda").action == "skip" and "cuda-toolkit-13-0 13.0.2-1" in reason
    assert "left alone: nothing here compiles against it" in reason and "CUDA 13+ cannot build for this GPU" in reason


def test_converged_host_with_little_disk_needs_only_what_is_missing():
    d = run("v100x4-converged-8g")  # 8 GiB free, both revisions verified: nothing to fetch
    assert any("only 8.0 GiB free on /: nothing to fetch" in w for w in d.warnings)
    draft = "incoai--Qwen3.8-27B-DFlash2@dedf8df68adfb1afeaf7b7480c0a0243108177b4"
    partial = {"QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@main": {"bytes": 16 * 2**30, "verified": False},
               draft: {"bytes": 3848817896, "verified": True}}
    r = refused("v100x4-converged-8g", models_on_disk=partial)  # a partial download: its missing ~3.1 GiB + headroom
    assert "8.0 GiB free, 13.1 GiB needed (3.1 GiB of weights still to fetch + 10 GiB headroom" in r.cause
    assert "QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 16.0 GiB partial" in r.cause
    run("v100x4-converged-8g", {"qwen27b_min_free_disk_gib": 1}, models_on_disk=partial)  # 4.1 GiB fits in 8
    no_draft = {k: v for k, v in partial.items() if k != draft}  # the draft counts too: its 3.6 GiB
    assert "16.7 GiB needed (6.7 GiB of weights" in refused("v100x4-converged-8g", models_on_disk=no_draft).cause


def test_every_refusal_of_a_host_is_reported_at_once():
    """Secure Boot without a key, headers missing and too little disk: three problems, one run."""
    headers = {"package": "linux-headers-5.4.0-200-generic", "installed": None, "candidate": None}
    disk = dict(recorded_facts("v100x1-secureboot").disk, free_bytes=5 * 2**30)
    r = refused("v100x1-secureboot", kernel_headers=headers, disk=disk)
    causes = [cause for cause, _ in r.problems]
    assert len(causes) == 3, causes
    assert "Secure Boot is on" in causes[1] and "linux-headers-" in causes[0] and "too little disk" in causes[2]
    assert str(r).count("Fix: ") == 3 and "(3) too little disk" in str(r)


def test_secure_boot_fix_is_a_runnable_mok_sequence():
    fix = refused("v100x1-secureboot").fix
    for step in ("openssl req -new -x509", "mokutil --import /var/lib/shim-signed/mok/MOK.der", "sudo reboot",
                 "MOK Manager: Enroll MOK", "mokutil --test-key", "qwen27b_mok_key_path: /var/lib/shim-signed/mok/MOK.priv"):
        assert step in fix, step
    assert run("v100x1-secureboot", {"qwen27b_mok_key_path": "/var/lib/shim-signed/mok/MOK.priv"}).driver.action == "install"


def test_driver_flavour_is_chosen_per_generation():
    """Volta: proprietary (no GSP); Turing and newer: the open modules NVIDIA recommends since R560."""
    assert run("v100x4-2204-fresh").driver.package == "nvidia-driver-580-server"
    bare = run("a100x2-2204", gpus=[], kernel_module={}, packages={})  # the same A100s before any driver
    assert bare.driver.action == "install" and bare.driver.package == "nvidia-driver-580-server-open"
    assert "open kernel module" in bare.driver.reason and "open-modules-turing" in bare.driver.reason
    kept = run("a100x2-2204")  # its healthy -server-open driver is kept, not replaced and rebooted
    assert kept.driver.action == "keep" and kept.driver.hold == ("nvidia-driver-580-server-open",)


def test_an_other_branch_driver_installed_but_not_loaded_is_purged_too():
    packages = {"nvidia-driver-535-server": "535.216.01-0ubuntu0.22.04.1", "nvidia-dkms-535-server": "535.216.01-0ubuntu0.22.04.1"}
    d = run("v100x4-2204-fresh", packages=packages)
    assert d.driver.action == "replace" and d.driver.remove == ("nvidia-dkms-535-server", "nvidia-driver-535-server")
    assert "installed, not loaded: not R580" in d.driver.reason


def test_a_loaded_driver_that_lists_no_gpu_is_not_kept():
    d = run("v100x4-converged", gpus=[])  # R580 loaded, nvidia-smi lists no GPU ("No devices were found")
    assert d.driver.action == "install" and d.driver.reboot and "lists no GPU" in d.driver.reason


def test_mixed_32_and_16_gb_names_the_gpus_that_fit():
    """Issue 24: one 16 GB and one 32 GB V100 are planned as two 16 GB cards. Without the DFlash2 draft
    (whole on every card, it does not fit at 16 GB: issue 49) the pair serves a shorter context; a 64k
    context does not fit at that size and is refused, the fix naming the 32 GB card alone as
    qwen27b_gpu_indices (checked to fit, as planned: the draft dropped there too), the cause saying the cards differ."""
    pair = run("v100x2-mixed").serve
    assert pair.value("--tensor-parallel-size") == "2" and pair.spec.method == "off"
    long = {"qwen27b_serve_flags": {"--max-model-len": 65536}}
    error = refused("v100x2-mixed", long)
    assert "1x Tesla V100-SXM2-16GB + 1x Tesla V100-SXM2-32GB (each sized as the smallest, 16160 MiB)" in error.cause
    assert error.fix.startswith("serve on the 1 GPU(s) with 32510 MiB alone (they fit: TP 1") and \
        "qwen27b_gpu_indices: [1]" in error.fix
    assert "lower the pinned values" in error.fix  # the other way out stays
    d = run("v100x2-mixed", {**long, "qwen27b_gpu_indices": [1]})
    assert [g.index for g in d.gpus] == [1] and d.serve.value("--tensor-parallel-size") == "1"
    # the same cards of one size: nothing to narrow to
    assert "qwen27b_gpu_indices" not in refused("v100x2-16gb", long).fix


def test_a_held_old_driver_is_released_in_the_replacing_transaction():
    """Issue 24: the operator held R470 (apt-mark hold); apt-get -y would stop at the hold. The plan
    names the holds and the replacement passes --allow-change-held-packages; without holds, it does not."""
    plan = run("v100x2-r470-held").driver
    assert plan.action == "replace" and plan.release_holds == ("nvidia-dkms-470", "nvidia-driver-470")
    assert "nvidia-dkms-470, nvidia-driver-470 held with apt-mark hold" in plan.reason
    assert "--allow-change-held-packages" in plan.reason
    assert run("v100x2-r470").driver.release_holds == ()


def test_sm70_serves_the_vendors_release_profile_quasar_with_dflash2_and_fp8_kv():
    """Issue 49: the engine vendor's validated V100 profile: QUASAR NVFP4 with the DFlash2 draft at its
    pinned revision, fp8_e5m2 KV, 262,144 tokens of context, the profile's block sizes and chat kwargs."""
    d = run("v100x4-2204-fresh")
    assert d.stack.model["id"] == "QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4" and d.draft_path is not None
    assert json.loads(d.serve.value("--speculative-config")) == {
        "method": "dflash", "model": d.draft_path, "num_speculative_tokens": 7, "draft_sample_method": "probabilistic",
        "kv_cache_dtype": "auto", "attention_backend": "FLASH_ATTN_V100"}
    assert d.serve.value("--kv-cache-dtype") == "fp8_e5m2" and d.serve.spec.method == "dflash2"
    assert d.serve.value("--max-model-len") == "262144" and d.serve.value("--gpu-memory-utilization") == "0.8"
    assert d.serve.value("--block-size") == "2048" and d.serve.value("--mamba-block-size") == "8192"
    assert json.loads(d.serve.value("--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert d.serve.has("--trust-remote-code") and "VLLM_SM70_DFLASH2_QUANT_LM_HEAD" not in d.serve.env  # dense head
    assert d.choice("draft").value == "incoai/Qwen3.8-27B-DFlash2@dedf8df68adfb1afeaf7b7480c0a0243108177b4"
    assert d.serve.memory.draft == 3848817896  # whole on every card, not split by TP [1cat-draft-per-card]


def test_the_owners_radixark_checkpoint_stays_a_named_alternative_with_mtp_or_dflash2():
    """The RadixArk checkpoint V100 owners ran before issue 49: its quantized lm_head takes DFlash2 on
    1.5.1 with PR 451's switch (set in the env), and MTP (its own layers, no draft) when named."""
    radix = {"qwen27b_model": "qwen3.8-27b-nvfp4-radixark"}
    d = run("v100x4-2204-fresh", radix)
    assert d.stack.model["id"] == "RadixArk/Qwen3.8-27B-NVFP4" and d.serve.spec.method == "dflash2"
    assert d.serve.env["VLLM_SM70_DFLASH2_QUANT_LM_HEAD"] == "1"
    mtp = run("v100x4-2204-fresh", {**radix, "qwen27b_speculative": "mtp"})
    # k=3: the profile's 262,144-token context is long context for MTP [v100-skinny-mtp]
    assert json.loads(mtp.serve.value("--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}
    assert mtp.draft_path is None and "draft" not in {c.what for c in mtp.choices}
    assert "VLLM_SM70_DFLASH2_QUANT_LM_HEAD" not in mtp.serve.env


def test_the_mixed_modelopt_checkpoint_on_sm70_is_refused_naming_the_key_and_the_fix():
    r = refused("v100x4-2204-fresh", {"qwen27b_model": "qwen3.8-27b-nvfp4"})
    assert r.host == "v100x4-2204-fresh"
    assert "nvidia/Qwen3.8-27B-NVFP4 (qwen27b_model qwen3.8-27b-nvfp4) is a mixed NVFP4+FP8 checkpoint" in r.cause
    assert "no Volta kernels for its FP8" in r.cause and "min capability 89" in r.cause
    assert r.fix.startswith("remove qwen27b_model")
    # a build known to have Volta FP8 kernels serves it
    stack = load_stack()
    stack["vllm_builds"]["1cat"]["volta_fp8_kernels"] = True
    d = decide("v100x4-2204-fresh", recorded_facts("v100x4-2204-fresh"), stack,
               settings_for("v100x4-2204-fresh", {"qwen27b_model": "qwen3.8-27b-nvfp4"}))
    assert d.stack.model["id"] == "nvidia/Qwen3.8-27B-NVFP4"


def test_a_named_speculative_method_that_cannot_run_is_refused():
    """DFlash2 beside a quantized lm_head on a build without PR 451's switch (1.5.0), named by the host."""
    data = {"qwen27b_speculative": "dflash2", "qwen27b_model": "qwen3.8-27b-nvfp4-radixark",
            "qwen27b_stack_overrides": {"vllm": {"version": "1.5.0"}}}
    r = refused("v100x4-2204-fresh", data)
    assert "qwen27b_speculative dflash2: RadixArk/Qwen3.8-27B-NVFP4 quantizes its lm_head" in r.cause
    assert "VLLM_SM70_DFLASH2_QUANT_LM_HEAD" in r.cause and "this profile has 1.5.0" in r.cause
    assert "qwen27b_speculative mtp: QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4" in refused(
        "v100x4-2204-fresh", {"qwen27b_speculative": "mtp"}).cause  # no MTP layers in QUASAR


def test_a_verified_model_on_disk_is_kept_and_a_partial_one_installed():
    """The plan's model row says what the weights role will do: nothing for a verified revision."""
    d = run("v100x4-converged")
    assert d.choice("model").action == "keep" and "verified on disk (19.1 GiB)" in d.choice("model").reason
    assert d.choice("draft").action == "keep" and "verified on disk (3.6 GiB)" in d.choice("draft").reason
    partial = {"QUASAR-QAT--Qwen3.8-27B-QUASAR-NVFP4@main": {"bytes": 16 * 2**30, "verified": False}}
    assert run("v100x4-converged", models_on_disk=partial).choice("model").action == "install"
    assert run("v100x4-2204-fresh").choice("model").action == "install"


def test_vllm_and_torch_are_kept_only_when_the_release_venv_holds_the_planned_build():
    """mark_installed reads VenvPackages of the release venv (names PEP 503-normalised, as the vllm
    role compares them): the planned version keeps both rows, any other version installs."""
    from qwen27b.plan.installs import mark_installed
    d = run("v100x4-converged")
    fresh = mark_installed(d, {})
    assert fresh.choice("vllm").action == fresh.choice("torch").action == "install"
    wrong = mark_installed(d, {"1cat-vllm": "1.5.0", "torch": "2.9.1"})  # the release before issue 49
    assert wrong.choice("vllm").action == "install"
    kept = mark_installed(d, {"1Cat_vLLM": "1.5.1", "torch": "2.10.0+cu128"})
    assert kept.choice("vllm").action == kept.choice("torch").action == "keep"
    assert f"already in release {d.stack.stack_hash}" in kept.choice("vllm").reason
    assert kept.choice("torch").reason.startswith("torch 2.10.0+cu128 already in release")
    assert mark_installed(kept, {"1cat-vllm": "1.5.1"}).choices == kept.choices  # idempotent
    # a host switched to ModelScope: the build is there, its client is not: the vllm role installs it
    ms = run("v100x4-converged", {"qwen27b_model_source": "modelscope"})
    assert mark_installed(ms, {"1Cat_vLLM": "1.5.1"}).choice("vllm").action == "install"
    assert mark_installed(ms, {"1Cat_vLLM": "1.5.1", "modelscope_hub": "0.5.1"}).choice("vllm").action == "keep"


# --- agent parsers and the speculative fallback on real decisions ---------------------------------------

def test_agent_parsers_on_a_v100_host_by_default_off_on_request_refused_where_they_cannot_work():
    serve = run("v100x4-2204-fresh").serve
    assert serve.value("--reasoning-parser") == "qwen3" and serve.value("--tool-call-parser") == "qwen3_coder"
    assert serve.has("--enable-auto-tool-choice")
    off = run("v100x4-2204-fresh", {"qwen27b_agent_parsers": False}).serve
    assert not off.has("--reasoning-parser") and any("qwen27b_agent_parsers is false" in n for n in off.notes)
    cpu = {"qwen27b_profile": "cpu-smoke"}
    assert not run("debian12-cpu", cpu).serve.has("--reasoning-parser")
    r = refused("debian12-cpu", {**cpu, "qwen27b_agent_parsers": True})
    assert "qwen27b_agent_parsers true" in r.cause and "SmolLM2" in r.cause and "qwen27b_agent_parsers" in r.fix


def test_verify_judges_the_hosts_own_method_with_the_fallback():
    from qwen27b.controller.verifyplan import spec_judge
    zero = (TESTS / "fixtures/journals/v100x4-spec-acceptance-zero/metrics.txt").read_text()
    judge = spec_judge(run("v100x4-2204-fresh"))  # DFlash2 at TP 4; QUASAR has no MTP layers: then off
    nxt, verdict = judge("", zero)
    assert verdict.keep is False and nxt.method == "off" and "dflash2 accepted 0 of" in nxt.reason
    assert "not mtp: QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 has no MTP layers" in nxt.reason
    # RadixArk has MTP layers: the measured fallback from DFlash2 is MTP (what #478's rule did by planning)
    radix = spec_judge(run("v100x4-2204-fresh", {"qwen27b_model": "qwen3.8-27b-nvfp4-radixark"}))
    nxt, verdict = radix("", zero)
    assert verdict.keep is False and nxt.method == "mtp" and "dflash2 accepted 0 of" in nxt.reason
    assert spec_judge(run("v100x4-2204-fresh", {"qwen27b_speculative": "off"})) is None


def test_modelscope_for_a_checkpoint_it_has_no_id_for_is_refused_naming_the_key(monkeypatch):
    """Refused before any host is touched, naming qwen27b_model_source and the other sources."""
    entry = STACK["models"]["qwen3.8-27b-nvfp4-quasar"]
    monkeypatch.setitem(STACK["models"], "qwen3.8-27b-nvfp4-quasar", {k: v for k, v in entry.items() if k != "modelscope"})
    r = refused("v100x4-2204-fresh", {"qwen27b_model_source": "modelscope"})
    assert r.cause.startswith("qwen27b_model_source: QUASAR-QAT/Qwen3.8-27B-QUASAR-NVFP4 has no ModelScope id") and "hub" in r.fix
    monkeypatch.setitem(STACK["models"], "qwen3.8-27b-nvfp4-quasar", entry)
    ok = run("v100x4-2204-fresh", {"qwen27b_model_source": "modelscope"})
    assert ok.stack.model["id"] == entry["modelscope"]["id"] and ok.stack.model["revision"] == entry["modelscope"]["revision"]
