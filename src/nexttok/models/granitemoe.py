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

from nexttok.models import granite, llama, moe
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta
from nexttok.models.config import ModelConfig, positive_number


class GraniteMoeLayer(llama.DecoderLayer):
    moe_class = moe.SparseMoE


class GraniteMoe(llama.Llama):
    LAYER = GraniteMoeLayer


def fields(hf: dict) -> dict:
    out = llama.fields(hf, "granitemoe")
    return {**out, **moe.fields(hf, experts="num_local_experts", inner=None, router="topk_softmax"),
            "o_proj_bias": out["attention_bias"],
            **{name: positive_number(hf, name, 1.0) for name in granite.MULTIPLIERS}}


RENAMES = ((".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
           (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
           (".block_sparse_moe.router.layer.", ".mlp.gate."))


def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's granitemoe: granite's multipliers (granite.py); feed_forward_length is each expert's."""
    config = {**llama.gguf_config(meta), **moe.gguf_config(meta, "num_local_experts"),
              "attention_bias": "blk.0.attn_q.bias" in meta.tensor_names}
    return {**config, **granite.gguf_scales(meta, config["head_dim"])}


def gguf_metadata(config: ModelConfig) -> dict:
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config), **granite.scale_metadata(config)}


GGUF = GGUFLayout("granitemoe", gguf_config, {**llama.GGUF_TENSORS, **moe.GGUF_TENSORS}, permuted=llama.QK_PERMUTED,
                  hf_class="GraniteMoeForCausalLM", metadata=gguf_metadata)

ARCHITECTURES = (Architecture("granitemoe", GraniteMoe, fields, GGUF, renames=RENAMES),)
