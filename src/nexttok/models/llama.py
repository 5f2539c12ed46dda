"""Llama family: Llama (1-3), SmolLM, Qwen2, Mistral.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

Attention uses rotary position embeddings (RoPE) on q and k, grouped-query heads (several query
heads share one key/value head), optional q/k/v bias (Qwen2) and sliding windows (Mistral).
Module names follow the HF checkpoint ("model." prefix aside), except that q/k/v and gate/up are
each one fused matmul (fused.py); the loaders stack the checkpoint's parts.

Variants in files of their own swap one part and keep the rest: Qwen3 (qwen3.py) the attention,
Phi-3 (phi3.py) the attention, the MLP and the RoPE (DecoderLayer.attention_class / mlp_class,
Llama.LAYER, Llama.rope).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models import kernels
from nexttok.models.attention import attend_cached
from nexttok.models.config import ModelConfig
from nexttok.models.decoder import LlamaLayout
from nexttok.models.fused import FusedLinear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.takes(x):  # the same steps in one call
            return kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()  # the mean of squares in float32, as the reference does
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Rotation speed of each pair of dimensions (head_dim // 2,), with rope_scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: long wavelengths slowed by `factor`, short kept, a smooth blend in between
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, blended, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + d/2]) by each position's angle. x (B, T, H, D); cos/sin (B, T, 1, D/2)."""
    if kernels.takes(x):  # the same arithmetic in one call
        return kernels.rope(x, cos, sin, x.shape[2])
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    PARALLEL_HEADS = ("qkv_proj", "o_proj")  # tensor parallelism (parallel_layers.py): heads split over ranks

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        hidden, bias = config.hidden_size, config.attention_bias
        q_rows, kv_rows = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.qkv_proj = FusedLinear(hidden, {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows}, bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, hidden, bias=config.o_proj_bias)
        sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.window = config.sliding_window if sliding else None

    def forward(self, x, cos, sin, masks, cache, capture):
        b, t, _ = x.shape
        heads = self.qkv_proj(x).view(b, t, -1, self.head_dim)  # (B, T, n_head + 2 n_kv, hd)
        qk = apply_rope(heads[:, :, : self.n_head + self.n_kv_head], cos, sin)  # q and k in one rotation
        q = qk[:, :, : self.n_head].transpose(1, 2)  # (B, n_head, T, hd)
        k = qk[:, :, self.n_head :].transpose(1, 2)  # (B, n_kv, T, hd)
        v = heads[:, :, self.n_head + self.n_kv_head :].transpose(1, 2)  # (B, n_kv, T, hd)
        y = attend_cached(q, k, v, self.layer_idx, masks[self.window], cache, capture)  # (B, n_head, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    PARALLEL_INNER = ("gate_up_proj", "down_proj")  # tensor parallelism: the inner width split over ranks

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = FusedLinear(hidden, {"gate_proj": inner, "up_proj": inner}, bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_up_proj(x)))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] (..., 2 inner) -> (..., inner)."""
    if kernels.takes(gate_up):  # the same arithmetic in one call
        return kernels.glu(gate_up, kernels.SILU_MUL)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class DecoderLayer(nn.Module):
    # the parts a variant of the family swaps (qwen3.py: q/k norms; phi3.py: fused checkpoint tensors)
    attention_class: type[nn.Module] = Attention
    mlp_class: type[nn.Module] = MLP

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = self.attention_class(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = self.mlp_class(config)

    def forward(self, x, cos, sin, masks, cache, capture):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, masks, cache, capture)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(LlamaLayout):
    LAYER: type[nn.Module] = DecoderLayer  # a variant's own layer (qwen3.py, phi3.py)
    NORM = RMSNorm

    def declare_buffers(self) -> None:
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    def init_buffers(self) -> None:
        """(Re)compute the RoPE tables (max_position_embeddings, head_dim // 2) in float32."""
        device = self.norm.weight.device
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
        angles = positions[:, None] * rope_inverse_frequencies(self.config)[None, :]  # (P, hd/2)
        self.rope_cos = angles.cos().to(device)
        self.rope_sin = angles.sin().to(device)

    def rotations(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What each layer takes besides x: RoPE's cos and sin at the positions."""
        return self.rope(q_pos, dtype)

    def inverse_frequencies(self) -> torch.Tensor:
        """Radians per position of each rotated pair of dimensions (head_dim // 2,)."""
        return rope_inverse_frequencies(self.config)

    def rope(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B, T, 1, hd/2) of the angles at positions q_pos (B, T); padding (-1) gets
        position 0's."""
        rows = q_pos.clamp(min=0)
        return self.rope_cos[rows].to(dtype)[:, :, None], self.rope_sin[rows].to(dtype)[:, :, None]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, hidden): the rows of the embedding matrix (no position here: RoPE
        rotates q and k inside attention)."""
        return self.embed_tokens(ids)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from a residual stream (..., hidden): the final norm, then lm_head."""
        return self.lm_head(self.norm(x))
