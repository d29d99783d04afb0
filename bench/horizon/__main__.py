"""``python -m bench.horizon``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
