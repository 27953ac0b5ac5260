"""qwen27b qualify's on-host part (issue 27): a bounded burn-in of each GPU with the release venv's torch.

    <venv>/bin/python -m qwen27b_onhost.qualify [--minutes N] [--json-dir DIR] [--dry]

Per GPU, at once: fp16 matmuls near the card's tensor peak, device-to-device copies for memory
traffic, and a memory pattern check (a share of the free memory filled with a known pattern and
read back after the load). nvidia-smi is read before, every few seconds under load, and after:
ECC counts, retired pages pending, throttle reasons, SM/memory clocks, temperature, power, the
PCIe link (trained under load: an idle link drops its generation to save power); the kernel log's
Xids since the start. Each GPU gets a verdict (`judge`, pure) and a JSON record; stdout ends with
one line per GPU, `QUALIFY-JSON <record>`, which the controller's `qwen27b qualify` reads.

`--dry` (a host without an NVIDIA GPU: the CPU profile) runs the same loop on the CPU for a few
seconds with no nvidia-smi readings, so the path is exercised without a GPU (tests, CI).
Stdlib + torch only (torch is imported lazily: the release venv has it, the controller need not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from .gpu import THROTTLE_BAD, decode_throttle, read_xids

MARKER = "QUALIFY-JSON "
# --query-gpu fields read before, under load and after (clocks_throttle_reasons.* is the name every
# driver since R3xx takes; R535+ also calls it clocks_event_reasons)
FIELDS = ("index", "name", "pci.bus_id", "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
          "retired_pages.pending", "clocks_throttle_reasons.active", "clocks.sm", "clocks.mem", "clocks.max.sm",
          "temperature.gpu", "power.draw", "power.limit", "pcie.link.gen.current", "pcie.link.gen.max",
          "pcie.link.width.current", "pcie.link.width.max")
KEYS = ("index", "name", "bus_id", "ecc_corrected", "ecc_uncorrected", "retired_pending", "throttle", "sm_mhz",
        "mem_mhz", "sm_max_mhz", "temperature_c", "power_w", "power_limit_w", "pcie_gen", "pcie_gen_max",
        "pcie_width", "pcie_width_max")
HOT_C = 85
PATTERN_MULTIPLIER = 507952113  # odd: index * it (mod 2**32) visits every bit pattern, no two words alike
VERDICTS = ("PASS", "WARN", "FAIL", "DRY")


def parse_query(text: str) -> list[dict]:
    """nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits -> one dict per GPU ([N/A] -> None)."""
    out = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(FIELDS) or not fields[0].isdigit():
            continue
        row: dict = {}
        for key, value in zip(KEYS, fields):
            if value in ("[N/A]", "N/A", "[Not Supported]", "Not Supported", ""):
                row[key] = None
            elif key in ("name", "bus_id"):
                row[key] = value
            elif key == "retired_pending":
                row[key] = value == "Yes"
            elif key == "throttle":
                row[key] = decode_throttle(int(value, 16)) if value.startswith("0x") else None
            else:
                try:
                    row[key] = float(value) if "." in value else int(value)
                except ValueError:
                    row[key] = None
        out.append(row)
    return out


def read_smi() -> list[dict]:
    """One nvidia-smi reading of every GPU; [] without nvidia-smi or when it fails."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_query(done.stdout) if done.returncode == 0 else []


def _max(samples: list[dict], key: str):
    values = [s[key] for s in samples if s.get(key) is not None]
    return max(values) if values else None


def _min(samples: list[dict], key: str):
    values = [s[key] for s in samples if s.get(key) is not None]
    return min(values) if values else None


def judge(before: dict, after: dict, load: list[dict], xids: list[dict], work: dict) -> tuple[str, list[str]]:
    """(verdict, reasons) for one GPU. FAIL: what a used card must not do under load (new uncorrected
    ECC errors, pages newly pending retirement, an Xid, a wrong pattern read back, the work failed,
    hardware slowdown / power brake); WARN: what wants a look (corrected ECC errors, a link trained
    below its max under load, hot, thermal software slowdown); PASS otherwise."""
    fail, warn = [], []
    if work.get("error"):
        fail.append(f"the load failed: {work['error']}")
    if work.get("pattern_errors"):
        fail.append(f"memory pattern check: {work['pattern_errors']} wrong value(s) read back")
    grew = lambda key: (after.get(key) or 0) - (before.get(key) or 0)  # noqa: E731
    if grew("ecc_uncorrected") > 0:
        fail.append(f"{grew('ecc_uncorrected')} new uncorrected ECC error(s)")
    if after.get("retired_pending") and not before.get("retired_pending"):
        fail.append("pages newly pending retirement (reboot, then qualify again)")
    for x in xids:
        fail.append(f"Xid {x['xid']} during the run: {x.get('message') or ''}".rstrip(": "))
    reasons = sorted({r for s in load for r in (s.get("throttle") or [])})
    bad = [r for r in reasons if r in THROTTLE_BAD and r != "sw_thermal"]
    if bad:
        fail.append(f"slowed by {', '.join(bad)} under load (power delivery or cooling)")
    if grew("ecc_corrected") > 0:
        warn.append(f"{grew('ecc_corrected')} new corrected ECC error(s)")
    gen, width = _min(load, "pcie_gen"), _min(load, "pcie_width")
    if gen is not None and before.get("pcie_gen_max") and gen < before["pcie_gen_max"]:
        warn.append(f"PCIe gen {gen} of {before['pcie_gen_max']} under load")
    if width is not None and before.get("pcie_width_max") and width < before["pcie_width_max"]:
        warn.append(f"PCIe x{width} of x{before['pcie_width_max']} under load")
    hot = _max(load, "temperature_c")
    if hot is not None and hot >= HOT_C:
        warn.append(f"{hot} C under load (>= {HOT_C} C)")
    if "sw_thermal" in reasons:
        warn.append("thermal slowdown (sw_thermal) under load")
    return ("FAIL" if fail else "WARN" if warn else "PASS"), fail + warn


# ----------------------------------------------------------------------------------------- the load

def rates(size: int, matmuls: int, seconds: float, copy_bytes: int, copies: int, copy_seconds: float) -> dict:
    """TFLOP/s over the loop; copy GB/s over the copies' own time, bytes read + written (V100: ~800)."""
    return {"tflops": round(2 * size ** 3 * matmuls / seconds / 1e12, 2) if seconds > 0 else 0.0,
            "copy_rw_gbs": round(2 * copy_bytes * copies / copy_seconds / 1e9, 1) if copy_seconds > 0 else 0.0}


def _burn(device: str, seconds: float, out: dict, size: int, fill_fraction: float,
          loading: threading.Event | None = None) -> None:
    """Matmuls, copies and a pattern check on one device until `seconds` pass; the counts into `out`."""
    loading = loading or threading.Event()
    try:
        import torch
    except ImportError as error:
        if device == "cpu":  # the dry path without torch: the loop's shape in plain Python
            start, n = time.monotonic(), 0
            while time.monotonic() - start < min(seconds, 1.0):
                sum(i * i for i in range(10_000))
                n += 1
            out.update(backend="python (no torch)", seconds=round(time.monotonic() - start, 1), loops=n)
            return
        out["error"] = f"no torch in this venv ({error})"
        return
    try:
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        dev = torch.device(device)
        if device.startswith("cuda"):
            torch.cuda.set_device(dev)
            free, _total = torch.cuda.mem_get_info(dev)
        else:
            free = 64 << 20
        # the pattern: a share of the free memory, int32 words of a known sequence, read back at the end
        words = min(1 << 30, max(1 << 20, int(free * fill_fraction) // 4))  # int32 indices: at most 4 GiB
        chunk = 1 << 24
        pattern = torch.arange(words, dtype=torch.int32, device=dev).mul_(PATTERN_MULTIPLIER)
        a = torch.randn(size, size, dtype=dtype, device=dev)
        b = torch.randn(size, size, dtype=dtype, device=dev)
        src = torch.empty(max(1 << 20, int(free * 0.05) // 2), dtype=torch.float16, device=dev).normal_()
        dst = torch.empty_like(src)
        sync = (lambda: torch.cuda.synchronize(dev)) if device.startswith("cuda") else (lambda: None)
        matmuls = copies = 0
        copy_seconds = 0.0
        loading.set()
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            for _ in range(20):
                c = a @ b
                matmuls += 1
            sync()
            t0 = time.monotonic()
            dst.copy_(src)
            sync()
            copy_seconds += time.monotonic() - t0
            copies += 1
        elapsed = time.monotonic() - start
        loading.clear()
        mismatched = 0
        for first in range(0, words, chunk):  # regenerated a chunk at a time: no second copy of the pattern
            n = min(chunk, words - first)
            want = torch.arange(first, first + n, dtype=torch.int32, device=dev).mul_(PATTERN_MULTIPLIER)
            mismatched += int((pattern[first:first + n] != want).sum().item())
        out.update(seconds=round(elapsed, 1), matmuls=matmuls, matmul_n=size, copies=copies,
                   copy_seconds=round(copy_seconds, 3), **rates(size, matmuls, elapsed, src.numel() * 2, copies, copy_seconds),
                   pattern_mib=round(words * 4 / 2 ** 20), pattern_errors=mismatched, finite=bool(torch.isfinite(c).all().item()))
        if not out["finite"]:
            out["error"] = "a matmul gave non-finite values"
    except Exception as error:  # noqa: BLE001 - a GPU that fails is the finding, not a crash
        loading.clear()
        out["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def run(minutes: float, dry: bool = False, sample_s: float = 2.0, size: int = 8192, fill_fraction: float = 0.4,
        now=time.time) -> list[dict]:
    """Burn every GPU at once for `minutes` (dry: the CPU for a few seconds) -> one record per GPU."""
    started = now()
    before = [] if dry else read_smi()
    if not dry and not before:
        dry = True  # no NVIDIA GPU answers: the CPU profile's dry path
    devices = ["cpu"] if dry else [f"cuda:{g['index']}" for g in before]
    seconds = min(5.0, minutes * 60) if dry else minutes * 60
    work = [{} for _ in devices]
    loading = [threading.Event() for _ in devices]
    threads = [threading.Thread(target=_burn, args=(d, seconds, w, 256 if dry else size, fill_fraction, e), daemon=True)
               for d, w, e in zip(devices, work, loading)]
    for t in threads:
        t.start()
    samples: list[list[dict]] = [[] for _ in devices]
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=sample_s / max(1, len(threads)))
        if not dry:
            was = [e.is_set() for e in loading]
            for row in read_smi():  # a load sample: its loop ran before and after the reading
                n = row["index"]
                if n < len(samples) and was[n] and loading[n].is_set():
                    samples[n].append(row)
    after = [] if dry else read_smi()
    xids, source = (None, None) if dry else read_xids(started - 1)
    records = []
    for n, device in enumerate(devices):
        b = before[n] if n < len(before) else {}
        a = next((r for r in after if r["index"] == b.get("index")), {})
        mine = [x for x in xids or [] if b.get("bus_id") and _slot(x["pci"]) == _slot(b["bus_id"])]
        verdict, reasons = ("DRY", ["no NVIDIA GPU: the CPU dry path ran (no GPU was qualified)"]) if dry \
            else judge(b, a, samples[n], mine, work[n])
        load = samples[n]
        records.append({
            "host_gpu": b.get("index", n), "device": device, "name": b.get("name") or "cpu", "bus_id": b.get("bus_id"),
            "verdict": verdict, "reasons": reasons, "minutes": minutes, "started": started,
            "before": b, "after": a, "work": work[n], "xids": mine, "xid_source": source,
            "under_load": {"samples": len(load), "max_temperature_c": _max(load, "temperature_c"),
                           "max_power_w": _max(load, "power_w"), "power_limit_w": b.get("power_limit_w"),
                           "min_sm_mhz": _min(load, "sm_mhz"), "max_sm_mhz": _max(load, "sm_mhz"),
                           "sm_max_mhz": b.get("sm_max_mhz"), "mem_mhz": _max(load, "mem_mhz"),
                           "pcie_gen": _min(load, "pcie_gen"), "pcie_width": _min(load, "pcie_width"),
                           "throttle": sorted({r for s in load for r in (s.get("throttle") or [])})},
        })
    return records


def _slot(address: str) -> str:
    parts = str(address or "").lower().split(":")
    return ":".join(parts[-2:]).split(".")[0]


# ----------------------------------------------------------------------------------------- the table

COLUMNS = ("gpu", "name", "verdict", "TFLOPS", "copy r+w GB/s", "pattern", "max C", "max W / cap", "SM MHz",
           "PCIe (load)", "throttle", "ECC c/u +", "why")


def table_rows(host: str, records: list[dict]) -> list[list[str]]:
    """One row per GPU record (qualify's table, here and on the controller)."""
    rows = []
    for r in records:
        w, u, b, a = r["work"], r["under_load"], r["before"], r["after"]

        def grew(key):
            return (a.get(key) or 0) - (b.get(key) or 0) if a and b else "-"

        link = (f"gen{u['pcie_gen']} x{u['pcie_width']} of gen{b.get('pcie_gen_max')} x{b.get('pcie_width_max')}"
                if u.get("pcie_gen") is not None else "-")
        clocks = f"{u['min_sm_mhz']}-{u['max_sm_mhz']}" if u.get("min_sm_mhz") is not None else "-"
        rows.append([f"{host} {r['host_gpu']}", r["name"], r["verdict"], str(w.get("tflops", "-")),
                     str(w.get("copy_rw_gbs", "-")),
                     f"{w.get('pattern_mib', '-')} MiB, {w.get('pattern_errors', '-')} bad" if "pattern_mib" in w else "-",
                     str(u.get("max_temperature_c") if u.get("max_temperature_c") is not None else "-"),
                     f"{u['max_power_w']} / {u['power_limit_w']}" if u.get("max_power_w") is not None else "-",
                     clocks, link, ",".join(u.get("throttle") or []) or "-",
                     f"{grew('ecc_corrected')}/{grew('ecc_uncorrected')}", "; ".join(r["reasons"]) or "-"])
    return rows


def render_table(host_records: dict[str, list[dict]]) -> str:
    """A plain fixed-width table of every host's GPUs."""
    rows = [row for host, records in host_records.items() for row in table_rows(host, records)]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def parse_records(stdout: str) -> list[dict]:
    """The QUALIFY-JSON lines of a run's output (the controller's side)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            try:
                out.append(json.loads(line[len(MARKER):]))
            except ValueError:
                continue
    return out


def write_records(json_dir: str, records: list[dict]) -> None:
    """qualify-gpu<N>.json in `json_dir`, as root writes into a directory the service user owns
    (issue 51): the directory opened without following a link, each file written to a new name
    (O_EXCL) and renamed over the old one, so a link or hard link planted there is replaced, never
    followed; a directory that is itself a link is refused."""
    try:
        os.mkdir(json_dir, 0o755)
    except FileExistsError:
        pass
    try:
        folder = os.open(json_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise SystemExit(f"qualify: {json_dir} is not a plain directory ({e.strerror}): "
                         "a symbolic link there is refused; remove it and run again") from None
    try:
        for r in records:
            name = f"qualify-gpu{r['host_gpu']}.json"
            part = f".{name}.{os.getpid()}"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(r, fh, indent=1, sort_keys=True)
            os.rename(part, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="qwen27b_onhost.qualify", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="load time per GPU (all GPUs at once)")
    p.add_argument("--json-dir", default=None, help="also write qualify-gpu<N>.json here")
    p.add_argument("--dry", action="store_true", help="the CPU dry path, whatever GPUs the host has")
    p.add_argument("--size", type=int, default=8192, help="the matmul's N (fp16 N x N)")
    args = p.parse_args(argv)
    if not 0 < args.minutes <= 120:
        p.error("--minutes must be in (0, 120]")
    records = run(args.minutes, dry=args.dry, size=args.size)
    print(render_table({os.uname().nodename: records}))
    if args.json_dir:
        write_records(args.json_dir, records)
    for r in records:
        print(MARKER + json.dumps(r, sort_keys=True))
    sys.stdout.flush()
    return 1 if any(r["verdict"] == "FAIL" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
