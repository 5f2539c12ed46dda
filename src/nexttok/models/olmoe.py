"""OLMoE (OLMoE-1B-7B): Llama with one RMSNorm over all of q and one over all of k, and a mixture
of experts in place of the MLP.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += MoE(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    attn: q = RMSNorm(x·Wq) over all heads at once (q_norm: n_head·head_dim weights), likewise k
    MoE:  softmax over the router's logits, the num_experts_per_tok (8) most likely of num_experts
          (64), renormalised where norm_topk_prob (OLMoE-1B-7B: not); experts of intermediate_size
"""

from __future__ import annotations

from nexttok.models import llama, moe, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ConfigError, ModelConfig


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


def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's olmoe: the top-k weights never renormalised; feed_forward_length is each expert's."""
    return {**llama.gguf_config(meta), **moe.gguf_config(meta), "norm_topk_prob": False}


def gguf_metadata(config: ModelConfig) -> dict:
    representable(not config.norm_topk_prob, "norm_topk_prob true (llama.cpp's olmoe never renormalises)")
    representable(config.num_key_value_heads == config.num_attention_heads,
                  "grouped-query heads in an olmoe file (its k_norm covers hidden_size values)")
    representable(not config.attention_bias and not config.tie_word_embeddings,
                  "attention biases or tied embeddings in an olmoe file")
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config)}


ARCHITECTURES = (
    Architecture("olmoe", Olmoe, fields, GGUFLayout(
        "olmoe", gguf_config, {**llama.GGUF_TENSORS, **qwen3.QK_NORM_TENSORS, **moe.GGUF_TENSORS},
        hf_class="OlmoeForCausalLM", metadata=gguf_metadata)),
)
