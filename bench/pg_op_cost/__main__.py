"""``python -m bench.pg_op_cost``: see ``runner.py``."""

import sys

from .runner import main

sys.exit(main())
