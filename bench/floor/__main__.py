"""``python -m bench.floor``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
