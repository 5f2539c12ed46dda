"""The BPE merge loop, exactly as HF `tokenizers` runs it (its Word::merge_all).

A word starts as a list of symbols (vocab strings); the adjacent pair with the lowest merge rank
is merged, the leftmost first among equals, until no adjacent pair has a rank. A heap of
(rank, position) keeps each step O(log n), which matters for SentencePiece-style tokenizers: with
no pre-tokenizer, a whole paragraph is one "word".

Ranks come from tokenizer.json's merges (their order) or, for a GGUF SentencePiece vocabulary,
from its token scores (gguf_tokenizer.merges_from_scores turns scores into that order).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

Ranks = dict[tuple[str, str], int]


def merge(symbols: list[str], ranks: Ranks) -> list[str]:
    """Merge a word's symbols by rank: merge(["a", "b", "c"], {("b", "c"): 0, ("a", "bc"): 1}) -> ["abc"]."""
    n = len(symbols)
    if n < 2:
        return symbols
    if n == 2:
        return [symbols[0] + symbols[1]] if (symbols[0], symbols[1]) in ranks else symbols
    parts: list[str | None] = list(symbols)
    after = [*range(1, n), -1]  # a doubly linked list over the symbols still alive
    before = list(range(-1, n - 1))
    heap = [(rank, i, symbols[i] + symbols[i + 1]) for i in range(n - 1)
            if (rank := ranks.get((symbols[i], symbols[i + 1]))) is not None]
    heapify(heap)
    while heap:
        _, i, merged = heappop(heap)
        left = parts[i]
        j = after[i]
        if left is None or j == -1:
            continue
        right = parts[j]
        # an entry made stale by an earlier merge: HF checks the pair still makes the same token
        if left + right != merged or (left, right) not in ranks:
            continue
        parts[i], parts[j] = merged, None
        after[i] = after[j]
        if after[j] != -1:
            before[after[j]] = i
        if (p := before[i]) != -1 and (rank := ranks.get((parts[p], merged))) is not None:
            heappush(heap, (rank, p, parts[p] + merged))
        if (k := after[i]) != -1 and (rank := ranks.get((merged, parts[k]))) is not None:
            heappush(heap, (rank, i, merged + parts[k]))
    return [p for p in parts if p is not None]
