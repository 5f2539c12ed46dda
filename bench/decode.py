"""Decode and prefill speed: nexttok vs HF transformers generate() (and llama.cpp through
llama-cpp-python on a float32 GGUF of the same weights, when it is installed), one run.

    python bench/decode.py                      # GPT-2-124M-shaped model, random weights
    python bench/decode.py --model DIR_OR_NAME  # any checkpoint (e.g. smollm2-135m-instruct)

Prints medians of decode tokens/s at batch 1 (greedy, 128 new tokens after warm-up), prefill
tokens/s (512-token prompt), time to first token, decode without the KV cache, peak RSS, the
ratios, and the memory-bandwidth roofline. Each engine runs in its own child process.
"""

from __future__ import annotations

import argparse
import tempfile

from nexttok.benchmark import BenchConfig, run
from nexttok.checkpoints.bundled import tokenizer_dir
from nexttok.checkpoints.sources import resolve_checkpoint


def gpt2_124m_random(directory: str) -> str:
    """GPT-2 small's shape (12 layers, 768 wide, 50257 vocab) with random weights, saved as HF,
    with the real GPT-2 tokenizer files beside it."""
    import shutil
    from pathlib import Path

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).eval().save_pretrained(directory)
    source = tokenizer_dir("gpt2")
    shutil.copy(source / "encoder.json", Path(directory) / "vocab.json")
    shutil.copy(source / "vocab.bpe", Path(directory) / "merges.txt")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile", action="store_true", help="add a column with the decode step compiled")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = str(resolve_checkpoint(args.model)) if args.model else gpt2_124m_random(tmp)
        cfg = BenchConfig(directory, new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                          repeat=args.repeat, threads=args.threads, dtype=args.dtype)
        print(f"model: {args.model or 'GPT-2 124M shape, random weights'}; {args.threads} threads; {args.dtype}")
        print(run(cfg, ["nexttok", *(["compiled"] if args.compile else []), "hf", "llama.cpp"]))


if __name__ == "__main__":
    main()
