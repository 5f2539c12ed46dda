"""Decode and prefill: nexttok vs llama.cpp's own llama-bench on the same GGUF, in alternating rounds.

    python bench/native.py                          # the default model's Q4_1 file
    python bench/native.py FILE.gguf --rounds 7     # any GGUF (e.g. the Qwen2.5-Coder-0.5B Q4_K_M)

llama-bench comes from ../shared/tools/build-llama-cpp.sh (or --llama-cpp-bin / $NEXTTOK_LLAMA_CPP_BIN).
Prints each engine's median tokens/s with its range over the rounds, and the ratio's median and range
(nexttok.bench_native; `nexttok bench` prints the same after its own table).
"""

from __future__ import annotations

import argparse
import sys

from nexttok.bench_native import compare, llama_cpp_bin
from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.checkpoints.sources import resolve_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--llama-cpp-bin", default=None)
    args = parser.parse_args()
    binary = llama_cpp_bin(args.llama_cpp_bin)
    if binary is None:
        sys.exit("no llama-bench found: run ../shared/tools/build-llama-cpp.sh, or pass --llama-cpp-bin DIR")
    print(compare(str(resolve_checkpoint(args.model)), binary, threads=args.threads, prompt=args.prompt_tokens,
                  new=args.new_tokens, rounds=args.rounds))


if __name__ == "__main__":
    main()
