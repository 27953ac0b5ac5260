"""`python -m qwen27b.tools.doctor ...`: the same as `qwen27b doctor ...`."""

import sys

from .cli import main


sys.exit(main())
