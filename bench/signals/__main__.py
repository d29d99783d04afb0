"""``python -m bench.signals``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
