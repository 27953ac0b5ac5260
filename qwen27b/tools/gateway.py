"""`qwen27b gateway`: a backend in or out of every gateway's pool, by hand (a rollout calls the same
functions: qwen27b/controller/gateway_drain.py).

    qwen27b gateway status INVENTORY                  # each gateway: pool, drained, health rounds
    qwen27b gateway drain INVENTORY HOST [--wait S]   # out of the pool; returns when its requests ended
    qwen27b gateway undrain INVENTORY HOST            # back; returns once it is in the pool (healthy)
    qwen27b gateway usage INVENTORY [--since 1d]      # each key's requests, 429s and tokens (request log; 10m, 1h, 7d)

Exit code 0 when every gateway did it, 1 otherwise (the reason printed per gateway).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from qwen27b.controller import gateway_drain as D
from qwen27b.controller.report import table


def usage_table(gateway: str, record: dict) -> str:
    """One gateway's usage per key as a table (the keys' names; never a key)."""
    rows = [[name, str(u["requests"]), str(u["errors"]), str(u["limited"]), str(u["prompt_tokens"]),
             str(u["completion_tokens"]), f"{u['seconds'] / u['requests']:.2f}" if u["requests"] else "-"]
            for name, u in sorted(record.get("keys", {}).items())]
    head = f"{gateway}: usage per key, last {record.get('since', '?')} (the request log)"
    if not rows:
        return f"{head}: no request with a key"
    return f"{head}\n" + table(["key", "requests", "errors", "429", "prompt tokens", "completion tokens", "mean s"], rows,
                                [64, 10, 8, 8, 14, 18, 8])


WINDOW = re.compile(r"([1-9][0-9]{0,5})(s|m|min|h|d)")
WINDOW_HELP = "N followed by s, m (or min), h or d (default 1d)"


def parse_window(value: str) -> str:
    """A --since window as the gateway's on-host `usage` and journalctl take it: 10m is sent as
    10min (the on-host module, qwen27b/onhost/gateway_pool.py WINDOW, knows 'min' only; it is left
    as it is, since a change would be pushed to, and hashed on, every serving host). ValueError
    names what is accepted."""
    match = WINDOW.fullmatch(value or "")
    if not match:
        raise ValueError(f"--since {value!r}: give N followed by s, m (or min), h or d, e.g. 10m, 1h, 7d")
    return match.group(1) + ("min" if match.group(2) == "m" else match.group(2))


def _since(value: str) -> str:
    """--since, checked here before any gateway is reached (argparse's usage error, exit 2)."""
    try:
        return parse_window(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen27b gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    p_status = sub.add_parser("status", help="every gateway's pool")
    p_status.add_argument("inventory")
    p_usage = sub.add_parser("usage", help="each key's requests and tokens over a window, from every gateway's log")
    p_usage.add_argument("inventory")
    p_usage.add_argument("--since", default="1d", type=_since, help=WINDOW_HELP + "; checked before connecting")
    for name, about in (("drain", "take HOST out of every gateway's pool"), ("undrain", "let HOST return")):
        p = sub.add_parser(name, help=about)
        p.add_argument("inventory")
        p.add_argument("host")
        p.add_argument("--wait", type=float, default=600.0 if name == "drain" else 300.0,
                       help="seconds to wait for its requests to end (drain) or for it to be back in the pool")
    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            answers = D.status(args.inventory)
        elif args.command == "usage":
            answers = D.usage(args.inventory, args.since)
        elif args.command == "drain":
            answers = D.drain(args.inventory, args.host, args.wait, check=False)
        else:
            answers = D.undrain(args.inventory, args.host, args.wait, check=False)
    except (D.GatewayDrainError, ValueError) as error:
        print(f"qwen27b gateway: {error}", file=sys.stderr)
        return 1
    if not answers:
        print("qwen27b gateway: no host of the qwen27b_gateway group in this inventory", file=sys.stderr)
        return 0
    for a in answers:
        if args.json:
            print(json.dumps({"gateway": a.gateway, "ok": a.ok, "error": a.error, **a.record}, sort_keys=True))
        elif not a.ok:
            print(f"{a.gateway}: FAILED: {a.error}")
        elif args.command == "usage":
            print(usage_table(a.gateway, a.record))
        else:
            pool, drained = ", ".join(a.record.get("pool", [])) or "none", ", ".join(a.record.get("drained", []))
            share = a.record.get("fair_share")
            print(f"{a.gateway}: pool {pool}" + (f"; drained {drained}" if drained else "")
                  + (f"; fair share {share} at once per key" if share else "")
                  + (f"; waited {a.record['waited_s']} s" if "waited_s" in a.record else ""))
    return 0 if all(a.ok for a in answers) else 1


if __name__ == "__main__":
    sys.exit(main())
