"""KVCache: keys and values of every attention layer, preallocated for the whole context, and the
fixed-size state of every recurrent layer.

One forward call first reserves its slots (`append_positions`), then each attention layer writes
its keys and values there (`update_and_fetch`) and attends over everything cached so far. Slot
positions are kept too (-1 = empty or padding), which is what the attention mask is built from.

A windowed cache (for_model(..., windowed=True): generation's) keeps a sliding-window layer's last
keys only (window_keys.py). Layers that store nothing borrow another's (Gemma 4's KV-shared layers).
The server's cache of many sequences (SlotCache) is in slot_cache.py, over a KVCache of its own.

A recurrent layer (LFM2's short convolutions) keeps no keys: it folds each token into a state of
its own whose size does not grow with the context (`state`), updated in place. A state cannot be
taken back a token (it holds no history), so such a cache truncates only to 0 or to where it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from nexttok.models.cache_protocol import Cache, ContextFull, StateRollback, storage_dtype  # noqa: F401 (theirs too)
from nexttok.models.window_keys import WINDOW_CHUNK, WINDOW_SLACK, WindowKeys  # noqa: F401 (lesson reads them)


class KVCache:
    """shapes: what each layer stores, (KV heads, head_dim), or None (Gemma 4's KV-shared layers);
    by default (n_kv_heads, head_dim). Layers of one shape share a buffer: groups holds each group's
    (k, v), layers each layer's views (B, n_kv, max_len, hd); k and v are the one group's, where
    there is one. state_layers keep a recurrent state (state()); windows: layer -> its window, for
    layers whose keys are kept for their window only (WindowKeys, per window and shape)."""

    def __init__(
        self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
        shapes: list[tuple[int, int] | None] | None = None, state_layers: Sequence[int] = (),
        windows: Mapping[int, int] | None = None,
    ):
        shapes = shapes if shapes is not None else [(n_kv_heads, head_dim)] * n_layers
        assert len(shapes) == n_layers, "one shape (or None) per layer"
        self.n_layers, self.n_kv_heads, self.head_dim, self.dtype = n_layers, n_kv_heads, head_dim, dtype
        self.state_layers = tuple(state_layers)
        self.states: dict[tuple[int, str], torch.Tensor] = {}  # (layer, name) -> (batch, ...), made on first use
        self.windows = {layer: w for layer, w in (windows or {}).items() if shapes[layer] is not None}
        self.window_keys: dict[tuple[int, tuple[int, int]], WindowKeys] = {}
        for key in dict.fromkeys((w, shapes[layer]) for layer, w in sorted(self.windows.items())):
            members = [layer for layer, w in sorted(self.windows.items()) if (w, shapes[layer]) == key]
            self.window_keys[key] = WindowKeys(key[0], members, batch, key[1][0], max_len, key[1][1], dtype, device)
        self.shapes = list(shapes)
        shapes = [None if i in self.state_layers or i in self.windows else s for i, s in enumerate(shapes)]
        self.groups: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.slots_of: list[tuple[int, int] | None] = [None] * n_layers  # layer -> (group, its row there)
        for shape in dict.fromkeys(s for s in shapes if s is not None):
            members = [i for i, s in enumerate(shapes) if s == shape]
            size = (len(members), batch, shape[0], max_len, shape[1])
            k = torch.zeros(size, dtype=dtype, device=device)
            v = torch.zeros(size, dtype=dtype, device=device)
            self.groups.append((k, v))
            for j, layer in enumerate(members):
                self.slots_of[layer] = (len(self.groups) - 1, j)
        self.uniform = len(self.groups) == 1 and None not in self.shapes
        self.pos = torch.full((batch, max_len), -1, dtype=torch.long, device=device)
        self.max_len = max_len
        self.offset = 0  # slots in use
        self._start = 0  # first slot of the tokens of the current forward call
        self.contiguous = True  # slots hold positions 0..offset-1 in order (no padding, no holes)
        self.spans = None  # every row sees all cached keys (masked by position)

    @classmethod
    def for_model(cls, config, batch: int = 1, max_len: int | None = None, dtype=torch.float32,
                  device="cpu", windowed: bool = False) -> KVCache:
        """A cache sized for `config` (max_len defaults to the model's context window), for a model
        whose weights are `dtype` (the cache's own dtype: storage_dtype). windowed: sliding-window
        layers keep their window's keys only (generation; a viewer of every key asks for all)."""
        max_len = max_len or config.max_position_embeddings
        windows = {i: config.sliding_window for i, kind in enumerate(config.layer_types)
                   if kind == "sliding_attention"} if windowed else None
        return cls(config.num_hidden_layers, batch, config.num_key_value_heads, max_len, config.head_dim,
                   storage_dtype(dtype, device), device, config.cache_shapes(), config.recurrent_layers, windows)

    def key_start(self, window: int | None) -> int:
        """The first slot the current call's keys start at for layers of this window (0: all)."""
        group = next((g for (w, _), g in self.window_keys.items() if w == window), None)
        return 0 if group is None else group.lo

    def held_bytes(self) -> dict[str, int]:
        """Bytes held per layer type: "full" (keys for the whole context), "sliding" (a window's
        keys), "recurrent" (states), as allocated now."""
        def size(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()

        return {"full": sum(size(k) + size(v) for k, v in self.groups),
                "sliding": sum(size(g.k) + size(g.v) for g in self.window_keys.values()),
                "recurrent": self.state_bytes()}

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's keys and values (B, n_kv, max_len, hd), views of its group's buffer, made anew
        each call (a view kept across calls would outlive a write that needs autograd's bookkeeping)."""
        group, row = self.slots_of[layer]
        k, v = self.groups[group]
        return k[row], v[row]

    @property
    def k(self) -> torch.Tensor:
        """Every layer's keys (n_layers, B, n_kv, max_len, hd), where all layers store alike."""
        if not self.uniform:
            raise ValueError("this cache's layers store keys of several shapes (or none): read groups or layers")
        return self.groups[0][0]

    @property
    def v(self) -> torch.Tensor:
        """Every layer's values, as k."""
        if not self.uniform:
            raise ValueError("this cache's layers store values of several shapes (or none): read groups or layers")
        return self.groups[0][1]

    @property
    def device(self) -> torch.device:
        return self.pos.device

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    def append_positions(self, positions: torch.Tensor, contiguous: bool = False) -> torch.Tensor:
        """Reserve slots for positions (B, T); return the positions of all used slots (B, S).

        contiguous: the caller vouches these positions continue 0..offset-1 (no padding)."""
        b, t = positions.shape
        if b != self.batch:
            raise ValueError(f"batch of {b} rows given to a cache built for {self.batch}")
        if self.offset + t > self.max_len:
            raise ContextFull(
                f"context window full: {self.offset} cached + {t} new tokens > {self.max_len}"
            )
        self.contiguous = self.contiguous and contiguous
        for group in self.window_keys.values():
            group.make_room(self.offset, t)
            group.lo = max(group.base, self.offset + t - group.window) if t == 1 else group.base
        self._start = self.offset
        self.offset += t
        self.pos[:, self._start : self.offset] = positions
        return self.pos[:, : self.offset]

    def update_and_fetch(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's k, v (B, n_kv_heads, T, head_dim); return all cached (B, n_kv, S, hd)."""
        if layer in self.windows:
            group = self.window_keys[self.windows[layer], self.shapes[layer]]
            return group.fetch(layer, self._start, self.offset, k, v)
        keys, values = self.layer(layer)
        keys[:, :, self._start : self.offset] = k
        values[:, :, self._start : self.offset] = v
        return keys[:, :, : self.offset], values[:, :, : self.offset]

    def state(self, layer: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Recurrent layer `layer`'s state `name`, (batch, *shape): zeros until the layer first
        writes it (in place, as it takes in tokens)."""
        if layer not in self.state_layers:
            raise ValueError(f"layer {layer} keeps keys and values, not a recurrent state")
        key = (layer, name)
        if key not in self.states:
            self.states[key] = torch.zeros((self.batch, *shape), dtype=dtype, device=self.pos.device)
        return self.states[key]

    def state_bytes(self) -> int:
        """Bytes of every recurrent state made so far (fixed, whatever the context's length)."""
        return sum(s.numel() * s.element_size() for s in self.states.values())

    def truncate(self, length: int) -> None:
        """Forget every slot from `length` on (to branch generation from an earlier token). With
        recurrent states, only to 0 (they start again) or to where the cache is; with window keys,
        not past those kept (StateRollback)."""
        if not 0 <= length <= self.offset:
            raise ValueError(f"truncate length must be in 0..{self.offset}, got {length}")
        if self.state_layers and 0 < length < self.offset:
            raise StateRollback(f"recurrent layers {list(self.state_layers)} keep a state that cannot be "
                                f"taken back to token {length} of {self.offset}")
        for group in self.window_keys.values():
            if 0 < length < self.offset and length - (group.window - 1) < group.base:
                raise StateRollback(f"sliding-window layers keep keys from token {group.base} on; going back to "
                                    f"token {length} needs them from {length - group.window + 1}")
            if length == 0:
                group.base = group.lo = 0
        if length == 0:
            for state in self.states.values():
                state.zero_()
        self.pos[:, length:] = -1
        self.offset = self._start = length
        if length == 0:
            self.contiguous = True

    def reset(self) -> None:
        self.truncate(0)

