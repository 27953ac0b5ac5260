"""`python -m qwen27b.tools.bench` is `qwen27b bench`."""

import sys

from qwen27b.tools.bench.cli import main

sys.exit(main())
