"""Granite-MoE (granite-3.x-1b-a400m, 3b-a800m): Llama's layers with Granite's multipliers, and a
mixture of experts in place of the MLP.

ids ─embed_tokens·embedding_multiplier→ x ─N × [x += residual_multiplier·attn(RMSNorm(x));
    x += residual_multiplier·MoE(RMSNorm(x))]→ RMSNorm ─lm_head / logits_scaling→ logits

    attn: scores scaled by attention_multiplier instead of 1/√head_dim
    MoE:  the num_experts_per_tok largest router logits, softmax over those; experts of
          intermediate_size

The checkpoint keeps the experts as two 3-D tensors, block_sparse_moe.input_linear (E, 2·inner,
hidden: gate rows, then up) and output_linear (E, hidden, inner), and the router as
block_sparse_moe.router.layer: renamed as they are read.
"""

from __future__ import annotations

from nexttok.models import llama, moe
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ModelConfig, positive_number


class GraniteMoeLayer(llama.DecoderLayer):
    moe_class = moe.SparseMoE


class GraniteMoe(llama.Llama):
    LAYER = GraniteMoeLayer


def fields(hf: dict) -> dict:
    out = llama.fields(hf, "granitemoe")
    return {**out, **moe.fields(hf, experts="num_local_experts", inner=None, router="topk_softmax"),
            "o_proj_bias": out["attention_bias"],
            **{name: positive_number(hf, name, 1.0) for name in (
                "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}}


RENAMES = ((".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
           (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
           (".block_sparse_moe.router.layer.", ".mlp.gate."))

SCALES = {"embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale",
          "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale"}


def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's granitemoe: the multipliers as *_scale keys (a missing one: no scaling; the
    attention's: 1/√head_dim); feed_forward_length is each expert's."""
    config = {**llama.gguf_config(meta), **moe.gguf_config(meta, "num_local_experts"),
              "attention_bias": "blk.0.attn_q.bias" in meta.tensor_names}
    head_dim = config["head_dim"]
    defaults = {"attention_multiplier": head_dim**-0.5, "logits_scaling": meta.key("logit_scale")}
    return {**config, **{ours: meta.get(theirs) or defaults.get(ours, 1.0) for ours, theirs in SCALES.items()}}


def gguf_metadata(config: ModelConfig) -> dict:
    representable(config.head_dim * config.num_attention_heads == config.hidden_size,
                  "a head_dim other than hidden_size / heads in a granitemoe file")
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config),
            **{theirs: float(getattr(config, ours)) for ours, theirs in SCALES.items()}}


GGUF = GGUFLayout("granitemoe", gguf_config, {**llama.GGUF_TENSORS, **moe.GGUF_TENSORS}, permuted=llama.QK_PERMUTED,
                  hf_class="GraniteMoeForCausalLM", metadata=gguf_metadata)

ARCHITECTURES = (Architecture("granitemoe", GraniteMoe, fields, GGUF, renames=RENAMES),)
