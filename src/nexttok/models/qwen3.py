"""Qwen3 (dense): Llama with an RMSNorm on every query and key head.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    attn: q, k, v = x·W ─RMSNorm each q head, each k head (q_norm, k_norm: head_dim weights)─
          RoPE on q, k ─softmax(q·k/√d)·v─ o_proj

Everything else is Llama's (llama.py): the norms, SwiGLU, RoPE, grouped-query heads, sliding
windows (use_sliding_window, from layer max_window_layers on), and the stack around the layers.
Unlike Qwen2, q/k/v carry a bias only when attention_bias is set, and then o_proj does too.
"""

from __future__ import annotations

from nexttok.models import llama
from nexttok.models.architecture import Architecture, GGUFLayout

QK_NORM_TENSORS = {"attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}


class Attention(llama.Attention):
    QK_NORM = "head"


class DecoderLayer(llama.DecoderLayer):
    attention_class = Attention


class Qwen3(llama.Llama):
    LAYER = DecoderLayer


def fields(hf: dict, model_type: str = "qwen3") -> dict:
    """Qwen3's config.json: Llama's, with Qwen3Config's head_dim default (128, not hidden // heads)
    and o_proj's bias following attention_bias."""
    out = llama.fields(hf, model_type, head_dim_default=128)
    out["o_proj_bias"] = out["attention_bias"]
    return out


ARCHITECTURES = (
    Architecture("qwen3", Qwen3, fields,
                 GGUFLayout("qwen3", llama.gguf_config, {**llama.GGUF_TENSORS, **QK_NORM_TENSORS},
                            hf_class="Qwen3ForCausalLM", metadata=llama.plain_metadata)),
)
