"""GLM-4-MoE (GLM-4.5, GLM-4.5-Air, GLM-4.6): attention with partial RoPE, and a DeepSeek-V3 style
mixture of experts after first_k_dense_replace dense layers.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += MLP or MoE(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    attn: q/k/v with a bias where attention_bias (o_proj without); an RMSNorm per q and k head
          where use_qk_norm; RoPE on the first half of each head (partial_rotary_factor 0.5)
    MoE:  sigmoid of the router's logits; the experts chosen by those scores plus
          e_score_correction_bias, among the topk_group best of n_group groups; their (unbiased)
          scores renormalised where norm_topk_prob, times routed_scaling_factor; plus
          n_shared_experts always-on experts (one MLP of n_shared_experts · moe_intermediate_size)

The checkpoint's shared experts are mlp.shared_experts (renamed to our shared_expert). Its
next-token-prediction layers (num_nextn_predict_layers, past num_hidden_layers) are for
speculative decoding by the model itself, which HF transformers does not run: they are left
unread, as there.
"""

from __future__ import annotations

from nexttok.models import llama, moe, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ConfigError, ModelConfig, positive_number, sparse_layers


class Glm4MoeLayer(llama.DecoderLayer):
    moe_class = moe.SparseMoE


class Glm4Moe(llama.Llama):
    LAYER = Glm4MoeLayer


def fields(hf: dict) -> dict:
    if "partial_rotary_factor" not in (hf.get("rope_parameters") or {}) and "partial_rotary_factor" not in hf:
        hf = {**hf, "partial_rotary_factor": 0.5}  # Glm4MoeConfig's default
    out = llama.fields(hf, "glm4_moe", partial_rotary_allowed=True)
    layers = hf["num_hidden_layers"]
    norm = bool(hf.get("norm_topk_prob", True))
    return {**out, **moe.fields(hf, experts="n_routed_experts", router="sigmoid", norm=norm),
            "mlp_types": sparse_layers(layers, first_dense=hf.get("first_k_dense_replace", 1)),
            "use_qk_norm": bool(hf.get("use_qk_norm", False)),
            "routed_scaling_factor": positive_number(hf, "routed_scaling_factor", 1.0),
            "n_group": hf.get("n_group", 1), "topk_group": hf.get("topk_group", 1),
            "shared_expert_intermediate_size": hf["moe_intermediate_size"] * hf.get("n_shared_experts", 1)}


def unused(name: str, num_hidden_layers: int) -> bool:
    """The next-token-prediction layers' tensors (model.layers.N with N >= num_hidden_layers)."""
    parts = name.split(".")
    layer = parts[2] if len(parts) > 2 and parts[:2] == ["model", "layers"] else ""
    return layer.isdigit() and int(layer) >= num_hidden_layers


RENAMES = ((".mlp.shared_experts.", ".mlp.shared_expert."),)
SIGMOID = 2  # llama.cpp's expert_gating_func for sigmoid scores


def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's glm4moe: its routing from expert_* keys, with llama.cpp's defaults where a key is
    missing (expert_weights_norm false, expert_weights_scale 0 = none); the next-token-prediction
    blocks (nextn_predict_layers) past the model's own are not read."""
    if meta.get("expert_gating_func", SIGMOID) != SIGMOID:
        raise ConfigError(f"GGUF glm4moe expert_gating_func {meta.get('expert_gating_func')} is not supported "
                          "(sigmoid, 2, is)")
    config = llama.gguf_config(meta)
    return {**config, **moe.gguf_config(meta, "n_routed_experts"),
            "num_hidden_layers": config["num_hidden_layers"] - meta.get("nextn_predict_layers", 0),
            "n_shared_experts": meta.key("expert_shared_count"),
            "first_k_dense_replace": meta.get("leading_dense_block_count", 0),
            "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
            "routed_scaling_factor": meta.get("expert_weights_scale") or 1.0,
            "n_group": meta.get("expert_group_count", 1), "topk_group": meta.get("expert_group_used_count", 1),
            "use_qk_norm": "blk.0.attn_q_norm.weight" in meta.tensor_names,
            "attention_bias": "blk.0.attn_q.bias" in meta.tensor_names,
            "partial_rotary_factor": config.get("partial_rotary_factor", 1.0)}


def gguf_metadata(config: ModelConfig) -> dict:
    representable(config.n_group == 1 or config.topk_group < config.n_group,
                  "topk_group equal to n_group (llama.cpp asserts fewer)")
    first = config.mlp_types.index("sparse")
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config),
            "expert_shared_count": config.shared_expert_intermediate_size // config.moe_intermediate_size,
            "leading_dense_block_count": first, "expert_gating_func": SIGMOID,
            "expert_weights_norm": config.norm_topk_prob, "expert_weights_scale": float(config.routed_scaling_factor),
            "expert_group_count": config.n_group, "expert_group_used_count": config.topk_group}


GGUF_TENSORS = {
    **{k: v for k, v in llama.GGUF_TENSORS.items() if k != "ffn_norm.weight"}, **qwen3.QK_NORM_TENSORS,
    **moe.GGUF_TENSORS, **{k: v for k, v in moe.SHARED_GGUF_TENSORS.items() if "inp" not in k},
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
}

ARCHITECTURES = (
    Architecture("glm4_moe", Glm4Moe, fields, GGUFLayout("glm4moe", gguf_config, GGUF_TENSORS,
                                                          hf_class="Glm4MoeForCausalLM", metadata=gguf_metadata),
                 renames=RENAMES, unused=unused),
)
