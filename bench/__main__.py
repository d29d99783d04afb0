"""``python -m bench``: the main comparison, ``bench/compare/``."""

import sys

from .compare.runner import main

sys.exit(main())
