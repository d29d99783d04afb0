"""``python -m bench.prune``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
