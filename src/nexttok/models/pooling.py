"""Text embeddings from a causal LM: the mean over a text's tokens of the model's final hidden
states (after the final norm: what lm_head reads), L2-normalised. llama.cpp's `--pooling mean`,
sentence-transformers' mean pooling; the server's POST /v1/embeddings answers with these."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from nexttok.models import Model


def mean_pooled(model: Model, ids: Sequence[int]) -> torch.Tensor:
    """The unit vector (hidden,) float32 of one input's token ids (already checked against the
    vocabulary and the context window). One input per forward pass: no padding to mask, and a
    vector does not change in its last bits with the other inputs of a request (a wider matmul
    sums in another order). The mean is taken in float32 whatever the model's dtype."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        hidden = model.final_hidden(torch.tensor([list(ids)], device=device))[0].float()  # (T, hidden)
        return F.normalize(hidden.mean(dim=0), dim=0).cpu()
