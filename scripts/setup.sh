#!/usr/bin/env bash
# Set up a development environment: the system tools the tests use, and .venv with zincir and
# its test extra. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# sqlite3 (the crash-kill script queries the database with it) and Chromium (the inspector's
# browser test) come from Debian's packages.
missing=()
command -v sqlite3 >/dev/null || missing+=(sqlite3)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing ${missing[*]} with apt-get" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "warning: please install ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
    fi
fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
