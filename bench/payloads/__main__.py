"""``python -m bench.payloads``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
