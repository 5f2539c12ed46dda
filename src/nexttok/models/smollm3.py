"""SmolLM3 (SmolLM3-3B): Llama with no RoPE on every no_rope_layer_interval-th layer (NoPE).

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

no_rope_layers[i] is 1 where layer i rotates q and k (RoPE), 0 where it does not: by default every
4th layer (3, 7, 11, ...) attends without positions, which SmolLM3's authors found helps long
contexts. Where use_sliding_window, the NoPE layers slide. q/k/v/o carry a bias where
attention_bias, the MLP where mlp_bias; embeddings tied by default. Everything else is Llama's.
"""

from __future__ import annotations

from nexttok.models import llama
from nexttok.models.architecture import Architecture
from nexttok.models.config import ConfigError


def fields(hf: dict) -> dict:
    layers = hf["num_hidden_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    if type(interval) is not int or interval <= 0:
        raise ConfigError(f"no_rope_layer_interval must be a positive integer, got {interval!r}")
    nope = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    types = hf.get("layer_types") or ["sliding_attention" if window and not nope[i] else "full_attention"
                                      for i in range(layers)]
    out = llama.fields({**hf, "tie_word_embeddings": hf.get("tie_word_embeddings", True)}, "smollm3")
    return {**out, "no_rope_layers": list(nope), "o_proj_bias": out["attention_bias"],
            "sliding_window": window if "sliding_attention" in types else None, "layer_types": types}


ARCHITECTURES = (Architecture("smollm3", llama.Llama, fields),)
