"""Granite (granite-3.x dense): Llama with Granite's multipliers.

ids ─embed_tokens·embedding_multiplier→ x ─N × [x += residual_multiplier·attn(RMSNorm(x));
    x += residual_multiplier·SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head / logits_scaling→ logits

    attn: scores scaled by attention_multiplier instead of 1/√head_dim

The multipliers are llama.py's (ModelConfig), which Granite-MoE (granitemoe.py) shares.
"""

from __future__ import annotations

from nexttok.models import llama
from nexttok.models.architecture import Architecture
from nexttok.models.config import positive_number

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def fields(hf: dict) -> dict:
    out = llama.fields(hf, "granite")
    return {**out, "o_proj_bias": out["attention_bias"],
            **{name: positive_number(hf, name, 1.0) for name in MULTIPLIERS}}


ARCHITECTURES = (Architecture("granite", llama.Llama, fields),)
