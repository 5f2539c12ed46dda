"""SlotCache: the server's cache, keys and values for up to `slots` sequences of different lengths
(continuous batching).

Full-attention layers keep every position of a slot (a KVCache over the slots, `store`); sliding-
window layers keep each slot's last positions only (window_keys.SlotWindows: window + WINDOW_SLACK +
WINDOW_CHUNK per slot, whatever the context), unless built with windowed=False. So a slot's bytes
follow window × window layers + context × full layers. Recurrent layers keep a state per slot; a
slot that starts from a reused prefix takes their states at its end too (states_of, load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from nexttok.models.cache import ContextFull, KVCache, StateRollback, storage_dtype
from nexttok.models.window_keys import SlotWindows


class SlotCache:
    """Running sequences occupy slots 0..running-1 (a finished one is replaced by the last), so a
    decode step over all of them works on views. row(i): a one-sequence cache over slot i (a
    prefill); running_view(pad_to): every running sequence, one new token each, padded with free
    slots as scratch rows up to pad_to (CPU matrix kernels pick their code path by the number of
    rows: with pad_to = slots a sequence gets bit-identical logits alone or in any batch).
    windows: layer -> its window, for layers that keep their window's keys only."""

    def __init__(self, n_layers: int, slots: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 shapes: list[tuple[int, int] | None] | None = None, state_layers: Sequence[int] = (),
                 windows: Mapping[int, int] | None = None):
        shapes = shapes if shapes is not None else [(n_kv_heads, head_dim)] * n_layers
        self.windows = {layer: w for layer, w in (windows or {}).items()
                        if shapes[layer] is not None and layer not in state_layers}
        full = [None if layer in self.windows else shape for layer, shape in enumerate(shapes)]
        self.store = KVCache(n_layers, slots, n_kv_heads, max_len, head_dim, dtype, device, full, state_layers)
        self.window_keys = {w: SlotWindows(w, {layer: shapes[layer] for layer, lw in self.windows.items() if lw == w},
                                           slots, max_len, dtype, device) for w in sorted(set(self.windows.values()))}
        self.lengths = [0] * slots
        self.running = 0

    @classmethod
    def for_model(cls, config, slots: int, max_len: int | None = None, dtype=torch.float32,
                  device="cpu", windowed: bool = True) -> SlotCache:
        """windowed: sliding-window layers keep their window's keys only (False: every position)."""
        windows = {i: config.sliding_window for i, kind in enumerate(config.layer_types)
                   if kind == "sliding_attention"} if windowed else None
        return cls(config.num_hidden_layers, slots, config.num_key_value_heads,
                   max_len or config.max_position_embeddings, config.head_dim, storage_dtype(dtype, device), device,
                   config.cache_shapes(), config.recurrent_layers, windows)

    @property
    def slots(self) -> int:
        return len(self.lengths)

    @property
    def max_len(self) -> int:
        return self.store.max_len

    @property
    def groups(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every buffer of keys and values, (k, v) each (layers, slots, n_kv, positions, hd): the full
        layers' groups (one per shape of key), then each window's."""
        return [*self.store.groups, *(pair for w in self.window_keys.values() for pair in w.groups)]

    def held_bytes(self) -> dict[str, int]:
        """Bytes held per layer type, as KVCache.held_bytes: "full", "sliding", "recurrent"."""
        full = sum(x.numel() * x.element_size() for pair in self.store.groups for x in pair)
        return {"full": full, "sliding": sum(w.held_bytes() for w in self.window_keys.values()),
                "recurrent": self.store.state_bytes()}

    def claim(self) -> int:
        """A free slot for a new sequence (it becomes running)."""
        if self.running == self.slots:
            raise RuntimeError("no free slot")  # the scheduler admits no more than `slots`
        slot = self.running
        self.running += 1
        self.lengths[slot] = 0
        self.store.pos[slot] = -1
        for state in self.store.states.values():
            state[slot] = 0
        for w in self.window_keys.values():
            w.base[slot] = 0
        return slot

    def release(self, slot: int) -> int | None:
        """Free a slot; the last running sequence moves into it. Returns the slot it moved from."""
        last = self.running - 1
        moved = None
        if slot != last:
            n = self.lengths[last]
            store = self.store
            for k, v in store.groups:
                k[:, slot, :, :n] = k[:, last, :, :n]
                v[:, slot, :, :n] = v[:, last, :, :n]
            for w in self.window_keys.values():
                w.move(slot, last, n)
            store.pos[slot] = store.pos[last]
            for state in store.states.values():
                state[slot] = state[last]
            self.lengths[slot] = n
            moved = last
        self.store.pos[last] = -1
        self.lengths[last] = 0
        for w in self.window_keys.values():
            w.base[last] = 0  # a free slot is a scratch row's, from index 0
        self.running -= 1
        return moved

    def load_starts(self, n: int) -> list[int]:
        """Per group (as groups), the first position load() needs of n positions computed earlier:
        0 for full layers, the last window's (and some room's) for window layers."""
        return [*[0] * len(self.store.groups),
                *(w.kept_after_load(n) for w in self.window_keys.values() for _ in w.groups)]

    def states_of(self, slot: int) -> dict[tuple[int, str], torch.Tensor]:
        """A copy of every recurrent state of slot, (layer, name) -> (*shape): a checkpoint that load()
        resumes from (it holds the states after exactly the tokens the slot holds now)."""
        return {key: state[slot].clone() for key, state in self.store.states.items()}

    def load(self, slot: int, groups: list[tuple[torch.Tensor, torch.Tensor]], n: int | None = None,
             states: Mapping[tuple[int, str], torch.Tensor] | None = None) -> None:
        """Start slot's sequence with keys and values computed earlier at positions 0..n-1 (a reused
        prompt prefix), one (k, v) per group (as groups), each (layers in the group, n_kv_heads, T,
        head_dim) holding positions n - T..n-1 (T >= n - load_starts(n) of it; n: the first's T
        unless given); a row() prefill then continues at position n. states: a model with recurrent
        layers needs their states after token n - 1 too (states_of(slot) taken then)."""
        if self.store.state_layers and states is None:
            raise StateRollback("a sequence of a model with recurrent layers cannot start from stored keys and "
                                "values alone: it needs its layers' states after that token (a checkpoint)")
        n = groups[0][0].shape[2] if n is None else n
        if n > self.max_len:
            raise ContextFull(f"context window full: {n} tokens > {self.max_len}")
        if states is not None:
            self._load_states(slot, states)
        store, full = self.store, len(self.store.groups)
        for (k, v), (keys, values) in zip(groups[:full], store.groups, strict=True):
            keys[:, slot, :, :n] = k
            values[:, slot, :, :n] = v
        rest = groups[full:]
        for w in self.window_keys.values():
            w.load(slot, rest[: len(w.groups)], n)
            rest = rest[len(w.groups) :]
        store.pos[slot] = -1
        store.pos[slot, :n] = torch.arange(n, device=store.pos.device)
        self.lengths[slot] = n

    def _load_states(self, slot: int, states: Mapping[tuple[int, str], torch.Tensor]) -> None:
        layers = {layer for layer, _ in states}
        missing = (set(self.store.states) - set(states)) or set(self.store.state_layers) - layers
        if missing:
            raise ValueError(f"a checkpoint of recurrent states lacks {sorted(missing)}")
        for (layer, name), state in states.items():
            self.store.state(layer, name, tuple(state.shape), state.dtype)[slot].copy_(state)

    def kept_from(self, slot: int) -> int:
        """The first position whose keys every layer of slot still holds (window layers drop theirs)."""
        return max((w.base[slot] for w in self.window_keys.values()), default=0)

    def keys_values(self, slot: int, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Views of slot's keys and values at positions start..end-1 (from kept_from(slot) on), one
        (k, v) per group (as groups), each (layers in the group, n_kv_heads, end - start, head_dim)."""
        if not 0 <= start <= end <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens; asked for {start}..{end}")
        full = [(k[:, slot, :, start:end], v[:, slot, :, start:end]) for k, v in self.store.groups]
        return [*full, *(pair for w in self.window_keys.values() for pair in w.keys_values(slot, start, end))]

    def row(self, slot: int) -> _RowView:
        return _RowView(self, slot)

    def running_view(self, pad_to: int = 1) -> BatchView:
        """Every running sequence, padded with scratch rows up to pad_to (<= slots) rows."""
        return BatchView(self, min(max(pad_to, 1), self.slots))


class _RowView:
    """KVCache-like view of one slot (batch of 1), continuing from its current length."""

    contiguous = True  # a row is filled by its own prefill from position 0
    spans = None

    def __init__(self, owner: SlotCache, slot: int):
        self.owner, self.slot = owner, slot
        self._start = self._end = owner.lengths[slot]

    @property
    def offset(self) -> int:
        return self.owner.lengths[self.slot]

    def append_positions(self, positions: torch.Tensor, contiguous: bool = False) -> torch.Tensor:
        t = positions.shape[1]
        start = self.owner.lengths[self.slot]
        if start + t > self.owner.max_len:
            raise ContextFull(f"context window full: {start} cached + {t} new tokens > {self.owner.max_len}")
        for w in self.owner.window_keys.values():
            w.make_room(self.slot, start, t)
        self._start, self._end = start, start + t
        self.owner.store.pos[self.slot, start : start + t] = positions[0]
        self.owner.lengths[self.slot] = start + t
        return self.owner.store.pos[self.slot : self.slot + 1, : start + t]

    def key_start(self, window: int | None) -> int:
        """The first position this call's keys start at for layers of this window (0: all)."""
        w = self.owner.window_keys.get(window)
        return 0 if w is None else w.read_from(self._start)

    def update_and_fetch(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if layer in self.owner.windows:
            w = self.owner.window_keys[self.owner.windows[layer]]
            return w.fetch_row(layer, self.slot, self._start, self._end, k, v)
        (keys, values), s = self.owner.store.layer(layer), self.slot
        keys[s, :, self._start : self._end] = k[0]
        values[s, :, self._start : self._end] = v[0]
        return keys[s : s + 1, :, : self._end], values[s : s + 1, :, : self._end]

    def state(self, layer: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """This slot's row of the layer's state (1, *shape), a view: updates land in the store."""
        return self.owner.store.state(layer, name, shape, dtype)[self.slot : self.slot + 1]


class BatchView:
    """KVCache-like view of every running slot, each taking one new token at its own length.
    Rows past the running ones (free slots) are scratch rows: the caller feeds them copies and
    calls release_scratch() after the step."""

    contiguous = False  # rows have different lengths: the mask comes from positions

    def __init__(self, owner: SlotCache, pad_to: int = 1):
        self.owner = owner
        self.n = max(owner.running, pad_to)
        self.spans: list[tuple[int, int]] | None = None  # set by append_positions
        device = owner.store.pos.device
        self.rows = torch.arange(self.n, device=device)
        self.ends = torch.tensor(owner.lengths[: self.n], device=device)  # where each new token goes
        self.width = max(owner.lengths[: self.n]) + 1
        self._windows: dict[int, tuple[torch.Tensor, int, tuple]] = {}  # window -> buffer index, width, spans

    @property
    def offset(self) -> int:
        """Rows have lengths of their own, so a batch step always gives its positions."""
        raise ValueError("a batch step over slots of different lengths needs explicit positions")

    def append_positions(self, positions: torch.Tensor, contiguous: bool = False) -> torch.Tensor:
        if positions.shape != (self.n, 1):
            raise ValueError(f"a batch step takes one token for each of {self.n} rows, got {tuple(positions.shape)}")
        if self.width > self.owner.max_len:
            raise ContextFull(f"context window full: a sequence already holds {self.width - 1} tokens")
        owner = self.owner
        owner.store.pos[self.rows, self.ends] = positions[:, 0]
        lengths = owner.lengths[: self.n]
        for window, w in owner.window_keys.items():
            for r, length in enumerate(lengths):
                w.make_room(r, length, 1)
            index = [length - w.base[r] for r, length in enumerate(lengths)]  # where row r's new key goes
            spans = w.spans([length + 1 for length in lengths])
            self._windows[window] = (torch.tensor(index, device=self.rows.device), max(index) + 1, spans)
        for r in range(self.n):
            owner.lengths[r] += 1
        self.spans = [(0, length) for length in owner.lengths[: self.n]]  # row r's keys: its own
        return owner.store.pos[: self.n, : self.width]

    def window_spans(self, window: int) -> tuple[tuple[int, int], ...] | None:
        """The buffer indices [a, b) each row reads in layers of this window (None: as spans)."""
        kept = self._windows.get(window)
        return None if kept is None else kept[2]

    def release_scratch(self) -> None:
        """Forget what the scratch rows took in this step."""
        for r in range(self.owner.running, self.n):
            self.owner.store.pos[r] = -1
            self.owner.lengths[r] = 0
            for w in self.owner.window_keys.values():
                w.base[r] = 0

    def update_and_fetch(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        owner = self.owner
        if layer in owner.windows:
            window = owner.windows[layer]
            index, width, _ = self._windows[window]
            return owner.window_keys[window].fetch_rows(layer, self.rows, index, width, k, v)
        keys, values = owner.store.layer(layer)
        keys[self.rows, :, self.ends] = k[:, :, 0].to(keys.dtype)  # (B, n_kv, hd) at each row's end
        values[self.rows, :, self.ends] = v[:, :, 0].to(values.dtype)
        return keys[: self.n, :, : self.width], values[: self.n, :, : self.width]

    def state(self, layer: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The running rows' (and scratch rows') states (n, *shape), a view: slots 0..n-1."""
        return self.owner.store.state(layer, name, shape, dtype)[: self.n]
