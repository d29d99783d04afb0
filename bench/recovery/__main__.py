"""``python -m bench.recovery``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
