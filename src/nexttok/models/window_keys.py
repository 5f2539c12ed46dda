"""The keys and values of sliding-window layers as a windowed KVCache keeps them (cache.py).

A sliding-window layer reads only the last `window` keys, so generation's cache keeps only those,
plus WINDOW_SLACK and a prefill chunk's room: in a buffer of their own, in order, whose start
(`base`, a slot) moves up when it fills (the last window - 1 + WINDOW_SLACK keys moved to its
front: one copy per chunk of tokens). Gemma 3's local layers (window 512) then hold 672 slots at
any context instead of 32,768. Truncating back past what the buffer kept is a StateRollback."""

from __future__ import annotations

import torch

WINDOW_SLACK = 32  # keys kept past a window, so speculative decoding can take back its refused drafts (at most 16)
WINDOW_CHUNK = 128  # room for a prefill chunk's new keys (generation/prefill.py's BLOCK) before the buffer moves


class WindowKeys:
    """The keys and values of the layers sharing one sliding window, for the last slots only: buffer
    index i holds slot base + i. lo: the first slot this call's queries may see (set per call)."""

    def __init__(self, window: int, layers: list[int], batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device):
        self.window, self.row = window, {layer: i for i, layer in enumerate(layers)}
        shape = (len(layers), batch, n_kv_heads, min(max_len, window + WINDOW_SLACK + WINDOW_CHUNK), head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.base = self.lo = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def make_room(self, offset: int, t: int) -> None:
        """Before slots offset..offset + t - 1 are written: drop what no query from there on sees
        (keeping WINDOW_SLACK more), growing the buffer only where a call brings more than it holds."""
        if offset + t - self.base <= self.capacity:
            return
        start = max(self.base, offset - (self.window - 1) - WINDOW_SLACK)
        keep = offset - start
        if keep + t > self.capacity:  # one call of more tokens than the room: a bigger buffer
            k, v = self.k, self.v
            shape = (*k.shape[:3], keep + t + WINDOW_CHUNK, k.shape[4])
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
            self.k[:, :, :, :keep] = k[:, :, :, start - self.base : offset - self.base]
            self.v[:, :, :, :keep] = v[:, :, :, start - self.base : offset - self.base]
        else:
            self.k[:, :, :, :keep] = self.k[:, :, :, start - self.base : offset - self.base].clone()
            self.v[:, :, :, :keep] = self.v[:, :, :, start - self.base : offset - self.base].clone()
        self.base = start

    def fetch(self, layer: int, start: int, end: int, k: torch.Tensor, v: torch.Tensor):
        """Store slots start..end-1; return the keys and values of slots lo..end-1."""
        r = self.row[layer]
        self.k[r, :, :, start - self.base : end - self.base] = k
        self.v[r, :, :, start - self.base : end - self.base] = v
        a, b = self.lo - self.base, end - self.base
        return self.k[r, :, :, a:b], self.v[r, :, :, a:b]
