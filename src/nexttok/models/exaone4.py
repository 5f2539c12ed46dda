"""EXAONE 4.0: OLMo 2's layers (norms after attention and the MLP) with an RMSNorm on each q and k
head, and sliding-window layers that rotate q and k while the global ones use no positions (NoPE).

ids ─embed_tokens→ x ─N × [x += RMSNorm(attn(x)); x += RMSNorm(SwiGLU(x))]→ RMSNorm ─lm_head→ logits

Where a sliding_window is set, sliding_window_pattern (every pattern-th layer global: 4 is "LLLG")
or layer_types chooses the kinds; without one every layer is global and rotates. No biases.

GGUF (llama.cpp's exaone4): OLMo 2's tensors with per-head q/k norms, q and k rows as HF's; the
window and the layer kinds in attention.sliding_window(_pattern), as the converter writes them.
(llama.cpp's own exaone4 slides, and leaves the global layers unrotated, only in a 64-layer model,
EXAONE-4.0-32B, whose window it takes as 4096 where the file has none; elsewhere it rotates every
layer and attends over all keys.)
"""

from __future__ import annotations

from nexttok.models import llama, olmo2
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ConfigError, ModelConfig


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


def gguf_config(meta: GGUFMeta) -> dict:
    """The window and the layer kinds from the metadata (llama.cpp's 4096 for a 64-layer file without
    one); one RoPE theta for every rotating layer, as in HF's EXAONE 4."""
    config = llama.gguf_config(meta)
    layers = config["num_hidden_layers"]
    window = meta.get("attention.sliding_window", 4096 if layers == 64 else None)
    if meta.get("rope.freq_base_swa", config["rope_theta"]) != config["rope_theta"]:
        raise ConfigError("GGUF metadata exaone4.rope.freq_base_swa other than rope.freq_base is not supported")
    if not window:
        return {**config, "sliding_window": None}
    return {**config, "sliding_window": window, "layer_types": meta.layer_types(layers, 4)}


def gguf_metadata(config: ModelConfig) -> dict:
    representable(config.head_dim * config.num_attention_heads == config.hidden_size,
                  "a head_dim other than hidden_size / heads in an exaone4 file")
    sliding = "sliding_attention" in config.layer_types
    representable(sliding or all(config.no_rope_layers), "global layers without RoPE but no sliding layer")
    out = llama.gguf_metadata(config)
    if sliding:
        out["attention.sliding_window_pattern"] = [t == "sliding_attention" for t in config.layer_types]
    return out


GGUF = GGUFLayout("exaone4", gguf_config, olmo2.POST_NORM_TENSORS, hf_class="Exaone4ForCausalLM",
                  metadata=gguf_metadata)

ARCHITECTURES = (Architecture("exaone4", Exaone4, fields, GGUF),)
