#!/usr/bin/env bash
# The test command: set up (if needed), then run the whole suite, crash-kill script included.
# -n auto: one pytest-xdist worker per CPU, each with a PostgreSQL server of its own (unless
# ZINCIR_TEST_POSTGRES_URL names one) and, once a test needs it, a Chromium; worksteal: a worker
# left without tests takes over half of another's. Tests that share something beyond one
# process take a lock (see tests/test_multihost.py). Add -n 0 to run all in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest -n auto --dist worksteal "$@"
