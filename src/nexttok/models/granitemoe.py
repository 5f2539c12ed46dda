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
from nexttok.models.architecture import Architecture
from nexttok.models.config import positive_number


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

ARCHITECTURES = (Architecture("granitemoe", GraniteMoe, fields, renames=RENAMES),)
