"""``python -m bench.fanout``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
