#!/usr/bin/env bash
# Set up (first time only) and run the nexttok CLI: scripts/run.sh tokenize gpt2 "Hello"
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" >&2
exec "$root/.venv/bin/nexttok" "$@"
