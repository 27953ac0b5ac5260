"""``python3 -m tests.support.testhosts up|down|status|ssh|reset|check|paths``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
