"""`qwen27b key new FILE [--name NAME]`: a new client key for the gateway (an API user, or the key a
chat page account maps to), random, written once into a 0600 file; the key itself is never printed,
only the inventory entry that names its file.

    qwen27b key new secrets/alice.key --name alice
    -> {"file": "secrets/alice.key", "name": "alice"}   (add it to qwen27b_gateway_key_files)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qwen27b.controller.apikey import ensure, new_key
from qwen27b.plan.gateway import CLIENT_NAME, key_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen27b key", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="write a new random key into FILE (0600; refused if FILE exists)")
    new.add_argument("file", type=Path)
    new.add_argument("--name", help="the key's name in the request log and usage (default: the file's name)")
    args = parser.parse_args(argv)
    name = args.name or key_name(str(args.file))
    if not CLIENT_NAME.fullmatch(name):
        print(f"qwen27b key: the name {name!r} is not 1-64 of A-Z a-z 0-9 . _ -: give --name", file=sys.stderr)
        return 2
    try:
        made = ensure(args.file, new_key() + "\n")
    except OSError as error:
        print(f"qwen27b key: cannot write {args.file}: {error.strerror}", file=sys.stderr)
        return 1
    if not made:
        print(f"qwen27b key: {args.file} exists: keys are never overwritten (remove it to rotate, or pick another file)",
              file=sys.stderr)
        return 1
    print(json.dumps({"file": str(args.file), "name": name}))
    print(f"# {args.file}: a new key (0600). Add the line above to qwen27b_gateway_key_files and re-run the gateway's "
          "deploy; give the key to its user from that file.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
