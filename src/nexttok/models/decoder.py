"""The forward pass every architecture shares: positions → keys → masks → inputs → blocks → head.

An architecture is its differences, filled in on a Decoder subclass:

    blocks        its layers, in order (each called block(x, *extra, masks, cache, capture))
    final_norm    the norm before lm_head
    windows       the sliding windows its layers use (None: full attention)
    window_of     which of them one block uses
    inputs        token embeddings, plus a position table where positions are learned (GPT-2)
    rotations     what every block takes besides x (RoPE's cos and sin; nothing for GPT-2)
    side_inputs   what else every block takes, made from this call's ids and embeddings (Gemma 4's
                  per-layer inputs, and the keys and values its KV-shared layers borrow)
    head          final norm, lm_head, and any soft cap

The compiled decode step (compiled.py) runs the same blocks with the same extras.
"""

from __future__ import annotations

import torch
from torch import nn

from nexttok.models.attention import TOKENS, AttentionCapture, keys_for, masks_for, positions_for
from nexttok.models.cache import Cache


def empty_embedding(rows: int, dim: int) -> nn.Embedding:
    """An embedding table without values (its weights are loaded later). from_pretrained skips
    nn.Embedding's random init, whose normal_ on the meta device goes through torch's compiled
    references and imports its compiler stack (~1 s of start-up)."""
    return nn.Embedding.from_pretrained(torch.empty(rows, dim), freeze=True)


class Decoder(nn.Module):
    windows: frozenset = frozenset({None})
    fused = None  # fused_decode.fuse_decode's plan: the decode step's layers one C++ call each

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

    def side_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> tuple:
        """What every block takes after the rotations, for this call (nothing but for Gemma 4)."""
        return ()

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.final_norm(x))

    def forward(self, ids: torch.Tensor, cache: Cache | None = None, positions: torch.Tensor | None = None,
                *, capture: AttentionCapture | None = None, last_only: bool = False) -> torch.Tensor:
        """ids (B, T) -> logits (B, T, vocab). positions (B, T), -1 = padding; default: next ones.
        last_only: logits of the last position only (B, 1, vocab), all a generation step needs.
        capture: records what a viewer asks for (attention weights) on the way."""
        if last_only and self.fused is not None and positions is None and capture is None and self.compiled is None:
            logits = self.fused.step(self, ids, cache, logits=True)  # a plain decode step's logits in one call
            if logits is not None:
                return logits
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
        if self.fused is not None and positions is None and capture is None and self.compiled is None:
            x = self.fused.step(self, ids, cache)  # a plain decode step in one call, or None
            if x is not None:
                return x
        q_pos = positions_for(ids, cache, positions, self.config.max_position_embeddings)
        k_pos, contiguous = keys_for(q_pos, cache, explicit=positions is not None)  # (B, S)
        masks = masks_for(q_pos, k_pos, set(self.windows), contiguous, cache)
        if self.config.recurrent_layers:  # a recurrent layer must not take padding into its state
            masks[TOKENS] = q_pos >= 0
        x = self.inputs(ids, q_pos)
        extra = (*self.rotations(q_pos, x.dtype), *self.side_inputs(ids, x))
        if self.compiled is not None and self.compiled.takes(ids, cache, capture):
            block_masks = [masks[self.window_of(block)] for block in self.blocks]
            return self.compiled.run(self.blocks, x, extra, block_masks, cache)
        if self.fused is not None and self.fused.takes(ids, cache, capture):
            return self.fused.run(self.blocks, x, extra, masks, cache)
        if capture is not None:
            capture.residual(x)
        for block in self.blocks:
            x = block(x, *extra, masks, cache, capture)
            if capture is not None:
                capture.residual(x)
        return x


class LlamaLayout(Decoder):
    """Llama's modules, which Qwen2/3, Mistral, Phi-3 and Gemma 3 share: embed_tokens, layers,
    norm, lm_head (tied to embed_tokens where the config says so), positions by RoPE. A family
    names its layer and norm classes and computes its RoPE tables in init_buffers."""

    POSITIONS = "rope"  # rotary: q and k rotated by position (RoPE)
    # checkpoint tensor name = CHECKPOINT_PREFIX + our name, except names starting with UNPREFIXED
    CHECKPOINT_PREFIX = "model."
    UNPREFIXED = ("lm_head.",)
    TRANSPOSED: tuple[str, ...] = ()
    PARALLEL_VOCAB = ("embed_tokens", "lm_head")  # tensor parallelism: vocabulary rows split over ranks
    LAYER: type[nn.Module]
    NORM: type[nn.Module]

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = empty_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.LAYER(config, i) for i in range(config.num_hidden_layers))
        self.norm = self.NORM(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.declare_buffers()
        self.windows = frozenset(self.window_of(layer) for layer in self.layers)
        self.compiled = None  # compiled.compile_decode turns it on
        if not self.norm.weight.is_meta:  # on the meta device the loader calls it once weights are in
            self.init_buffers()

    def declare_buffers(self) -> None:
        """Register the buffers init_buffers fills (none by default)."""

    @property
    def blocks(self) -> nn.ModuleList:
        return self.layers

    @property
    def final_norm(self) -> nn.Module:
        return self.norm

    def position_table(self) -> torch.Tensor | None:
        """None: positions enter as rotations of q and k (RoPE), not as a table."""
        return None

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
