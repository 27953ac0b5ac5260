"""`qwen27b profiles [INVENTORY [--limit HOST]] [--json]`: the engine profile catalog, and which entries fit each host.

Without an inventory: every entry of the stack's catalog (qwen27b/plan/catalog.py): name, engine,
target, draft, speculative methods, the hardware it was validated on and the figures measured there,
labelled with who measured them. With an inventory: each host's gate facts are read (read-only, as
`qwen27b reach` and doctor read them) and every entry is planned for it by the gate and planner
themselves (qwen27b_engine_profile set to that entry): what the plan serves (method, context, TP),
what it changed from the entry (draft dropped, context lowered) and the entry's validated GPU count
and links beside the host's; or, where it does not fit, the gate's own causes (compute capability,
memory with the draft whole on every card, GPU count). Nothing is installed or changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace

from qwen27b.plan import catalog


@dataclass(frozen=True)
class Fit:
    host: str
    entry: str
    fits: bool
    serves: str  # method, context, TP as planned; "" where it does not fit
    why: str  # what the plan changed and the hardware it was validated on; or the refusal's causes
    chosen: bool = False  # the entry this host's own data plans (qwen27b_engine_profile, else the default)


def catalog_rows(stack: dict) -> list[dict]:
    """One row per catalog entry, as `profiles` prints it (and --json gives it)."""
    rows = []
    for name, entry in catalog.entries(stack).items():
        vllm = catalog.profile_of(stack, name)["vllm"]
        models = stack["models"]
        rows.append({
            "name": name, "default": bool(entry.get("default")), "profile": entry["profile"],
            "engine": f"{vllm['dist']}=={vllm['version']}", "engine_sha256": vllm.get("sha256"),
            "target": models[entry["model"]]["id"], "draft": models[entry["draft"]]["id"] if entry.get("draft") else None,
            "methods": catalog.methods(entry), "validated_on": entry.get("validated_on"),
            "validated": catalog.validated_text(entry), "figures": entry.get("figures") or [],
            "figures_text": catalog.figures_text(entry), "description": entry.get("description", ""),
            "source": catalog.ids(entry.get("source"))})
    return rows


def _served(d) -> str:
    flag = {f.name: f.value for f in d.serve.flags}
    tp = flag.get("--tensor-parallel-size")
    return (f"{d.serve.spec.method if d.serve.spec.on else 'no speculation'}, context {flag.get('--max-model-len')}"
            + (f", TP {tp}" if tp else "") + (f", {len(d.copies)} copies" if d.copies else ""))


# the plan's notes that say how it adapted the entry (speculation, copies, GPUs left out); the rest
# (API key, warm-up, CUDA_HOME) are the same for every entry and are in the plan itself
_ADAPTED = ("speculative decoding", "copies", "left out")


def _adapted(entry: dict, entry_profile: dict, d) -> list[str]:
    """What the plan changed from the entry: the draft dropped, the context lowered (with the figure), copies."""
    out, first = [], catalog.methods(entry)[:1]
    for serve in [d.serve] if not d.copies else [c.serve for _, c in d.copies]:
        out += [n for n in serve.notes if any(word in n for word in _ADAPTED)]
        if first and serve.spec.method != first[0] and not any(serve.spec.reason in n for n in out):
            out.append(f"{serve.spec.method if serve.spec.on else 'speculative decoding off'}: {serve.spec.reason}")
        for f in serve.flags:
            if f.name == "--max-model-len" and str(f.value) != str(entry_profile["serve"]["max_model_len"]):
                out.append(f"context {f.value}, not the entry's {entry_profile['serve']['max_model_len']}: {f.reason}")
    return list(dict.fromkeys(out))


def _first_clause(text: str) -> str:
    """`text` up to its first ': ' outside parentheses (the link reading before the rule's why)."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0 and text.startswith(": ", i):
            return text[:i]
    return text


def _hardware(entry: dict, d, known_names: set | None = None) -> str:
    """The entry's validated GPU count and memory beside the plan's (a stated fact, never a refusal)."""
    v = entry.get("validated_on")
    if not v:
        return "no run of this entry on record (not validated)"
    if not v.get("count") or not d.gpus:
        return "the CPU smoke profile: no GPU used" if not v.get("count") and d.gpus else ""
    gib, out = round(min(g.memory_mib for g in d.gpus) / 1024), []
    other_board = v.get("gpu") in (known_names or set()) and all(g.name != v["gpu"] for g in d.gpus)
    if len(d.gpus) != v["count"] or gib != v.get("memory_gib") or other_board:
        board = f" {v['gpu']}" if other_board else ""
        out.append(f"validated on {v['count']}x{board} {v.get('memory_gib')} GiB ({v['by']}), this plan uses "
                   f"{len(d.gpus)}x {gib} GiB ({d.gpus[0].name})")
    off = next((f.reason for f in d.serve.flags if f.name == "--disable-custom-all-reduce"), None)
    if v.get("links") == "nvlink" and off:  # the planner's own link reading (plan/topology.py), its first clause
        out.append(f"links: validated on NVLink with custom all-reduce; here it is off ({_first_clause(off)})")
    return "; ".join(out)


def host_fits(host: str, facts, settings, stack: dict, decide=None) -> list[Fit]:
    """Every catalog entry planned for one host by the gate and planner (`decide`: serving.decide)."""
    from qwen27b.plan.gate import RefusedHost
    from qwen27b.plan.stack import StackError

    if decide is None:
        from qwen27b.plan.serving import decide
    out, own = [], settings.engine_profile
    # a serving group's member is planned here as a host alone: the group's pipeline needs every member's facts
    alone = f"planned alone (qwen27b_node_group {settings.node_group}: the group's pipeline is not planned here); " \
        if settings.node_group else ""
    try:
        own = decide(host, facts, stack, settings).entry.name
    except (RefusedHost, StackError):
        pass
    for name, entry in catalog.entries(stack).items():
        trial = replace(settings, engine_profile=name, profile="cpu-smoke" if entry["profile"] == "cpu-smoke" else None)
        try:
            d = decide(host, facts, stack, trial)
        except RefusedHost as refused:
            out.append(Fit(host, name, False, "", alone + "; ".join(cause for cause, _ in refused.problems), name == own))
            continue
        except StackError as error:
            out.append(Fit(host, name, False, "", str(error), name == own))
            continue
        known = {n for g in stack.get("gpus") or [] for n in g.get("names") or []}  # nvidia-smi's board names
        why = "; ".join(x for x in _adapted(entry, catalog.profile_of(stack, name), d) + [_hardware(entry, d, known)] if x)
        out.append(Fit(host, name, True, _served(d), alone + (why or "as validated"), name == own))
    return out


def _wrap_table(headers, rows, widths) -> str:
    from qwen27b.controller.report import table
    return table(headers, rows, widths)


def catalog_table(rows: list[dict]) -> str:
    return _wrap_table(["entry", "engine", "target", "draft", "methods", "validated on", "measured (by whom)"],
                       [[r["name"] + (" (default)" if r["default"] else "") + f" [{r['profile']}]", r["engine"],
                         r["target"], r["draft"] or "-", ", ".join(r["methods"]) or "-", r["validated"],
                         r["figures_text"]] for r in rows],
                       [26, 20, 30, 26, 12, 30, 40])


def fits_table(fits: list[Fit]) -> str:
    """One row per host and entry; `*` marks the entry the host's own data plans."""
    return _wrap_table(["host", "entry (* planned)", "fits", "serves", "why / what the plan changed"],
                       [[f.host, f.entry + (" *" if f.chosen else ""), "yes" if f.fits else "no", f.serves or "-", f.why]
                        for f in fits], [max([4] + [len(f.host) for f in fits]), 22, 4, 30, 80])


def read_host(state, host, stack: dict):
    """(facts, settings, None) or (None, None, why) for one inventory host: its gate facts, read-only."""
    from qwen27b.plan.hostdata import BadHostData, settings_for
    from qwen27b.tools.doctor.collection import fact_commands, run_phase
    from qwen27b.tools.doctor.context import host_facts
    from qwen27b.tools.doctor.model import HostSnapshot

    try:
        settings = settings_for(host.name, dict(host.data.dict()))
    except BadHostData as bad:
        return None, None, str(bad)
    commands = {key: command for key, (_, command) in fact_commands(stack["paths"]).items()}
    outputs, _, error = run_phase(state, host, commands, 300)
    if error:
        return None, None, error
    return host_facts(HostSnapshot(host=host.name, outputs=outputs)), settings, None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qwen27b profiles", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", nargs="?", help="pyinfra inventory file (as for deploy.py): which entries fit each host")
    p.add_argument("--limit", nargs="+", action="extend", metavar="HOST", help="only these hosts or groups (globs)")
    p.add_argument("--json", action="store_true", help="JSON for machines instead of the tables")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.limit and not args.inventory:
        print("profiles: --limit needs an INVENTORY", file=sys.stderr)
        return 2
    from qwen27b.plan.stack import load_stack

    stack = load_stack()
    rows, fits = catalog_rows(stack), []
    if args.inventory:
        from gevent import monkey  # as pyinfra's CLI: hosts overlap
        monkey.patch_all()
        from qwen27b.controller import remote

        selected = remote.selected_hosts("profiles", args.inventory, args.limit)
        if selected is None:
            return 2
        state, hosts = selected

        def one(host):
            facts, settings, why = read_host(state, host, stack)
            if facts is None:
                return [Fit(host.name, "(the host)", False, "", why)]
            return host_fits(host.name, facts, settings, stack)

        results = remote.on_every_host(state, hosts, one, lambda h, why: [Fit(h.name, "(the host)", False, "", why)])
        fits = [f for host_fits_ in results for f in host_fits_]
    if args.json:
        print(json.dumps({"catalog": rows, "hosts": [asdict(f) for f in fits]}, indent=2))
        return 0
    print(catalog_table(rows))
    if fits:
        print()
        print(fits_table(fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
