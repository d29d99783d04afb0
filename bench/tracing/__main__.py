"""``python -m bench.tracing``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
