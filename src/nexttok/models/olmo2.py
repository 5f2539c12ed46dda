"""OLMo 2 and OLMo 3: Llama with the norms after attention and the MLP instead of before, and one
RMSNorm over all of q and one over all of k.

ids ─embed_tokens→ x ─N × [x += RMSNorm(attn(x)); x += RMSNorm(SwiGLU(x))]→ RMSNorm ─lm_head→ logits

    attn: q = RMSNorm(x·Wq) over all heads at once (q_norm: n_head·head_dim weights), likewise k;
          then RoPE, grouped-query attention, o_proj; q/k/v/o with a bias where attention_bias

OLMo 3 adds sliding-window layers (by default three of every four; config.layer_types), whose
RoPE is plain (rope_parameters["sliding_attention"]) while the full layers' may be scaled (YaRN
for OLMo-3's long context): each layer kind has its own rotation, as Gemma 3's.

GGUF: llama.cpp writes both as "olmo2" (q and k rows as HF's, not interleaved); an OLMo 3 file is
one with attention.sliding_window, its layers as attention.sliding_window_pattern says (by default
the last of every 4 global), the sliding layers' theta rope.freq_base_swa. (llama.cpp's own olmo2
graph turns the sliding layers at rope.freq_base: the same where the two are equal, as in OLMo 3.)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from nexttok.models import llama, olmoe, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ROPE_TYPES, ConfigError, ModelConfig, layer_type_rope
from nexttok.models.llama import RMSNorm
from nexttok.models.rope import rope_inverse_frequencies


class PostNormLayer(llama.DecoderLayer):
    """x += norm(attn(x)); x += norm(mlp(x)): the norms after each sublayer (OLMo 2, EXAONE 4)."""

    attention_class = olmoe.Attention  # q and k normed over all heads at once

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        del self.input_layernorm
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.norm_eps)

    def forward(self, x, cos, sin, masks, cache, capture):
        x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin, masks, cache, capture))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Olmo2(llama.Llama):
    LAYER = PostNormLayer


class Olmo3Layer(PostNormLayer):
    def forward(self, x, cos, sin, local_cos, local_sin, masks, cache, capture):
        """cos, sin: the full layers' rotation; local_cos, local_sin: the sliding layers'."""
        if self.self_attn.window is not None:
            cos, sin = local_cos, local_sin
        return super().forward(x, cos, sin, masks, cache, capture)


class Olmo3(Olmo2):
    LAYER = Olmo3Layer

    def declare_buffers(self) -> None:
        super().declare_buffers()
        self.register_buffer("local_cos", torch.empty(0), persistent=False)
        self.register_buffer("local_sin", torch.empty(0), persistent=False)

    def init_buffers(self) -> None:
        """The full layers' tables (llama.py: scaled where rope_scaling says), and the sliding layers'
        (theta rope_local_base_freq, unscaled)."""
        super().init_buffers()
        local = replace(self.config, rope_theta=self.config.rope_local_base_freq, rope_scaling=None)
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
        angles = positions[:, None] * rope_inverse_frequencies(local)[None, :]
        self.local_cos, self.local_sin = angles.cos().to(self.rope_cos.device), angles.sin().to(self.rope_cos.device)

    def rotations(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        rows = q_pos.clamp(min=0)
        local = self.local_cos[rows].to(dtype)[:, :, None], self.local_sin[rows].to(dtype)[:, :, None]
        return (*self.rope(q_pos, dtype), *local)


def olmo2_fields(hf: dict) -> dict:
    out = llama.fields(hf, "olmo2")
    return {**out, "o_proj_bias": out["attention_bias"]}


def olmo3_fields(hf: dict) -> dict:
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
    theta, scaling, local_theta = layer_type_rope(hf, ROPE_TYPES, 10000.0, hf.get("rope_theta", 10000.0))
    out = llama.fields({**hf, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}, "olmo3")
    return {**out, "o_proj_bias": out["attention_bias"], "rope_scaling": scaling, "rope_local_base_freq": local_theta,
            "layer_types": types, "sliding_window": hf.get("sliding_window", 4096)}


def gguf_config(meta: GGUFMeta) -> dict:
    """An olmo2 file: OLMo 3 where it has a sliding window (llama.cpp's olmo2 slides then), else OLMo 2."""
    config = llama.gguf_config(meta)
    window = meta.get("attention.sliding_window")
    if not window:
        return {**config, "model_type": "olmo2"}
    full = {**(config.pop("rope_scaling", None) or {"rope_type": "default"}), "rope_theta": config["rope_theta"]}
    local = {"rope_type": "default", "rope_theta": meta.get("rope.freq_base_swa", config["rope_theta"])}
    return {**config, "model_type": "olmo3", "sliding_window": window,
            "layer_types": meta.layer_types(config["num_hidden_layers"], 4),
            "rope_parameters": {"full_attention": full, "sliding_attention": local}}


def olmo2_metadata(config: ModelConfig) -> dict:
    """llama.cpp's olmo2: q rows hidden_size, an output layer, no attention biases (none on attn_output)."""
    representable(config.head_dim * config.num_attention_heads == config.hidden_size,
                  "a head_dim other than hidden_size / heads in an olmo2 file")
    representable(not config.attention_bias, "attention biases in an olmo2 file")
    representable(not config.tie_word_embeddings, "tied embeddings in an olmo2 file (llama.cpp wants output.weight)")
    return llama.gguf_metadata(config)


def olmo3_metadata(config: ModelConfig) -> dict:
    """As the converter writes OLMo 3: the window and which layers slide, and the sliding layers' theta."""
    if not config.sliding_window:
        raise ConfigError("an OLMo 3 GGUF needs a sliding_window (without one the file reads as OLMo 2)")
    return {**olmo2_metadata(config), "rope.freq_base_swa": float(config.rope_local_base_freq),
            "attention.sliding_window": config.sliding_window,
            "attention.sliding_window_pattern": [t == "sliding_attention" for t in config.layer_types]}


# norms after the sublayers (no attn_norm, ffn_norm); one norm over all of q, one over all of k
POST_NORM_TENSORS = {
    **{k: v for k, v in llama.GGUF_TENSORS.items() if k not in ("attn_norm.weight", "ffn_norm.weight")},
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    **qwen3.QK_NORM_TENSORS,
}

ARCHITECTURES = (
    Architecture("olmo2", Olmo2, olmo2_fields, GGUFLayout("olmo2", gguf_config, POST_NORM_TENSORS,
                                                          hf_class="Olmo2ForCausalLM", metadata=olmo2_metadata)),
    Architecture("olmo3", Olmo3, olmo3_fields, GGUFLayout("olmo2", gguf_config, POST_NORM_TENSORS,
                                                          hf_class="Olmo3ForCausalLM", metadata=olmo3_metadata)),
)
