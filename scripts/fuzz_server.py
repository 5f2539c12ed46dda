"""Fuzz the server with schemathesis: thousands of generated requests across every route of
its own /openapi.json, on a loopback server with a tiny model. Reports cases run and failures.

    .venv/bin/python scripts/fuzz_server.py [--max-examples 250]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_target import fuzz, fuzz_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=250, help="per operation")
    args = parser.parse_args()
    failures = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, fuzz_server(Path(tmp)) as live:
        cases = fuzz(live.url, args.max_examples, on_error=lambda op, e: failures.append((op.label, e)))
    print(f"{cases} cases in {time.perf_counter() - start:.0f} s; {len(failures)} operations failed")
    for label, error in failures:
        print(f"FAILED {label}: {str(error)[:2000]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
