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

from nexttok.models import llama, moe
from nexttok.models.architecture import Architecture
from nexttok.models.config import positive_number, sparse_layers


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

ARCHITECTURES = (Architecture("glm4_moe", Glm4Moe, fields, renames=RENAMES, unused=unused),)
