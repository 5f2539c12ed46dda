"""Prefix cache: the keys and values of recent prompts, reused by later prompts that begin the same
way. The next turn of a chat begins with the previous turn's whole prompt, so it prefills only what
is new (the last partial block, the answer and the new message).

The scheme is block hashing, as in vLLM, rather than a radix tree as in SGLang. Three reasons
specific to this engine:

1. Exactness. A request's tokens must not depend on what ran before it, so a reused prefix must
   hold the same bits the request would compute itself. Keys and values depend on how a prefill is
   cut into forward calls, because each call's matmuls and attention pick their kernels by shape.
   Measured on SmolLM2-135M (a 1,000-token random prompt, one call vs calls of 64): keys differ by
   a few bfloat16 ulps, the last logits by 0.25, and the greedy pick changes with calls of 16. So every prompt is
   prefilled in chunks cut at multiples of BLOCK (generation/prefill.py), whether or not a prefix was
   reused. A whole block's keys and values then depend only on its tokens and the ones before it,
   and a reused block holds exactly what the prefill would have computed. A radix tree matches at
   any token, so it would reuse keys computed under another cut: the previous prompt's partial
   last block, or the answer, which decode steps computed one token at a time. Those bits are
   close but not equal.
2. Layout. SlotCache keeps each sequence contiguous in its slot (a decode step attends over views,
   it never gathers), so a reused prefix is copied into the slot either way. Zero-copy sharing
   through block tables (vLLM) or tree nodes (SGLang) does not apply here. The pool is only a
   source to copy from: no reference counts and no pinning, and evicting a block never takes keys
   away from a running request. A slot's sliding-window layers keep their last positions only, so
   a block is kept as soon as its chunk is prefilled (later its window keys are gone), and a reused
   prefix loads only the last of those (SlotCache.load_starts): the pool holds every layer's keys.
3. Cost. Matching whole blocks loses at most BLOCK - 1 tokens per hit. They are prefilled along
   with the answer and the new message, which have to be prefilled anyway. The fixed cut has a
   price of its own, paid with the cache on or off: a prompt longer than one block takes more
   forward calls (+9% prefill time at BLOCK = 128 on a 1,024-token prompt; generation/prefill.py).

4. Recurrent layers (LFM2's convolutions, Qwen3.5's DeltaNet) fold every token into a state, which
   no block's keys hold. So for such a model a block also keeps a checkpoint: a copy of every
   recurrent state of the slot (SlotCache.states_of) as its chunk ends, which is the block's end,
   as llama-server's context checkpoints. A prompt resumes at the last matched block that has one
   (the match is cut back to it): its keys plus that block's states are the slot after exactly
   those tokens, and the chunks after it are cut where a cold prefill cuts them, so every bit
   matches again. A block stored after its end has gone by (a chain stored again past an evicted
   block) gets none, until a prompt's chunk ends there. A checkpoint counts against the capacity as
   the tokens whose keys and values take as many bytes (one budget, in the unit the operator sets),
   and goes with its block; when no leaf block can go, an inner block's checkpoint goes alone (the
   least recently used: a chain that fills the pool keeps growing, resuming at its newest end).

A block is keyed by (its parent block's id, its tokens). That is vLLM's hash chain, with the
tokens themselves compared (dict equality), so a hash collision can never put the wrong keys in.
Prompts that share a system prompt branch from the same blocks, which are stored once. When the
pool is full, the least recently used block with no children is evicted (always a leaf, never the
middle of a chain). A hit refreshes its chain leaf-first, so parents stay more recent than their
children.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import torch

from nexttok.generation.prefill import BLOCK
from nexttok.generation.prefill import prefill as chunked_prefill
from nexttok.generation.scoring import PromptScores
from nexttok.models import Model
from nexttok.models.slot_cache import SlotCache
from nexttok.server.metrics import Metrics

# Tokens per block: the prefill's chunk (generation/prefill.py says what it costs), so a block
# the cache hands over holds the very bits the prefill would have computed.
ROOT = -1  # the parent id of a prompt's first block


def prefill(model: Model, cache: SlotCache, slot: int, ids: list[int], prefix: PrefixCache | None,
            block: int = BLOCK, scores: PromptScores | None = None) -> torch.Tensor:
    """Run a prompt into slot (empty, just claimed) and return its last token's logits (vocab,).
    The prompt's whole blocks are taken from the prefix cache where it has them and given to it
    as each chunk is prefilled (a sliding-window layer keeps a block's keys only until the window
    has moved past it). The result is bit-identical with or without a prefix cache. scores: every prompt
    token is scored from its chunk's logits, so nothing is taken from the prefix cache (its blocks
    hold keys and values, not logits); the blocks are still given to it."""
    assert prefix is None or prefix.block == block, "the prefix cache's blocks are the prefill's chunks"
    start = prefix.load(ids, cache, slot) if prefix is not None and scores is None else 0
    keep = None if prefix is None else lambda end: prefix.store(ids[:end], cache, slot)
    return chunked_prefill(model, cache.row(slot), ids, start, scores, block, after=keep)


@dataclass(eq=False)
class _Block:
    id: int
    key: tuple[int, tuple[int, ...]]  # (parent's id, this block's tokens)
    index: int  # where its keys and values are in the pool
    children: int = 0
    states: dict[tuple[int, str], torch.Tensor] | None = None  # recurrent states after its last token
    state_tokens: int = 0  # what states count as against the capacity (0: none held)


class PrefixCache:
    """Keys and values of whole blocks (BLOCK tokens; tests may choose others) of recent prompts,
    in a preallocated pool of capacity_tokens // block blocks, and for a model with recurrent layers
    a checkpoint of their states at blocks' ends, counted in the same capacity (point 4 above).
    Used only by the scheduler's worker thread."""

    def __init__(self, cache: SlotCache, capacity_tokens: int, metrics: Metrics | None = None, block: int = BLOCK):
        self.block = block
        self.capacity = capacity_tokens // block
        # one pool per group of the cache's layers (layers storing keys of one shape: one group but
        # for Gemma 4), each (layers, n_kv, capacity, block, hd): a block's rows are contiguous, as in a slot.
        # empty, not zeros: a block is always written before it is read, and untouched pages cost nothing
        self.pools = [tuple(torch.empty((k.shape[0], k.shape[2], self.capacity, block, k.shape[4]), dtype=k.dtype,
                                        device=k.device) for _ in range(2)) for k, _ in cache.groups]
        self._blocks: dict[tuple[int, tuple[int, ...]], _Block] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # by id, least recently used first
        self._free = list(range(self.capacity - 1, -1, -1))
        self._ids = itertools.count()
        self.recurrent = bool(cache.store.state_layers)
        # bytes of keys and values one token takes in the pool: the rate a checkpoint's bytes are
        # counted in tokens at (at least 1: a model of recurrent layers only would hold no keys)
        self.token_bytes = max(1, sum(x.shape[0] * x.shape[1] * x.shape[4] * x.element_size()
                                      for pair in self.pools for x in pair))
        self.held = 0  # tokens of the capacity in use: blocks' and checkpoints'
        self.metrics = metrics or Metrics()
        self.metrics.inc("prefix_cache_capacity_tokens", self.capacity * block)

    @property
    def tokens(self) -> int:
        """Tokens whose keys and values are held."""
        return len(self._blocks) * self.block

    @property
    def checkpoints(self) -> int:
        """Blocks that hold a checkpoint of the recurrent states."""
        return sum(b.states is not None for b in self._blocks.values())

    def checkpoint_tokens(self, cache: SlotCache) -> int:
        """What one checkpoint of cache's recurrent states counts as against the capacity: the tokens
        whose keys and values take as many bytes, rounded up (0 for a model without such layers)."""
        per_slot = cache.held_bytes()["recurrent"] // cache.slots
        return -(-per_slot // self.token_bytes)

    def match(self, ids: list[int]) -> list[_Block]:
        """The cached blocks that begin ids, in order. They never cover the last token, which must go
        through the model to give the logits."""
        chain: list[_Block] = []
        parent = ROOT
        for a in range(0, len(ids) - self.block, self.block):  # blocks ending at or before len(ids) - 1
            block = self._blocks.get((parent, tuple(ids[a : a + self.block])))
            if block is None:
                break
            chain.append(block)
            parent = block.id
        while self.recurrent and chain and chain[-1].states is None:  # resume only where a checkpoint is
            chain.pop()
        self._touch(chain)
        return chain

    def load(self, ids: list[int], cache: SlotCache, slot: int) -> int:
        """Copy the cached blocks that begin ids into slot; return how many tokens they cover."""
        chain = self.match(ids)
        reused = len(chain) * self.block
        if chain:
            # (layers, n_kv, blocks, block, hd) -> (layers, n_kv, tokens, hd): the slot's layout; a
            # window layer's last blocks only (what the slot keeps of them)
            groups = []
            for pair, start in zip(self.pools, cache.load_starts(reused), strict=True):
                index = torch.tensor([b.index for b in chain[start // self.block :]], device=pair[0].device)
                groups.append(tuple(pool.index_select(2, index).flatten(2, 3) for pool in pair))
            cache.load(slot, groups, reused, chain[-1].states)
        metrics = self.metrics
        metrics.inc("prefix_cache_queries_total")
        metrics.inc("prefix_cache_hits_total", int(reused > 0))
        metrics.inc("prefix_cache_query_tokens_total", len(ids))
        metrics.inc("prefix_cache_reused_tokens_total", reused)
        return reused

    def store(self, ids: list[int], cache: SlotCache, slot: int) -> None:
        """Keep the keys and values of every whole block of ids that slot now holds (exactly ids), and
        for a recurrent model the states at the end of the block that ends where ids end. When the
        pool is full, least recently used blocks make room; a chain longer than the pool keeps its start."""
        chain: list[_Block] = []
        parent = ROOT
        for a in range(0, len(ids) - self.block + 1, self.block):
            key = (parent, tuple(ids[a : a + self.block]))
            at_end = self.recurrent and a + self.block == len(ids)  # the slot's states are this block's end's
            block = self._blocks.get(key)
            if block is None:
                block = self._add(key, cache, slot, a, at_end)
            elif at_end and block.states is None:
                self._checkpoint(block, cache, slot, make_room=True)
            if block is None:
                break
            chain.append(block)
            parent = block.id
        self._touch(chain)

    def _add(self, key: tuple[int, tuple[int, ...]], cache: SlotCache, slot: int, start: int,
             checkpoint: bool) -> _Block | None:
        if start < cache.kept_from(slot):  # its window layers' keys are gone: the chain ends before it
            return None
        # a recurrent model's block comes with its checkpoint or not at all (without, it could not be resumed at)
        cost = self.block + (self.checkpoint_tokens(cache) if checkpoint else 0)
        if not self._make_room(cost, protect=key[0]):
            return None
        index = self._free.pop()
        for (k, v), (keys, values) in zip(cache.keys_values(slot, start, start + self.block), self.pools, strict=True):
            keys[:, :, index] = k
            values[:, :, index] = v
        block = _Block(next(self._ids), key, index)
        self._blocks[key] = block
        self._lru[block.id] = block
        if key[0] != ROOT:
            self._lru[key[0]].children += 1
        self.held += self.block
        self.metrics.inc("prefix_cache_tokens", self.block)
        if checkpoint:
            self._checkpoint(block, cache, slot, make_room=False)  # made above
        return block

    def _checkpoint(self, block: _Block, cache: SlotCache, slot: int, make_room: bool) -> None:
        """Keep slot's recurrent states (slot holds exactly the tokens up to block's end) with block."""
        tokens = self.checkpoint_tokens(cache)
        if make_room and not self._make_room(tokens, protect=block.id):
            return
        block.states, block.state_tokens = cache.states_of(slot), tokens
        self._count_checkpoint(block, 1)

    def _count_checkpoint(self, block: _Block, sign: int) -> None:
        self.held += sign * block.state_tokens
        self.metrics.inc("prefix_cache_checkpoints", sign)
        self.metrics.inc("prefix_cache_checkpoint_tokens", sign * block.state_tokens)

    def _make_room(self, tokens: int, protect: int) -> bool:
        """Evict until `tokens` more fit in the capacity: least recently used leaf blocks (with their
        checkpoints) other than `protect`, then inner blocks' checkpoints. False when they cannot."""
        while self.capacity * self.block - self.held < tokens:
            if not self._evict(protect) and not self._drop_checkpoint(protect):
                return False
        return True

    def _evict(self, protect: int) -> bool:
        """Free the least recently used leaf block, its checkpoint too, other than `protect` (the
        parent of the block about to be added, a leaf until then; or the block about to take a
        checkpoint). False when there is none."""
        victim = next((b for b in self._lru.values() if b.children == 0 and b.id != protect), None)
        if victim is None:
            return False
        if victim.states is not None:
            self._count_checkpoint(victim, -1)
        del self._blocks[victim.key], self._lru[victim.id]
        if victim.key[0] != ROOT:
            self._lru[victim.key[0]].children -= 1
        self._free.append(victim.index)
        self.held -= self.block
        self.metrics.inc("prefix_cache_tokens", -self.block)
        self.metrics.inc("prefix_cache_evicted_tokens_total", self.block)
        return True

    def _drop_checkpoint(self, protect: int) -> bool:
        """Free the least recently used checkpoint of a block other than `protect`; its keys stay (the
        middle of a chain). False when there is none."""
        victim = next((b for b in self._lru.values() if b.states is not None and b.id != protect), None)
        if victim is None:
            return False
        self._count_checkpoint(victim, -1)
        victim.states, victim.state_tokens = None, 0
        return True

    def _touch(self, chain: list[_Block]) -> None:
        for block in reversed(chain):  # leaf first: each parent ends up more recent than its child
            self._lru.move_to_end(block.id)
