"""What quantization costs in quality: perplexity over a public-domain text, and greedy agreement.

    python bench/perplexity.py                       # the default model's GGUF, botchan.txt
    python bench/perplexity.py --model FILE.gguf --text FILE.txt --tokens 8192

Runs the same GGUF four ways in nexttok — dequantized to float32 (the reference), as shipped
(its own 4-bit blocks), and re-quantized our way to int8 and int4 — plus llama.cpp on the file
when llama-cpp-python is installed. Perplexity = exp(mean negative log-likelihood) of each token
given the ones before it, in non-overlapping windows of --window tokens (the same windows for
every engine). Then greedy continuations of 10 prompts × 32 tokens, compared token by token
with float32: how many are equal throughout, and the mean number of tokens before the first
difference. The text defaults to sentencepiece's test/botchan.txt (Natsume Soseki's
"Botchan" in English, public domain), fetched with `pip download` of the sentencepiece sdist.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from nexttok.checkpoints.loading import load_checkpoint
from nexttok.checkpoints.sources import resolve_checkpoint
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.models.cache import KVCache

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "To make a cup of tea, first", "Photosynthesis is the process",
           "import numpy as np\n", "The largest planet in the solar system", "Dear hiring manager,",
           "In 1969, the first humans"]
WAYS = {"float32": "float32", "as shipped": "auto", "int8": "int8", "int4": "int4"}


def botchan() -> str:
    """sentencepiece's test text, from its sdist (downloaded once into a temporary folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "sentencepiece==0.2.3", "-d", tmp], check=True)
        with tarfile.open(next(Path(tmp).glob("sentencepiece-*.tar.gz"))) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith("test/botchan.txt"))
            return archive.extractfile(member).read().decode("utf-8").replace("\r\n", "\n")  # as read_text does


def windows(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids) - 1, size) if len(ids[i : i + size]) > 1]


@torch.inference_mode()
def nexttok_nll(model, chunks: list[list[int]]) -> tuple[float, int]:
    """(summed negative log-likelihood, tokens scored)."""
    total, count = 0.0, 0
    dtype = next(model.parameters()).dtype
    for chunk in chunks:
        ids = torch.tensor([chunk])
        cache = KVCache.for_model(model.config, max_len=len(chunk), dtype=dtype)
        logprobs = torch.log_softmax(model(ids, cache)[0, :-1].float(), -1)  # (T-1, vocab)
        total -= float(logprobs.gather(1, ids[0, 1:, None]).sum())
        count += len(chunk) - 1
    return total, count


def llama_cpp_nll(path: str, chunks: list[list[int]], threads: int) -> tuple[float, int]:
    import numpy as np
    from llama_cpp import Llama

    size = max(len(c) for c in chunks)
    llm = Llama(model_path=path, n_ctx=size, n_batch=size, n_threads=threads, n_threads_batch=threads,
                logits_all=True, verbose=False)
    total, count = 0.0, 0
    for chunk in chunks:
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[: len(chunk) - 1], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total -= float(logprobs[np.arange(len(chunk) - 1), chunk[1:]].sum())
        count += len(chunk) - 1
    return total, count


def greedy(checkpoint) -> list[list[int]]:
    params = SamplingParams(temperature=0)
    return [generate(checkpoint.model, checkpoint.tokenizer, p, params, max_tokens=32, stop_token_ids=[]).token_ids
            for p in PROMPTS]


def llama_cpp_greedy(path: str, prompts: list[list[int]], threads: int) -> list[list[int]]:
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=256, n_threads=threads, n_threads_batch=threads, verbose=False)
    runs = []
    for ids in prompts:
        tokens = []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            tokens.append(token)
            if len(tokens) == 32:
                break
        runs.append(tokens)
    return runs


def agreement(runs: list[list[int]], expected: list[list[int]]) -> str:
    """'9/10, 30.5': prompts whose 32 tokens all equal the reference's; mean tokens before the first
    difference."""
    same = sum(a == b for a, b in zip(runs, expected, strict=True))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(b))
              for a, b in zip(runs, expected, strict=True)]
    return f"{same}/{len(expected)}, {sum(prefix) / len(prefix):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--text", default=None, help="a UTF-8 text file (default: botchan.txt)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = str(resolve_checkpoint(args.model))
    text = Path(args.text).read_text(encoding="utf-8") if args.text else botchan()
    reference = load_checkpoint(path, dtype="float32")
    chunks = windows(reference.tokenizer.encode(text, add_special=False)[: args.tokens], args.window)
    print(f"{path}: {sum(len(c) - 1 for c in chunks)} tokens scored in windows of {args.window}")
    rows, expected = [], greedy(reference)
    for label, dtype in WAYS.items():
        checkpoint = reference if dtype == "float32" else load_checkpoint(path, dtype=dtype)
        start = time.perf_counter()
        nll, count = nexttok_nll(checkpoint.model, chunks)
        seconds = time.perf_counter() - start
        rows.append((f"nexttok {label}", math.exp(nll / count), seconds, agreement(greedy(checkpoint), expected)))
    if path.endswith(".gguf"):
        try:
            start = time.perf_counter()
            nll, count = llama_cpp_nll(path, chunks, args.threads)
            seconds = time.perf_counter() - start
            prompts = [reference.tokenizer.encode(p, add_special=True) for p in PROMPTS]
            same = agreement(llama_cpp_greedy(path, prompts, args.threads), expected)
            rows.append(("llama.cpp (same file)", math.exp(nll / count), seconds, same))
        except ImportError:
            print("llama.cpp: skipped (llama-cpp-python is not installed)")
    base = rows[0][1]
    print(f"{'engine':<24}{'perplexity':>12}{'vs float32':>12}{'seconds':>10}"
          "   greedy = float32 (prompts, mean prefix)")
    for name, ppl, seconds, same in rows:
        print(f"{name:<24}{ppl:>12.3f}{100 * (ppl / base - 1):>+11.2f}%{seconds:>10.1f}   {same}")


if __name__ == "__main__":
    main()
