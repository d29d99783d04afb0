"""``python -m bench.adapters``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
