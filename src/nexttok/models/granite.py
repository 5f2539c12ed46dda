"""Granite (granite-3.x dense): Llama with Granite's multipliers.

ids ─embed_tokens·embedding_multiplier→ x ─N × [x += residual_multiplier·attn(RMSNorm(x));
    x += residual_multiplier·SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head / logits_scaling→ logits

    attn: scores scaled by attention_multiplier instead of 1/√head_dim

The multipliers are llama.py's (ModelConfig), which Granite-MoE (granitemoe.py) shares, and so
are their GGUF keys (llama.cpp's *_scale). GGUF (llama.cpp's granite): Llama's tensors, q and k rows
(and biases) interleaved as its converter does.
"""

from __future__ import annotations

from nexttok.models import llama
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ModelConfig, positive_number

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
SCALES = {"embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale",
          "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale"}  # ours: llama.cpp's


def fields(hf: dict) -> dict:
    out = llama.fields(hf, "granite")
    return {**out, "o_proj_bias": out["attention_bias"],
            **{name: positive_number(hf, name, 1.0) for name in MULTIPLIERS}}


def gguf_scales(meta: GGUFMeta, head_dim: int) -> dict:
    """The multipliers from llama.cpp's *_scale keys: a missing one is no scaling (the attention's:
    1/√head_dim); logit_scale is required, as llama.cpp reads it."""
    defaults = {"attention_multiplier": head_dim**-0.5, "logits_scaling": meta.key("logit_scale")}
    return {ours: meta.get(theirs) or defaults.get(ours, 1.0) for ours, theirs in SCALES.items()}


def scale_metadata(config: ModelConfig) -> dict:
    """gguf_scales' inverse; the converter drops head_dim, so llama.cpp's is hidden_size / heads."""
    representable(config.head_dim * config.num_attention_heads == config.hidden_size,
                  f"a head_dim other than hidden_size / heads in a {config.model_type} file")
    return {theirs: float(getattr(config, ours)) for ours, theirs in SCALES.items()}


def gguf_config(meta: GGUFMeta) -> dict:
    config = llama.gguf_config(meta)
    return {**config, **gguf_scales(meta, config["head_dim"]),
            "attention_bias": "blk.0.attn_q.bias" in meta.tensor_names,
            "mlp_bias": "blk.0.ffn_up.bias" in meta.tensor_names}


def gguf_metadata(config: ModelConfig) -> dict:
    return {**llama.gguf_metadata(config), **scale_metadata(config)}


GGUF = GGUFLayout("granite", gguf_config, llama.GGUF_TENSORS, permuted=llama.QK_PERMUTED,
                  hf_class="GraniteForCausalLM", metadata=gguf_metadata)

ARCHITECTURES = (Architecture("granite", llama.Llama, fields, GGUF),)
