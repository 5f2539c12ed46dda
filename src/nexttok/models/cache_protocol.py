"""What a model's forward pass needs of a cache (Cache), the errors a cache raises, and the dtype it
keeps keys in; the caches themselves are in cache.py."""

from __future__ import annotations

from typing import Protocol

import torch


def storage_dtype(dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype a model's keys and values are kept (and attended) in: float32 on the CPU whatever
    the weights, since the CPU attention kernels run 2-6x faster in float32 than in bfloat16 here
    (no native bfloat16 arithmetic: 147 vs 36 us at 150 keys, 485 vs 76 us at 600, SmolLM2's
    heads); the model's own dtype on an accelerator."""
    return torch.float32 if torch.device(device).type == "cpu" and dtype.is_floating_point else dtype


class ContextFull(ValueError):
    """More tokens than the cache (the context window) holds."""


class StateRollback(ValueError):
    """A cache with recurrent states (or sliding-window keys it no longer holds) asked to go back to a
    token it cannot."""


class Cache(Protocol):
    """What a model's forward pass needs of a KV cache.

    A call reserves slots for its tokens (append_positions, which returns the positions of every
    key the call's queries may see), then each layer stores its keys/values and gets back all of
    them (update_and_fetch)."""

    offset: int  # slots in use: where the next tokens go when the caller gives no positions
    contiguous: bool  # every row holds positions 0..offset-1 in order (no padding, no holes)
    spans: list[tuple[int, int]] | None  # rows with keys of their own lengths: row r sees keys [a, b)

    def append_positions(self, positions: torch.Tensor, contiguous: bool = False) -> torch.Tensor: ...

    def update_and_fetch(self, layer: int, k: torch.Tensor, v: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]: ...
