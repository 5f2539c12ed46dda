"""Qwen2-MoE and Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen2's and Qwen3's attention,
and a mixture of experts (moe.py) in place of the MLP.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += MoE(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    MoE: softmax over the router's logits, the num_experts_per_tok most likely experts, their
         probabilities renormalised to sum to 1 where norm_topk_prob (Qwen3-30B-A3B: 8 of 128)
    Qwen2-MoE adds a shared expert every token takes, scaled by sigmoid(x · shared_expert_gate)

A layer is sparse every decoder_sparse_step-th layer, except those in mlp_only_layers, which keep
a dense MLP of intermediate_size. Qwen2-MoE's q/k/v carry a bias (qkv_bias); Qwen3-MoE's q and k
are normed per head, and q/k/v/o carry a bias where attention_bias. Sliding windows: Qwen3-MoE's
covers every layer where use_sliding_window; Qwen2-MoE follows layer_types.
"""

from __future__ import annotations

from nexttok.models import llama, moe, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ModelConfig, sparse_layers


class Qwen3MoeLayer(qwen3.DecoderLayer):
    moe_class = moe.SparseMoE


class Qwen3Moe(llama.Llama):
    LAYER = Qwen3MoeLayer


class Qwen2MoeLayer(llama.DecoderLayer):
    moe_class = moe.SparseMoE


class Qwen2Moe(llama.Llama):
    LAYER = Qwen2MoeLayer


def _sparse(hf: dict) -> list[str]:
    return sparse_layers(hf["num_hidden_layers"], every=hf.get("decoder_sparse_step", 1),
                             dense=hf.get("mlp_only_layers") or [])


def qwen3_moe_fields(hf: dict) -> dict:
    out = llama.fields(hf, "qwen3_moe")
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    kind = "sliding_attention" if window else "full_attention"
    return {**out, **moe.fields(hf), "mlp_types": _sparse(hf), "o_proj_bias": out["attention_bias"],
            "sliding_window": window, "layer_types": [kind] * hf["num_hidden_layers"]}


def qwen2_moe_fields(hf: dict) -> dict:
    out = llama.fields(hf, "qwen2_moe")
    layers, window = hf["num_hidden_layers"], hf.get("sliding_window")
    if hf.get("use_sliding_window", False):  # HF's Qwen2MoeConfig rule where layer_types is not given
        start = hf.get("max_window_layers", 28)
        types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 and i < start else "full_attention"
                                          for i in range(layers)]
    else:
        window, types = None, ["full_attention"] * layers
    return {**out, **moe.fields(hf), "mlp_types": _sparse(hf), "attention_bias": bool(hf.get("qkv_bias", True)),
            "o_proj_bias": False, "sliding_window": window, "layer_types": types,
            "shared_expert_intermediate_size": hf.get("shared_expert_intermediate_size", 0),
            "shared_expert_gate": bool(hf.get("shared_expert_intermediate_size"))}


def qwen3_moe_gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's qwen3moe: every layer sparse, the top-k weights always renormalised."""
    return {**llama.gguf_config(meta), **moe.gguf_config(meta), "norm_topk_prob": True}


def qwen3_moe_gguf_metadata(config: ModelConfig) -> dict:
    _plain_layers(config, renormalised=True)
    representable(not config.o_proj_bias, "an attention output bias in a qwen3moe file")
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config)}


def qwen2_moe_gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's qwen2moe: every layer sparse, the top-k weights never renormalised, a gated shared expert."""
    return {**llama.gguf_config(meta), **moe.gguf_config(meta), "norm_topk_prob": False,
            "qkv_bias": "blk.0.attn_q.bias" in meta.tensor_names,
            "shared_expert_intermediate_size": meta.key("expert_shared_feed_forward_length")}


def qwen2_moe_gguf_metadata(config: ModelConfig) -> dict:
    _plain_layers(config, renormalised=False)
    representable(not config.tie_word_embeddings, "tied embeddings in a qwen2moe file")
    representable(config.head_dim * config.num_attention_heads == config.hidden_size,
                  "a head_dim other than hidden_size / heads in a qwen2moe file")
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config),
            "expert_shared_feed_forward_length": config.shared_expert_intermediate_size}


def _plain_layers(config: ModelConfig, renormalised: bool) -> None:
    """What llama.cpp's Qwen MoE graphs fix: every layer sparse, no window, renormalising or not."""
    representable(config.norm_topk_prob == renormalised,
                  f"norm_topk_prob {config.norm_topk_prob} (llama.cpp fixes it at {renormalised} for this family)")
    representable(set(config.mlp_types) == {"sparse"}, "dense layers among the sparse ones (mlp_only_layers)")
    representable(config.sliding_window is None, "a sliding window")


QWEN3_MOE_TENSORS = {**llama.GGUF_TENSORS, **qwen3.QK_NORM_TENSORS, **moe.GGUF_TENSORS}
QWEN2_MOE_TENSORS = {**llama.GGUF_TENSORS, **moe.GGUF_TENSORS, **moe.SHARED_GGUF_TENSORS}

ARCHITECTURES = (
    Architecture("qwen3_moe", Qwen3Moe, qwen3_moe_fields,
                 GGUFLayout("qwen3moe", qwen3_moe_gguf_config, QWEN3_MOE_TENSORS, hf_class="Qwen3MoeForCausalLM",
                            metadata=qwen3_moe_gguf_metadata)),
    Architecture("qwen2_moe", Qwen2Moe, qwen2_moe_fields,
                 GGUFLayout("qwen2moe", qwen2_moe_gguf_config, QWEN2_MOE_TENSORS, hf_class="Qwen2MoeForCausalLM",
                            metadata=qwen2_moe_gguf_metadata)),
)
