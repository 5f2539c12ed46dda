"""`nexttok run`'s printed decode rate against the bench's, in one process, alternating rounds.

    python bench/run_vs_bench.py               # 9 rounds
    python bench/run_vs_bench.py --rounds 15

run sums each step's own time (generation.loop.stream, as cli/text.py does); the bench times the
wall clock from the first token (benchmark.decode_rate). Both on the default model, greedy, 128
tokens, from a 16-token random prompt and from a short text prompt. Each round runs the two back to
back, the order turned round every other round, and their ratio (run ÷ bench) is that round's: the
host's swings of ±10% within a minute move both alike, so the median (range) of the ratios is the
gap between the two ways of timing, which the medians of each alone blur.
"""

from __future__ import annotations

import argparse
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"run_vs_bench: --rounds must be at least 1, got {args.rounds}")
    torch.set_num_threads(2)
    checkpoint = load_checkpoint(str(bundled_model_file(DEFAULT_MODEL)))
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    prompts = {"random 16": random_prompt(16, model.config.vocab_size)[0].tolist(),
               "text": tokenizer.encode("Once upon a time", add_special=True)}
    ways = {"bench": lambda ids: decode_rate(model, tokenizer, ids, 128, GREEDY)[0],
            "run": lambda ids: run_rate(model, tokenizer, ids)}
    rates: dict[tuple[str, str], list[float]] = {}
    decode_rate(model, tokenizer, prompts["text"], 8, GREEDY)  # warm-up
    for k in range(args.rounds):
        for prompt, ids in prompts.items():
            for way in (ways if k % 2 == 0 else reversed(ways)):
                rates.setdefault((prompt, way), []).append(ways[way](ids))
    for prompt in prompts:
        run, bench = rates[(prompt, "run")], rates[(prompt, "bench")]
        ratios = [r / b for r, b in zip(run, bench, strict=True)]
        print(f"{prompt:<10} run {statistics.median(run):.1f} tokens/s ({min(run):.1f}-{max(run):.1f}), "
              f"bench {statistics.median(bench):.1f} ({min(bench):.1f}-{max(bench):.1f}); run / bench "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over {args.rounds} rounds")


if __name__ == "__main__":
    main()
