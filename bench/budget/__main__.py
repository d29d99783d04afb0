"""``python -m bench.budget``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
