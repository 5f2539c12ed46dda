"""`nexttok run`'s printed decode rate against the bench's, in one process, alternating rounds.

    python bench/run_vs_bench.py

run sums each step's own time (generation.loop.stream, as cli/text.py does); the bench times the
wall clock from the first token (benchmark.decode_rate). Both on the default model, greedy, 128
tokens, from a 16-token random prompt and from a short text prompt; medians (range) over 5 rounds.
"""

from __future__ import annotations

import statistics

import torch

from nexttok.benchmark import decode_rate, random_prompt
from nexttok.checkpoints.bundled import DEFAULT_MODEL, bundled_model_file
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.generation.loop import stream
from nexttok.generation.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)


def run_rate(model, tokenizer, ids: list[int], n: int = 128) -> float:
    """Decode tokens/s as `nexttok run` prints it: the decode steps' own seconds summed."""
    steps = list(stream(model, tokenizer, ids, GREEDY, max_tokens=n, stop_token_ids=[], top_n=0, logprobs=False))
    return (len(steps) - 1) / sum(s.elapsed for s in steps if not s.prefill)


def main() -> None:
    torch.set_num_threads(2)
    checkpoint = load_checkpoint(str(bundled_model_file(DEFAULT_MODEL)))
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    prompts = {"random 16": random_prompt(16, model.config.vocab_size)[0].tolist(),
               "text": tokenizer.encode("Once upon a time", add_special=True)}
    rates: dict[str, list[float]] = {}
    decode_rate(model, tokenizer, prompts["text"], 8, GREEDY)  # warm-up
    for _ in range(5):
        for name, ids in prompts.items():
            rates.setdefault(f"bench, {name}", []).append(decode_rate(model, tokenizer, ids, 128, GREEDY)[0])
            rates.setdefault(f"run, {name}", []).append(run_rate(model, tokenizer, ids))
    for name, values in rates.items():
        print(f"{name:<16} {statistics.median(values):.1f} tokens/s ({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
