"""``python -m bench.streams``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
