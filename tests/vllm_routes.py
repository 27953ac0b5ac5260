"""Print every route a `vllm serve` app registers, as JSON: run with the vLLM venv's python.

    <venv>/bin/python tests/vllm_routes.py [TASK ...]

Builds the app the way `vllm serve` does (vLLM's own argument parser with its defaults, then
``build_app(args, supported_tasks)``) without an engine, and walks its route table, mounted apps
included, so tests/servers/test_route_auth.py probes what vLLM registers instead of a hand-kept list.
TASKS: the server's supported tasks (its log says "Supported tasks: [...]"); default "generate".
Output: [{"path": ..., "methods": [...], "kind": "http" | "websocket" | "mount"}, ...]
"""

import json
import sys
import warnings


def walk(routes, prefix=""):
    from starlette.routing import Mount, WebSocketRoute
    for route in routes:
        path = getattr(route, "path", None)
        if path is None:  # a lazily included router (FastAPI >= 0.137): walk what it holds
            yield from walk(getattr(route, "routes", []) or [], prefix)
            continue
        if isinstance(route, Mount):
            inner = getattr(route, "routes", None) or []
            if inner:
                yield from walk(inner, prefix + path)
            else:  # an ASGI app mounted at a prefix (/metrics): every path under it
                yield {"path": prefix + path, "methods": ["GET"], "kind": "mount"}
        elif isinstance(route, WebSocketRoute):
            yield {"path": prefix + path, "methods": [], "kind": "websocket"}
        else:
            yield {"path": prefix + path, "methods": sorted(getattr(route, "methods", None) or ["GET"]),
                   "kind": "http"}


def main(tasks):
    warnings.simplefilter("ignore")
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    app = build_app(args, tuple(tasks or ["generate"]))
    merged: dict = {}  # one row per (path, kind): a path registered twice (GET and POST /ping) merges
    for row in walk(app.routes):
        seen = merged.setdefault((row["path"], row["kind"]), row)
        seen["methods"] = sorted(set(seen["methods"]) | set(row["methods"]))
    json.dump(list(merged.values()), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
