#!/usr/bin/env bash
# The test command: set up (if needed), then run the whole suite, crash-kill script included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest "$@"
