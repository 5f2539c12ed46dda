"""The keys and values of sliding-window layers as a windowed KVCache keeps them (cache.py).

A sliding-window layer reads only the last `window` keys, so generation's cache keeps only those,
plus WINDOW_SLACK and a prefill chunk's room: in a buffer of their own, in order, whose start
(`base`, a slot) moves up when it fills (the last window - 1 + WINDOW_SLACK keys moved to its
front: one copy per chunk of tokens). Gemma 3's local layers (window 512) then hold 672 slots at
any context instead of 32,768. Truncating back past what the buffer kept is a StateRollback.

The server's SlotCache keeps them per slot (SlotWindows): the same buffer, each slot with a start of
its own, compacted when that slot's next call would not fit."""

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


class SlotWindows:
    """The keys and values of the layers sharing one sliding window in a SlotCache, for each slot's
    last positions only: slot s's buffer index i holds position base[s] + i. One buffer per shape
    of key (groups, each (layers, slots, n_kv, capacity, hd)); layer -> (its group, its row there).
    A call's queries read keys from max(0, start - window + 1) on (read_from), however the buffer
    was compacted before, so a slot's results do not depend on its history (prefilled or loaded)."""

    def __init__(self, window: int, shapes: dict[int, tuple[int, int]], slots: int, max_len: int,
                 dtype: torch.dtype, device):
        self.window = window
        room = min(max_len, window + WINDOW_SLACK + WINDOW_CHUNK)
        kinds = list(dict.fromkeys(shapes.values()))
        members = {shape: [layer for layer in sorted(shapes) if shapes[layer] == shape] for shape in kinds}
        self.row = {layer: (kinds.index(shape), members[shape].index(layer)) for layer, shape in shapes.items()}
        self.groups = [tuple(torch.zeros((len(members[(n_kv, hd)]), slots, n_kv, room, hd), dtype=dtype, device=device)
                             for _ in range(2)) for n_kv, hd in kinds]
        self.base = [0] * slots

    @property
    def capacity(self) -> int:
        return self.groups[0][0].shape[3]

    def read_from(self, start: int) -> int:
        """The first position a call whose tokens start at `start` reads: read_from(10) -> 6 (window 5)."""
        return max(0, start - self.window + 1)

    def make_room(self, slot: int, offset: int, t: int) -> None:
        """Before slot's positions offset..offset + t - 1 are written: drop what no query from there on
        sees (keeping WINDOW_SLACK more), growing every slot's buffer where a call brings more than it holds."""
        base = self.base[slot]
        if offset + t - base <= self.capacity:
            return
        start = max(base, offset - (self.window - 1) - WINDOW_SLACK)
        keep = offset - start
        if keep + t > self.capacity:
            self.groups = [tuple(self._grown(x, keep + t + WINDOW_CHUNK) for x in pair) for pair in self.groups]
        for k, v in self.groups:
            k[:, slot, :, :keep] = k[:, slot, :, start - base : offset - base].clone()
            v[:, slot, :, :keep] = v[:, slot, :, start - base : offset - base].clone()
        self.base[slot] = start

    @staticmethod
    def _grown(x: torch.Tensor, size: int) -> torch.Tensor:
        bigger = x.new_zeros((*x.shape[:3], size, x.shape[4]))
        bigger[:, :, :, : x.shape[3]] = x
        return bigger

    def fetch_row(self, layer: int, slot: int, start: int, end: int, k: torch.Tensor, v: torch.Tensor):
        """Store slot's positions start..end-1 (k, v (1, n_kv, T, hd)); return its keys and values
        (1, n_kv, S, hd) of positions read_from(start)..end-1."""
        (group, i), base = self.row[layer], self.base[slot]
        keys, values = self.groups[group]
        keys[i, slot, :, start - base : end - base] = k[0]
        values[i, slot, :, start - base : end - base] = v[0]
        a = self.read_from(start) - base
        return keys[i, slot : slot + 1, :, a : end - base], values[i, slot : slot + 1, :, a : end - base]

    def fetch_rows(self, layer: int, rows: torch.Tensor, index: torch.Tensor, width: int, k: torch.Tensor,
                   v: torch.Tensor):
        """One new key per row (k, v (n, n_kv, 1, hd)) stored at buffer index index[r]; every row's
        buffer (n, n_kv, width, hd) back (which of its keys a row reads: spans)."""
        group, i = self.row[layer]
        keys, values = self.groups[group]
        keys[i, rows, :, index] = k[:, :, 0].to(keys.dtype)
        values[i, rows, :, index] = v[:, :, 0].to(values.dtype)
        return keys[i, : len(rows), :, :width], values[i, : len(rows), :, :width]

    def spans(self, lengths: list[int]) -> tuple[tuple[int, int], ...]:
        """The buffer indices [a, b) each row's newest query (at lengths[r] - 1) reads."""
        return tuple((self.read_from(n - 1) - self.base[r], n - self.base[r]) for r, n in enumerate(lengths))

    def keys_values(self, slot: int, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Views of slot's keys and values at positions start..end-1, one (k, v) per group."""
        base = self.base[slot]
        if start < base:
            raise ValueError(f"slot {slot}'s window layers keep positions from {base} on; asked for {start}..{end}")
        return [(k[:, slot, :, start - base : end - base], v[:, slot, :, start - base : end - base])
                for k, v in self.groups]

    def kept_after_load(self, n: int) -> int:
        """The first position a slot keeps when it starts from n positions computed earlier."""
        return max(0, n - (self.window - 1) - WINDOW_SLACK) if n > self.capacity else 0

    def load(self, slot: int, groups: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> None:
        """Start slot with positions n - T..n-1 of each group (layers, n_kv, T, hd), keeping those from
        kept_after_load(n) on (T must reach that far back)."""
        base = self.kept_after_load(n)
        for (k, v), (keys, values) in zip(groups, self.groups, strict=True):
            assert n - k.shape[2] <= base, "a loaded window starts after what it must keep"
            keys[:, slot, :, : n - base] = k[:, :, k.shape[2] - (n - base) :]
            values[:, slot, :, : n - base] = v[:, :, v.shape[2] - (n - base) :]
        self.base[slot] = base

    def move(self, slot: int, other: int, n: int) -> None:
        """Slot takes other's n positions (a release moves the last slot into a freed one)."""
        held = n - self.base[other]
        for k, v in self.groups:
            k[:, slot, :, :held] = k[:, other, :, :held]
            v[:, slot, :, :held] = v[:, other, :, :held]
        self.base[slot] = self.base[other]

    def held_bytes(self) -> int:
        return sum(x.numel() * x.element_size() for pair in self.groups for x in pair)
