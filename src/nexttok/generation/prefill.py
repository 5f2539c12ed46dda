"""Prefill: a prompt into a KV cache in chunks, the same cut for `nexttok run` and the server.

A prompt of T tokens is run in forward calls cut at fixed multiples of BLOCK (positions 0..127,
128..255, ...), whether it starts at 0 or after a prefix the server's prefix cache already holds:
so the keys and values of a position, and the last position's logits, are the very same bits on
every path (a longer matmul sums in another order, and 8-bit activations round where they fall).

Smaller chunks reuse more of a prompt in the prefix cache (on average BLOCK / 2 tokens fewer) but
cut every longer prompt into more forward calls, each with a fixed cost. With nexttok's kernels
(SmolLM2-135M Q4_1, 2 threads, a 1,024-token prompt, three runs): 0.95-0.99 s in one call,
0.99-1.03 s cut at 512, 1.00-1.03 s at 256 and 1.08-1.09 s at 128 (+9%); on torch's kernels
(bench/prefix_cache.py --chunk-cost) 2.37 s in one call, 2.55 s at 256, 2.67 s at 128, 3.02 s at
64. A chunk also bounds the activations a prefill holds at once (its attention scores and MLP
rows grow with the chunk, not the prompt).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from nexttok.generation.scoring import PromptScores
from nexttok.models import Model

BLOCK = 128


def prefill_chunks(start: int, end: int, block: int = BLOCK) -> list[tuple[int, int]]:
    """The forward calls that prefill positions start..end-1, cut at multiples of block, so a prompt
    is cut the same way whether it starts at 0 or after a reused prefix.
    prefill_chunks(64, 150, 64) -> [(64, 128), (128, 150)]"""
    cuts = [start, *range((start // block + 1) * block, end, block), end]
    return list(itertools.pairwise(cuts))


def prefill(model: Model, cache, ids: list[int], start: int = 0, scores: PromptScores | None = None,
            block: int = BLOCK, after: Callable[[int], None] | None = None) -> torch.Tensor:
    """Run ids[start:] into cache (a KVCache, or one row of a SlotCache, holding ids[:start]
    already) and return the last token's logits (vocab,). scores: every prompt token from start + 1
    on is scored from its chunk's logits (the whole (chunk, vocab) logits are then computed).
    after(end): called after each chunk, with ids[:end] in the cache (the server's prefix cache
    keeps each block then, while sliding-window layers still hold its keys)."""
    device = next(model.parameters()).device
    logits = None
    for a, b in prefill_chunks(start, len(ids), block):
        logits = model(torch.tensor([ids[a:b]], device=device), cache, last_only=scores is None)[0]
        if scores is not None:
            scores.add(a, logits)
        if after is not None:
            after(b)
    assert logits is not None, "nothing to prefill"
    return logits[-1]
