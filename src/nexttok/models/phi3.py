"""Phi-3 (Phi-3, Phi-3.5 mini, Phi-4-mini): Llama with q/k/v and gate/up each stored as one
checkpoint tensor, and LongRoPE.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

The layers are Llama's (llama.py) except for how their weights are stored: qkv_proj holds the
q rows, then k, then v, and gate_up_proj the gate rows, then up (Llama checkpoints keep the parts
apart and the loader stacks them). No biases. A sliding_window applies to every layer.

RoPE: partial_rotary_factor < 1 (Phi-4-mini: 0.75) rotates only the first rotary_dim dimensions
of each head. LongRoPE ("longrope", once "su") divides each frequency by a factor of its own:
short_factor up to original_max_position_embeddings, long_factor past it, and scales cos and sin
by attention_factor (default sqrt(1 + ln(factor) / ln(original)), factor = context / original).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nexttok.models import llama
from nexttok.models.architecture import Architecture
from nexttok.models.config import ModelConfig


def rope_frequencies(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Inverse frequencies (rotary_dim // 2,) up to the original context and past it, and the
    factor cos and sin are scaled by. Without LongRoPE: RoPE's own twice, and 1."""
    dim = config.rotary_dim
    powers = config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)  # (dim/2,)
    scaling = config.rope_scaling
    if scaling is None:
        return 1.0 / powers, 1.0 / powers, 1.0
    short = 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32) * powers)
    long = 1.0 / (torch.tensor(scaling["long_factor"], dtype=torch.float32) * powers)
    original = scaling["original_max_position_embeddings"]
    factor = scaling["factor"] or config.max_position_embeddings / original
    attention = scaling["attention_factor"]
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return short, long, attention


class Attention(llama.Attention):
    ONE_TENSOR = True  # q, k and v rows in one checkpoint tensor


class MLP(llama.MLP):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)  # one tensor


class DecoderLayer(llama.DecoderLayer):
    attention_class = Attention
    mlp_class = MLP


class Phi3(llama.Llama):
    LAYER = DecoderLayer

    def init_buffers(self) -> None:
        """The inverse frequencies, on the weights' device. Plain attributes, not buffers, so
        they stay float32 whatever the model is cast to: an angle position * frequency computed
        in bfloat16 would be off by radians at long positions."""
        device = self.norm.weight.device
        short, long, self.attention_factor = rope_frequencies(self.config)
        self.inv_freq_short, self.inv_freq_long = short.to(device), long.to(device)
        scaling = self.config.rope_scaling
        self.original_context = (scaling["original_max_position_embeddings"] if scaling is not None
                                 else self.config.max_position_embeddings)

    def inverse_frequencies(self) -> torch.Tensor:
        """Radians per position of each rotated pair (rotary_dim // 2,), within the original context."""
        return self.inv_freq_short

    def rope(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B, T, 1, rotary_dim/2) at positions q_pos (B, T) (-1, padding: position 0).

        A row takes the long factors when its furthest position in this call is past the original
        context, as HF transformers decides per call; keys already cached keep the rotation they
        were stored with. Per row, so a row's result does not depend on the others in a batch."""
        far = q_pos.amax(dim=1, keepdim=True) >= self.original_context  # (B, 1)
        inv_freq = torch.where(far[..., None], self.inv_freq_long, self.inv_freq_short)  # (B, 1, rd/2)
        angles = q_pos.clamp(min=0).float()[..., None] * inv_freq  # (B, T, rd/2)
        cos, sin = angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
        return cos.to(dtype)[:, :, None], sin.to(dtype)[:, :, None]


ROPE_TYPES = ("default", "longrope")  # as HF's Phi3Config; "su" is an older name of longrope


def fields(hf: dict) -> dict:
    """Phi-3's config.json: Llama's, with LongRoPE, partial rotary (Phi-4-mini) and no biases (as HF's
    Phi-3, whatever attention_bias or mlp_bias say)."""
    out = llama.fields(hf, "phi3", rope_kinds=ROPE_TYPES, partial_rotary_allowed=True)
    return {**out, "attention_bias": False, "o_proj_bias": False, "mlp_bias": False}


ARCHITECTURES = (Architecture("phi3", Phi3, fields),)
