"""Used cards (issue 27): each GPU's wear read before it serves, judged with the GPU named.

Second-hand V100s in X99 and workstation boards fail in ways a restart cannot fix: pages waiting
to be retired after uncorrected ECC errors (a reboot retires them), a card falling off the bus
again and again (Xid 79: slot, riser, power), a link trained far below its width. The gate asks
`assess` (a pure function of the GpuWear, NvidiaGpus and XidErrors facts and the stack's
`gpu_wear` rules) and leaves such a GPU out of the default TP group, or refuses a host whose data
selects it; the rest become warnings that name the GPU. `power_plan` checks the power caps and
the ECC wish of the host data against each card's range.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen27b.onhost.contract import xid_meaning

PSU_FIX = ("check the card's power cables and the PSU's headroom (a used V100 drawing its full 300 W on a marginal "
           "supply falls off the bus: cap it with qwen27b_power_limit_w, e.g. 275), reseat the card, try another "
           "slot or riser")


@dataclass(frozen=True)
class Wear:
    """One finding on one GPU. `leave_out`: the GPU should not serve until `fix` is done."""

    index: int
    bus_id: str | None
    cause: str
    fix: str
    leave_out: bool = False

    @property
    def gpu(self) -> str:
        return f"GPU {self.index} ({self.bus_id})" if self.bus_id else f"GPU {self.index}"

    def line(self) -> str:
        head = f"{self.gpu} left out of the TP group: " if self.leave_out else f"{self.gpu}: "
        return f"{head}{self.cause}. Fix: {self.fix}"


def bus_slot(address: str | None) -> str:
    """'00000000:86:00.0' and the kernel's '0000:86:00' -> '86:00' (bus:device), to match Xids to GPUs."""
    parts = str(address or "").lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else ""


def xids_by_gpu(facts) -> dict[str, dict[int, int]]:
    """bus:device -> {xid: count} from the kernel log's Xid lines."""
    out: dict[str, dict[int, int]] = {}
    for x in facts.xids or []:
        counts = out.setdefault(bus_slot(x.get("pci")), {})
        counts[x["xid"]] = counts.get(x["xid"], 0) + 1
    return out


def gpu_name(facts, pci: str | None) -> str:
    """'GPU 2 (00000000:86:00.0)' for a kernel PCI address, or the address when no GPU has it."""
    slot = bus_slot(pci)
    for g in facts.gpus or []:
        if bus_slot(g.get("bus_id")) == slot:
            return f"GPU {g['index']} ({g.get('bus_id')})"
    return f"PCI {pci}"


def assess(facts, rules: dict, cite) -> list[Wear]:
    """Every wear finding, per GPU in index order. `rules`: the stack's gpu_wear; `cite(ids)` -> '[...]'."""
    wear = {bus_slot(w.get("bus_id")): w for w in ((facts.wear or {}).get("gpus") or [])}
    remapped = {bus_slot(bus): r for bus, r in ((facts.wear or {}).get("remapped_rows") or {}).items()}
    xids = xids_by_gpu(facts)
    repeated = rules["repeated_xid"]
    out: list[Wear] = []
    for g in facts.gpus or []:
        slot, index, bus = bus_slot(g.get("bus_id")), g["index"], g.get("bus_id")
        w, rows, seen = wear.get(slot) or {}, remapped.get(slot) or {}, xids.get(slot) or {}

        def add(cause: str, fix: str, leave_out: bool = False) -> None:
            out.append(Wear(index, bus, cause, fix, leave_out))

        if w.get("retired_pending") or rows.get("pending"):
            what = ("memory pages are waiting to be retired (retired_pages.pending: Yes" if w.get("retired_pending")
                    else "rows are waiting to be remapped (remapped_rows.pending: Yes")
            errors = w.get("ecc_uncorrected_volatile")
            add(what + (f"; {errors} uncorrected ECC error(s) since the driver loaded" if errors else "") + ")",
                "reboot the host (or reset the GPU with `nvidia-smi -r -i " + str(index) + "` while nothing uses it) "
                "so the driver retires them, then re-run the deploy; restarting the service cannot help "
                + cite(rules["pending_retirement"]["source"]), leave_out=True)
        if rows.get("failure"):
            add("row remapping has failed (remapped_rows.failure: Yes): the memory has no spare rows left",
                "replace the card (RMA)", leave_out=True)
        bad = {x: n for x, n in seen.items() if x in repeated["xids"]}
        if sum(bad.values()) >= repeated["count"]:
            add(", ".join(f"Xid {x} ({xid_meaning(x)}) {n}x" for x, n in sorted(bad.items()))
                + " in the kernel log in the last 7 days", f"{PSU_FIX} {cite(repeated['source'])}", leave_out=True)
        elif bad:
            x = next(iter(bad))
            add(f"Xid {x} ({xid_meaning(x)}) once in the kernel log in the last 7 days: it serves, but a second one "
                "leaves it out", f"{PSU_FIX}; run `qwen27b qualify` on the host {cite(repeated['source'])}")
        wc, wm, gc, gm = (g.get(k) for k in ("pcie_width_current", "pcie_width_max", "pcie_gen_current", "pcie_gen_max"))
        if wc and wm and wc <= wm * rules["link_width_fraction"]:
            add(f"PCIe link x{wc} (gen {gc}) of its x{wm} (gen {gm}): far below its width, which idle power saving "
                "does not lower", "reseat the card, try another slot or riser, set the slot's link speed in the "
                f"BIOS {cite(repeated['source'])}", leave_out=True)
        life_uncorrected, life_corrected = w.get("ecc_uncorrected_aggregate"), w.get("ecc_corrected_aggregate")
        if life_uncorrected and not w.get("retired_pending"):
            add(f"{life_uncorrected} uncorrected ECC error(s) over the card's life "
                f"({w.get('retired_dbe') or 0} page(s) retired for them)", "watch it: `qwen27b qualify` before "
                "trusting it; replace the card if the count grows")
        elif life_corrected is not None and life_corrected >= rules["corrected_aggregate_warn"]:
            add(f"{life_corrected} corrected ECC errors over the card's life (>= {rules['corrected_aggregate_warn']})",
                "its memory is wearing: run `qwen27b qualify` on the host and watch the count")
        if w.get("ecc_enabled") is False:
            add("ECC is off: memory errors go unnoticed and no page is ever retired",
                "set qwen27b_ecc: on (it takes effect after a reboot)")
    return out


@dataclass(frozen=True)
class PowerPlan:
    """What the power unit sets at boot, per GPU, and the ECC mode change asked for."""

    limits: tuple[tuple[int, int], ...]  # (nvidia-smi index, watts)
    reasons: tuple[str, ...]
    ecc_on: tuple[int, ...] = ()  # GPUs whose ECC `nvidia-smi -e 1` turns on (after a reboot)


def power_plan(facts, gpus: list, limit, ecc: str | None, cite_source: str) -> tuple[PowerPlan, list[tuple[str, str]]]:
    """(the plan, refusals as (cause, fix)) for host data `limit` (None, watts for every GPU, or
    {index: watts}) and `ecc` ("on" or None: left as found). Checked against each card's
    power.min_limit..max_limit from GpuWear; a card whose range was not read gets no cap."""
    wear = {w["index"]: w for w in ((facts.wear or {}).get("gpus") or [])}
    indices = [g.index for g in gpus]
    have = sorted(g["index"] for g in facts.gpus or [])
    wanted = ({i: limit for i in indices} if isinstance(limit, int)
              else {int(i): w for i, w in (limit or {}).items()})
    limits, reasons, refusals = [], [], []
    for index, watts in sorted(wanted.items()):
        w = wear.get(index)
        if have and index not in have:
            refusals.append((f"qwen27b_power_limit_w names GPU {index}, which the host does not have (it has {have})",
                             "name only the host's GPUs"))
            continue
        if w is None or w.get("power_min_w") is None or w.get("power_max_w") is None:
            reasons.append(f"GPU {index}: {watts} W asked, but its power range was not read: it is checked by "
                           "nvidia-smi at boot")
            limits.append((index, watts))
            continue
        low, high = int(w["power_min_w"]), int(w["power_max_w"])
        if not low <= watts <= high:
            refusals.append((f"qwen27b_power_limit_w {watts} W for GPU {index} is outside its range {low}-{high} W",
                             f"set a value in {low}-{high} W for GPU {index}"))
            continue
        now = w.get("power_limit_w")
        reasons.append(f"GPU {index}: {watts} W (now {now:.0f} W, range {low}-{high} W) {cite_source}"
                       if now is not None else f"GPU {index}: {watts} W (range {low}-{high} W) {cite_source}")
        limits.append((index, watts))
    ecc_on = ()
    if ecc == "on":
        ecc_on = tuple(i for i in indices if (wear.get(i) or {}).get("ecc_enabled") is False)
    return PowerPlan(tuple(limits), tuple(reasons), ecc_on), refusals
