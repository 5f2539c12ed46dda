#!/usr/bin/env bash
# Set up (first time only), lint, and run the whole test suite. Extra arguments go to pytest.
# Two workers (pytest-xdist; NEXTTOK_TEST_WORKERS=0 runs in one process). Tests go to whichever
# worker is free (a module fixture may then be built on both): 520 s here, where keeping each file
# on one worker (--dist loadfile) took 628 s, its last big files running alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff check src tests bench scripts
status=0
.venv/bin/python -m pytest -n "${NEXTTOK_TEST_WORKERS:-2}" "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
exit "$status"
