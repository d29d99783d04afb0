"""``python -m bench.encryption``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
