"""The forward pass every architecture shares: positions → keys → masks → inputs → blocks → head.

An architecture is its differences, filled in on a Decoder subclass:

    blocks        its layers, in order (each called block(x, *extra, masks, cache, capture))
    final_norm    the norm before lm_head
    windows       the sliding windows its layers use (None: full attention)
    window_of     which of them one block uses
    inputs        token embeddings, plus a position table where positions are learned (GPT-2)
    rotations     what every block takes besides x (RoPE's cos and sin; nothing for GPT-2)
    head          final norm, lm_head, and any soft cap

The compiled decode step (compiled.py) runs the same blocks with the same extras.
"""

from __future__ import annotations

import torch
from torch import nn

from nexttok.models.attention import AttentionCapture, keys_for, masks_for, positions_for
from nexttok.models.cache import Cache


class Decoder(nn.Module):
    windows: frozenset = frozenset({None})

    @property
    def blocks(self) -> nn.ModuleList:
        raise NotImplementedError

    @property
    def final_norm(self) -> nn.Module:
        raise NotImplementedError

    def window_of(self, block: nn.Module) -> int | None:
        return block.self_attn.window

    def inputs(self, ids: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        """The residual stream's start (B, T, hidden)."""
        return self.embed(ids)

    def rotations(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple:
        return ()

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.final_norm(x))

    def forward(self, ids: torch.Tensor, cache: Cache | None = None, positions: torch.Tensor | None = None,
                *, capture: AttentionCapture | None = None, last_only: bool = False) -> torch.Tensor:
        """ids (B, T) -> logits (B, T, vocab). positions (B, T), -1 = padding; default: next ones.
        last_only: logits of the last position only (B, 1, vocab), all a generation step needs.
        capture: records what a viewer asks for (attention weights) on the way."""
        x = self.stream(ids, cache, positions, capture)
        if last_only:
            x = x[:, -1:]
        return self.head(x)

    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) of a fresh sequence -> (B, T, hidden): after the final norm, what lm_head reads."""
        return self.final_norm(self.stream(ids, None, None, None))

    def stream(self, ids: torch.Tensor, cache: Cache | None, positions: torch.Tensor | None,
               capture: AttentionCapture | None) -> torch.Tensor:
        """The residual stream (B, T, hidden) after the last block, before the final norm."""
        q_pos = positions_for(ids, cache, positions, self.config.max_position_embeddings)
        k_pos, contiguous = keys_for(q_pos, cache, explicit=positions is not None)  # (B, S)
        masks = masks_for(q_pos, k_pos, set(self.windows), contiguous, cache)
        x = self.inputs(ids, q_pos)
        extra = self.rotations(q_pos, x.dtype)
        if self.compiled is not None and self.compiled.takes(ids, cache, capture):
            block_masks = [masks[self.window_of(block)] for block in self.blocks]
            return self.compiled.run(self.blocks, x, extra, block_masks, cache)
        if capture is not None:
            capture.residual(x)
        for block in self.blocks:
            x = block(x, *extra, masks, cache, capture)
            if capture is not None:
                capture.residual(x)
        return x
