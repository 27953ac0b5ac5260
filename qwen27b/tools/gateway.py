"""`qwen27b gateway`: a backend in or out of every gateway's pool, by hand (a rollout calls the same
functions: qwen27b/controller/gateway_drain.py).

    qwen27b gateway status INVENTORY                  # each gateway: pool, drained, health rounds
    qwen27b gateway drain INVENTORY HOST [--wait S]   # out of the pool; returns when its requests ended
    qwen27b gateway undrain INVENTORY HOST            # back; returns once it is in the pool (healthy)

Exit code 0 when every gateway did it, 1 otherwise (the reason printed per gateway).
"""

from __future__ import annotations

import argparse
import json
import sys

from qwen27b.controller import gateway_drain as D


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen27b gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    p_status = sub.add_parser("status", help="every gateway's pool")
    p_status.add_argument("inventory")
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
        else:
            pool, drained = ", ".join(a.record.get("pool", [])) or "none", ", ".join(a.record.get("drained", []))
            print(f"{a.gateway}: pool {pool}" + (f"; drained {drained}" if drained else "")
                  + (f"; waited {a.record['waited_s']} s" if "waited_s" in a.record else ""))
    return 0 if all(a.ok for a in answers) else 1


if __name__ == "__main__":
    sys.exit(main())
