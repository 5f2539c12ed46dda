"""EXAONE 4.0: OLMo 2's layers (norms after attention and the MLP) with an RMSNorm on each q and k
head, and sliding-window layers that rotate q and k while the global ones use no positions (NoPE).

ids ─embed_tokens→ x ─N × [x += RMSNorm(attn(x)); x += RMSNorm(SwiGLU(x))]→ RMSNorm ─lm_head→ logits

Where a sliding_window is set, sliding_window_pattern (every pattern-th layer global: 4 is "LLLG")
or layer_types chooses the kinds; without one every layer is global and rotates. No biases.
"""

from __future__ import annotations

from nexttok.models import llama, olmo2
from nexttok.models.architecture import Architecture
from nexttok.models.config import ConfigError


class Attention(llama.Attention):
    QK_NORM = "head"


class Exaone4Layer(olmo2.PostNormLayer):
    attention_class = Attention


class Exaone4(llama.Llama):
    LAYER = Exaone4Layer


def fields(hf: dict) -> dict:
    layers, window = hf["num_hidden_layers"], hf.get("sliding_window")
    types = hf.get("layer_types") or _pattern(hf.get("sliding_window_pattern", 4), layers) if window else \
        ["full_attention"] * layers
    nope = [int(window is None or kind == "sliding_attention") for kind in types]  # global layers: no RoPE
    out = llama.fields(hf, "exaone4")
    return {**out, "attention_bias": False, "o_proj_bias": False, "mlp_bias": False, "layer_types": types,
            "sliding_window": window if "sliding_attention" in types else None, "no_rope_layers": nope}


def _pattern(pattern, layers: int) -> list[str]:
    """sliding_window_pattern as HF reads it: 4 -> "LLLG" repeated (HF's config documents a string
    form too, but computes with an int only)."""
    if type(pattern) is int and pattern > 0:
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    raise ConfigError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")


ARCHITECTURES = (Architecture("exaone4", Exaone4, fields),)
