"""KVCache: keys and values of every layer, preallocated for the whole context.

One forward call first reserves its slots (`append_positions`), then each layer writes its keys
and values there (`update_and_fetch`) and attends over everything cached so far. Slot positions
are kept too (-1 = empty or padding), which is what the attention mask is built from.
"""

from __future__ import annotations

import torch


class ContextFull(ValueError):
    """More tokens than the cache (the context window) holds."""


class KVCache:
    def __init__(
        self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.pos = torch.full((batch, max_len), -1, dtype=torch.long, device=device)
        self.max_len = max_len
        self.offset = 0  # slots in use
        self._start = 0  # first slot of the tokens of the current forward call
        self.contiguous = True  # slots hold positions 0..offset-1 in order (no padding, no holes)

    @classmethod
    def for_model(cls, config, batch: int = 1, max_len: int | None = None, dtype=torch.float32,
                  device="cpu") -> KVCache:
        """A cache sized for `config` (max_len defaults to the model's context window)."""
        max_len = max_len or config.max_position_embeddings
        return cls(config.num_hidden_layers, batch, config.num_key_value_heads, max_len,
                   config.head_dim, dtype, device)

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
        self._start = self.offset
        self.offset += t
        self.pos[:, self._start : self.offset] = positions
        return self.pos[:, : self.offset]

    def update_and_fetch(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's k, v (B, n_kv_heads, T, head_dim); return all cached (B, n_kv, S, hd)."""
        self.k[layer, :, :, self._start : self.offset] = k
        self.v[layer, :, :, self._start : self.offset] = v
        return self.k[layer, :, :, : self.offset], self.v[layer, :, :, : self.offset]

    def truncate(self, length: int) -> None:
        """Forget every slot from `length` on (to branch generation from an earlier token)."""
        if not 0 <= length <= self.offset:
            raise ValueError(f"truncate length must be in 0..{self.offset}, got {length}")
        self.pos[:, length:] = -1
        self.offset = self._start = length
        if length == 0:
            self.contiguous = True

    def reset(self) -> None:
        self.truncate(0)
