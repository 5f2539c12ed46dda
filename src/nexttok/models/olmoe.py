"""OLMoE (OLMoE-1B-7B): Llama with one RMSNorm over all of q and one over all of k, and a mixture
of experts in place of the MLP.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += MoE(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    attn: q = RMSNorm(x·Wq) over all heads at once (q_norm: n_head·head_dim weights), likewise k
    MoE:  softmax over the router's logits, the num_experts_per_tok (8) most likely of num_experts
          (64), renormalised where norm_topk_prob (OLMoE-1B-7B: not); experts of intermediate_size
"""

from __future__ import annotations

from nexttok.models import llama, moe
from nexttok.models.architecture import Architecture
from nexttok.models.config import ConfigError


class Attention(llama.Attention):
    QK_NORM = "whole"


class OlmoeLayer(llama.DecoderLayer):
    attention_class = Attention
    moe_class = moe.SparseMoE


class Olmoe(llama.Llama):
    LAYER = OlmoeLayer


def fields(hf: dict) -> dict:
    if hf.get("clip_qkv") is not None:
        raise ConfigError(f"OLMoE's clip_qkv ({hf['clip_qkv']!r}) is not supported")
    out = llama.fields(hf, "olmoe")
    if out["head_dim"] not in (0, out["hidden_size"] // out["num_attention_heads"]):
        raise ConfigError("OLMoE's q/k norms assume head_dim = hidden_size / num_attention_heads")
    return {**out, **moe.fields(hf, inner=None), "o_proj_bias": out["attention_bias"]}


ARCHITECTURES = (Architecture("olmoe", Olmoe, fields),)
