"""``python -m bench.postgres``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
