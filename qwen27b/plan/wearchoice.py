"""The gate's side of GPU wear (issue 50 item 3, cut from gate.py): the GPUs left out for a
gpuwear finding (host data that selects a worn GPU is refused, naming it, the evidence and the fix),
and the plan's rows for qwen27b-gpu-power.service: persistence, the power caps, ECC (issue 27)."""

from __future__ import annotations

from qwen27b.plan.gatetypes import Choice, HostFacts, RefusedHost
from qwen27b.plan.planner import Gpu
from qwen27b.plan.settings import Settings


def _leave_out_worn(host: str, gpus: list[Gpu], wear: list, settings: Settings) -> list[Gpu]:
    """The GPUs without a leave-out finding (gpuwear.assess). Host data that selects a worn GPU is
    refused, naming it, the evidence and the fix; so is a host whose every GPU is worn."""
    worn = {w.index: w for w in wear if w.leave_out}
    if not worn:
        return gpus
    if settings.gpu_indices is not None:
        chosen = [w for i, w in worn.items() if i in settings.gpu_indices]
        if chosen:
            raise RefusedHost.every(host, [RefusedHost(host, f"qwen27b_gpu_indices selects {w.gpu}, which should not "
                                                       f"serve: {w.cause}", f"{w.fix}; or leave GPU {w.index} out of "
                                                       "qwen27b_gpu_indices") for w in chosen])
    kept = [g for g in gpus if g.index not in worn]
    if gpus and not kept:
        raise RefusedHost.every(host, [RefusedHost(host, f"{w.gpu} should not serve: {w.cause}", w.fix)
                                       for w in worn.values()])
    return kept


def _power_choices(facts: HostFacts, power) -> list[Choice]:
    """The plan's rows for qwen27b-gpu-power.service: persistence, the power caps, ECC (issue 27)."""
    if power is None:
        return []
    unit, wear = "qwen27b-gpu-power.service", {w["index"]: w for w in ((facts.wear or {}).get("gpus") or [])}
    off = [g["index"] for g in facts.gpus if g.get("persistence_mode") is False]
    out = [Choice("persist", "on", (f"persistence mode is off on GPU(s) {', '.join(map(str, off))}: " if off else "")
                  + f"{unit} runs `nvidia-smi -pm 1` at boot, before qwen27b.service (the driver stays loaded "
                  "between clients; no start-up delay, settings kept) [nvidia-smi-pl]", "install" if off else "keep")]
    if power.limits:
        same = all((wear.get(i) or {}).get("power_limit_w") == w for i, w in power.limits)
        out.append(Choice("power", ", ".join(f"GPU {i}: {w} W" for i, w in power.limits),
                          f"qwen27b_power_limit_w, set by {unit} with `nvidia-smi -i N -pl W` at boot: "
                          + "; ".join(power.reasons), "keep" if same else "install"))
    else:
        found = sorted({f"{w['power_limit_w']:.0f} W" for w in wear.values() if w.get("power_limit_w") is not None})
        out.append(Choice("power", f"as found ({', '.join(found) or 'not read'})",
                          "no qwen27b_power_limit_w: a used card on a marginal PSU falls off the bus at full draw; "
                          "cap it (e.g. 275 W on a V100) [used-v100-psu]", "skip"))
    ecc_off = [w["index"] for w in wear.values() if w.get("ecc_enabled") is False]
    if power.ecc_on:
        pending = [i for i in power.ecc_on if (wear.get(i) or {}).get("ecc_pending")]
        out.append(Choice("ecc", "on", f"qwen27b_ecc: on: `nvidia-smi -i N -e 1` on GPU(s) {', '.join(map(str, power.ecc_on))}"
                          + (" (already pending)" if len(pending) == len(power.ecc_on) else "")
                          + "; it takes effect after a reboot, which this deploy does not do: reboot the host "
                          "[nvidia-smi-pl]", "pending"))
    else:
        out.append(Choice("ecc", "as found", (f"ECC is off on GPU(s) {', '.join(map(str, ecc_off))}; left as found "
                                              "(qwen27b_ecc: on turns it on after a reboot)") if ecc_off
                          else "left as found (on where read)", "keep"))
    return out
