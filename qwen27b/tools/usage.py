"""`qwen27b usage INVENTORY [--since 1d] [--json]`: each gateway key's requests, errors, 429s and
tokens over a window, summed from every gateway's request log (issue 28's name for `qwen27b
gateway usage`, which this runs: qwen27b/tools/gateway.py)."""

from __future__ import annotations

import sys

from qwen27b.tools import gateway


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return gateway.main((["--json"] if "--json" in argv else []) + ["usage"] + [a for a in argv if a != "--json"])


if __name__ == "__main__":
    sys.exit(main())
