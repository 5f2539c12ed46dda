#!/usr/bin/env bash
# Set up (first time only), lint, and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff check src tests bench scripts
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
exit "$status"
