"""Qwen3 (dense): Llama with an RMSNorm on every query and key head.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    attn: q, k, v = x·W ─RMSNorm each q head, each k head (q_norm, k_norm: head_dim weights)─
          RoPE on q, k ─softmax(q·k/√d)·v─ o_proj

Everything else is Llama's (llama.py): the norms, SwiGLU, RoPE, grouped-query heads, sliding
windows (use_sliding_window, from layer max_window_layers on), and the stack around the layers.
Unlike Qwen2, q/k/v carry a bias only when attention_bias is set, and then o_proj does too.
"""

from __future__ import annotations

from torch import nn

from nexttok.models import llama
from nexttok.models.attention import attend_cached
from nexttok.models.config import ModelConfig
from nexttok.models.llama import RMSNorm, apply_rope


class Attention(llama.Attention):
    """Llama's attention with an RMSNorm over each head of q and k before RoPE (Gemma 3's too,
    with its own norm and a scale on q)."""

    NORM: type[nn.Module] = RMSNorm
    q_scale = 1.0  # q is multiplied by this before attention (Gemma 3: √(head_dim / query_pre_attn_scalar))

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.q_norm = self.NORM(self.head_dim, config.norm_eps)  # over each head's head_dim
        self.k_norm = self.NORM(self.head_dim, config.norm_eps)

    def forward(self, x, cos, sin, masks, cache, capture):
        b, t, _ = x.shape
        heads = self.qkv_proj(x).view(b, t, -1, self.head_dim)  # (B, T, n_head + 2 n_kv, hd)
        q = self.q_norm(heads[:, :, : self.n_head])  # (B, T, n_head, hd)
        k = self.k_norm(heads[:, :, self.n_head : self.n_head + self.n_kv_head])  # (B, T, n_kv, hd)
        q = apply_rope(q, cos, sin).transpose(1, 2)  # (B, n_head, T, hd)
        k = apply_rope(k, cos, sin).transpose(1, 2)  # (B, n_kv, T, hd)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        v = heads[:, :, self.n_head + self.n_kv_head :].transpose(1, 2)  # (B, n_kv, T, hd)
        y = attend_cached(q, k, v, self.layer_idx, masks[self.window], cache, capture)  # (B, n_head, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))


class DecoderLayer(llama.DecoderLayer):
    attention_class = Attention


class Qwen3(llama.Llama):
    LAYER = DecoderLayer
