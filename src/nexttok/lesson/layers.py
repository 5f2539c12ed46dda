"""The lesson's layer types: what each layer keeps of the context, and what a cache holds for them.

A layer attends over every earlier token ("full_attention": its keys and values grow by a row per
token), over its last `sliding_window` tokens only ("sliding_attention": generation's cache keeps
just those), or keeps no keys at all and folds each token into a state of fixed size (a recurrent
layer, config.recurrent_layers: LFM2's short convolutions). `layer_table` says which layer is which,
each recurrent layer's state measured on the model itself (`measure_states`: the cache's own
tensors after one token, not a size worked out from the config). `cache_memory` is what
generation's cache (KVCache.for_model(..., windowed=True)) holds for a sequence of n tokens, per
layer type, beside a cache that kept every layer's keys and values for all n.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nexttok.models import Model
from nexttok.models.cache import WINDOW_CHUNK, WINDOW_SLACK, KVCache
from nexttok.models.config import ModelConfig


@dataclass(frozen=True)
class StateSize:
    """One named state of a recurrent layer, for one sequence: its shape, numbers and bytes."""

    name: str
    shape: tuple[int, ...]
    numbers: int
    bytes: int


@dataclass(frozen=True)
class LayerKind:
    """Layer `layer`'s type (config.layer_types) and what it keeps: window, the keys a sliding layer
    reads (None: all); states, a recurrent layer's fixed-size state; inputs, the last inputs a
    convolution layer keeps (conv_kernel - 1; None for other layers)."""

    layer: int
    kind: str
    recurrent: bool
    window: int | None = None
    states: tuple[StateSize, ...] = ()
    inputs: int | None = None

    @property
    def numbers(self) -> int:
        return sum(s.numbers for s in self.states)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.states)

    def as_json(self) -> dict:
        state = None if not self.recurrent else {
            "numbers": self.numbers, "bytes": self.bytes, "inputs": self.inputs,
            "parts": [{"name": s.name, "shape": list(s.shape), "numbers": s.numbers, "bytes": s.bytes}
                      for s in self.states]}
        return {"layer": self.layer, "kind": self.kind, "recurrent": self.recurrent, "window": self.window,
                "state": state}


@dataclass(frozen=True)
class CacheMemory:
    """Bytes a cache holds for one sequence of `tokens` tokens, per layer type: full (every token's
    keys and values), sliding (each sliding layer's `sliding_slots` slots: at most its window and
    `sliding_room` more, which the engine keeps to take back refused drafts and to take in a prefill
    chunk, models/cache.py), recurrent (the states, the same at any length); all_full: a cache that
    kept every layer's keys and values for every token."""

    tokens: int
    full: int
    sliding: int
    recurrent: int
    all_full: int
    sliding_slots: int
    sliding_room: int

    @property
    def total(self) -> int:
        return self.full + self.sliding + self.recurrent

    def as_json(self) -> dict:
        return {"tokens": self.tokens, "full": self.full, "sliding": self.sliding, "recurrent": self.recurrent,
                "total": self.total, "all_full": self.all_full, "sliding_slots": self.sliding_slots,
                "sliding_room": self.sliding_room}


def measure_states(model: Model) -> dict[int, list[StateSize]]:
    """Each recurrent layer's states for one sequence, as the model makes them: one token run through
    a fresh cache (a state's size does not depend on how many tokens it has taken in). {} for a model
    without recurrent layers (nothing is run). LFM2's conv layers: {0: [StateSize("conv", (hidden, 2), ...)]}"""
    config = model.config
    if not config.recurrent_layers:
        return {}
    weights = next(model.parameters())
    cache = KVCache.for_model(config, max_len=1, dtype=weights.dtype, device=weights.device)
    with torch.inference_mode():
        model(torch.zeros((1, 1), dtype=torch.long, device=weights.device), cache, last_only=True)
    found: dict[int, list[StateSize]] = {}
    for (layer, name), state in sorted(cache.states.items()):
        row = state[0]  # (batch, *shape): one sequence's
        found.setdefault(layer, []).append(StateSize(name, tuple(row.shape), row.numel(),
                                                     row.numel() * row.element_size()))
    return found


def layer_table(model: Model, states: dict[int, list[StateSize]] | None = None) -> list[LayerKind]:
    """Every layer's type and what it keeps, in layer order (states: measure_states(model), measured
    here when not given)."""
    config = model.config
    states = measure_states(model) if states is None else states
    recurrent = set(config.recurrent_layers)
    return [LayerKind(i, kind, i in recurrent,
                      config.sliding_window if kind == "sliding_attention" else None,
                      tuple(states.get(i, ())), config.conv_kernel - 1 if kind == "conv" else None)
            for i, kind in enumerate(config.layer_types)]


def cache_memory(config: ModelConfig, tokens: int, dtype: torch.dtype, state_bytes: int) -> CacheMemory:
    """What generation's cache (windowed, sized to the sequence) holds at `tokens` tokens of one
    sequence whose keys are kept in `dtype` (the cache's storage dtype), per layer type, with the
    recurrent layers' `state_bytes`; and what a cache of every layer full would hold. The buffers
    are made on the meta device: their sizes, no memory. Mistral-7B-shaped (32 layers, window 4096,
    8 KV heads of 128, bfloat16) at 16,384 tokens: sliding 32 × 2 × 8 × 128 × 2 × 4256 slots (558 MB),
    all_full 32 × 2 × 8 × 128 × 2 × 16,384 (2.1 GB)."""
    room = WINDOW_SLACK + WINDOW_CHUNK if "sliding_attention" in config.layer_types else 0
    if tokens == 0:
        return CacheMemory(0, 0, 0, state_bytes, 0, 0, room)
    windowed = KVCache.for_model(config, max_len=tokens, dtype=dtype, device="meta", windowed=True)
    held = windowed.held_bytes()
    every = KVCache(config.num_hidden_layers, 1, config.num_key_value_heads, tokens, config.head_dim, dtype, "meta")
    slots = max((group.capacity for group in windowed.window_keys.values()), default=0)
    return CacheMemory(tokens, held["full"], held["sliding"], state_bytes, every.held_bytes()["full"], slots, room)
