"""``python3 -m qwen27b.tools.cpu_smoke wheelhouse|model|check``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
