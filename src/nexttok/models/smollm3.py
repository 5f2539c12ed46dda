"""SmolLM3 (SmolLM3-3B): Llama with no RoPE on every no_rope_layer_interval-th layer (NoPE).

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

no_rope_layers[i] is 1 where layer i rotates q and k (RoPE), 0 where it does not: by default every
4th layer (3, 7, 11, ...) attends without positions, which SmolLM3's authors found helps long
contexts. Where use_sliding_window, the NoPE layers slide. q/k/v/o carry a bias where
attention_bias, the MLP where mlp_bias; embeddings tied by default. Everything else is Llama's.

GGUF (llama.cpp's smollm3): Llama's tensors, q and k rows interleaved as its converter does; the
file holds no NoPE pattern, llama.cpp hard-codes every 4th layer (and no sliding window).
"""

from __future__ import annotations

from nexttok.models import llama
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ConfigError, ModelConfig


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


# llama.cpp's constant (src/models/smollm3.cpp: n_no_rope_layer_step = 4); no metadata key overrides it
NO_ROPE_INTERVAL = 4


def gguf_config(meta: GGUFMeta) -> dict:
    """SmolLM3 as llama.cpp runs it: NoPE on every 4th layer, no window; biases where the file has them."""
    return {**llama.gguf_config(meta), "no_rope_layer_interval": NO_ROPE_INTERVAL, "use_sliding_window": False,
            "attention_bias": "blk.0.attn_q.bias" in meta.tensor_names,
            "mlp_bias": "blk.0.ffn_up.bias" in meta.tensor_names}


def gguf_metadata(config: ModelConfig) -> dict:
    layers = config.num_hidden_layers
    representable(config.no_rope_layers == [int((i + 1) % NO_ROPE_INTERVAL != 0) for i in range(layers)],
                  f"no_rope_layers other than every {NO_ROPE_INTERVAL}th layer in a smollm3 file (llama.cpp's "
                  "constant)")
    representable("sliding_attention" not in config.layer_types, "a sliding window in a smollm3 file")
    representable(not config.attention_bias and not config.mlp_bias,
                  "attention or MLP biases in a smollm3 file (llama.cpp's has none on attn_output and the MLP)")
    return llama.gguf_metadata(config)


GGUF = GGUFLayout("smollm3", gguf_config, llama.GGUF_TENSORS, permuted=llama.QK_PERMUTED,
                  hf_class="SmolLM3ForCausalLM", metadata=gguf_metadata)

ARCHITECTURES = (Architecture("smollm3", llama.Llama, fields, GGUF),)
