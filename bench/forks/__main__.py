"""``python -m bench.forks``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
