"""The contract every architecture keeps, and what generation, the server and the explainer rely on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from nexttok.models.attention import AttentionCapture
from nexttok.models.cache import Cache
from nexttok.models.compiled import CompiledDecode
from nexttok.models.config import ModelConfig


class Model(Protocol):
    """forward(ids, cache, positions) -> logits; nothing else (no sampling, no printing).

    ids (B, T) token ids; cache: the KV cache to read and extend (None: no cache); positions (B, T)
    (-1 = padding; None: continue after what the cache holds); last_only: logits of the last
    position only (B, 1, vocab); capture: records attention for a viewer. Returns (B, T, vocab)."""

    config: ModelConfig
    POSITIONS: str  # how positions enter: "learned" (a table of vectors, position_table) or "rope" (rotation of q, k)
    compiled: CompiledDecode | None  # decode steps through torch.compile (compiled.compile_decode)
    # checkpoint names (checkpoints/weights.py): a tensor is CHECKPOINT_PREFIX + our name, except
    # names starting with one of UNPREFIXED; names ending with one of TRANSPOSED are stored (in, out)
    CHECKPOINT_PREFIX: str
    UNPREFIXED: tuple[str, ...]
    TRANSPOSED: tuple[str, ...]
    # tensor parallelism (parallel/layers.py): the (embedding, lm_head) attributes whose vocabulary
    # rows are split over ranks; attention and MLP modules name their own (PARALLEL_HEADS / _INNER)
    PARALLEL_VOCAB: tuple[str, str]

    def tie_weights(self) -> None:
        """Share the embedding matrix with lm_head where the config ties them (again after the
        model leaves the meta device, which unties shared parameters)."""
        ...

    def init_buffers(self) -> None:
        """Compute the buffers no checkpoint holds (RoPE tables), once the weights are in."""
        ...

    def position_table(self) -> torch.Tensor | None:
        """Learned positions: the (max_positions, hidden) table added to the embeddings; None for RoPE."""
        ...

    def __call__(self, ids: torch.Tensor, cache: Cache | None = None, positions: torch.Tensor | None = None,
                 *, capture: AttentionCapture | None = None, last_only: bool = False) -> torch.Tensor: ...

    def inverse_frequencies(self) -> torch.Tensor | None:
        """RoPE models: each rotated pair's angle per position (radians), as the model uses it
        (the global layers' where local layers have their own); None for learned positions."""
        ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, hidden): rows of the embedding matrix times any scale the
        architecture applies (Gemma: √hidden), before any position is added."""
        ...

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., vocab) from a residual stream (..., hidden): final norm, then lm_head (and
        the soft cap, where the architecture has one): what forward returns for the last layer."""
        ...

    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final hidden states (B, T, hidden) of a fresh sequence ids (B, T), no cache: the
        residual stream after the last layer and the final norm, what lm_head reads (HF's
        last_hidden_state). The server's /v1/embeddings pools them."""
        ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...
