"""Gemma 3, text only: Gemma3ForCausalLM, model_type gemma3_text (gemma-3-270m, gemma-3-1b).

ids ─embed_tokens·√hidden→ x ─N × [x += post_attention_norm(attn(input_norm(x)));
                                   x += post_feedforward_norm(GeGLU(pre_feedforward_norm(x)))]
    ─norm─lm_head→ logits ─cap·tanh(logits / cap), where final_logit_softcapping is set

Local and global layers (config.layer_types; by default five local, then one global): a local
layer attends over the last sliding_window keys and rotates q and k with RoPE theta
rope_local_base_freq (10k); a global one attends over every key with theta rope_theta (1M) and
its rope_scaling, where set. Attention: grouped-query heads, an RMSNorm on every q and k head,
scores scaled by 1/√query_pre_attn_scalar. GeGLU: down(gelu_tanh(gate(x)) * up(x)). Gemma's
RMSNorm stores its weight as an offset from 1 and computes in float32 throughout.

attn_logit_softcapping is not applied: Gemma 3 replaced it by the q/k norms, and HF transformers'
Gemma 3 ignores it too. Module names follow the checkpoint, but for q/k/v and gate/up, each one
fused matmul (fused.py; the loaders stack the checkpoint's parts).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models import llama, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta
from nexttok.models.config import ConfigError, ModelConfig, check_act, layer_type_rope
from nexttok.models.decoder import LlamaLayout
from nexttok.models.fused import FusedLinear
from nexttok.models.rope import rope_inverse_frequencies


class RMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in float32, back in x's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def rotation(q_pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, T, 1, hd/2) of the angles at positions q_pos (B, T); padding (-1) gets
    position 0's. Computed per call in float32, as the reference does: no table to hold."""
    angles = q_pos.clamp(min=0).float()[..., None] * inv_freq  # (B, T, hd/2)
    return angles.cos().to(dtype)[:, :, None], angles.sin().to(dtype)[:, :, None]


class Attention(qwen3.Attention):
    """Qwen3's attention (q and k normed per head, then rotated) with Gemma's norm, its own RoPE per
    layer kind (the layer passes local or global cos and sin), and its score scale."""

    NORM = RMSNorm

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.sliding = config.layer_types[layer_idx] == "sliding_attention"
        # the kernels scale scores by 1/√head_dim, Gemma by 1/√query_pre_attn_scalar: q makes up
        # the difference (1 when the two are equal, as in gemma-3-270m and 1b)
        self.q_scale = math.sqrt(self.head_dim / (config.query_pre_attn_scalar or self.head_dim))


class MLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x)). inner: its width (default intermediate_size)."""

    PARALLEL_INNER = ("gate_up_proj", "down_proj")  # tensor parallelism: the inner width split over ranks

    def __init__(self, config: ModelConfig, inner: int | None = None):
        super().__init__()
        hidden, inner = config.hidden_size, inner or config.intermediate_size
        self.gate_up_proj = FusedLinear(hidden, {"gate_proj": inner, "up_proj": inner}, False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(self, x, cos, sin, local_cos, local_sin, masks, cache, capture):
        """cos, sin: the global layers' rotation; local_cos, local_sin: the local layers'."""
        if self.self_attn.sliding:
            cos, sin = local_cos, local_sin
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, masks, cache, capture))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3(LlamaLayout):
    LAYER = DecoderLayer
    NORM = RMSNorm  # Gemma's: x · (1 + w)

    def init_buffers(self) -> None:
        """The inverse frequencies (head_dim // 2,) of global and local layers, on the weights'
        device. Plain attributes, not buffers, so they stay float32 whatever the model is cast
        to: an angle position * frequency in bfloat16 would be off by radians at long positions."""
        device = self.norm.weight.device
        local = replace(self.config, rope_theta=self.config.rope_local_base_freq or self.config.rope_theta,
                        rope_scaling=None)
        self.inv_freq = rope_inverse_frequencies(self.config).to(device)
        self.inv_freq_local = rope_inverse_frequencies(local).to(device)

    def rotations(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """What each layer takes besides x: cos and sin of the global and of the local RoPE."""
        return (*rotation(q_pos, self.inv_freq, dtype), *rotation(q_pos, self.inv_freq_local, dtype))

    def inverse_frequencies(self) -> torch.Tensor:
        """Radians per position of each rotated pair of dimensions (head_dim // 2,), global layers."""
        return self.inv_freq

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, hidden): rows of the embedding matrix times √hidden, the scale
        rounded to the rows' dtype as the reference does (lm_head, tied, uses the rows unscaled)."""
        x = self.embed_tokens(ids)
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from a residual stream (..., hidden): the final norm, lm_head, then the soft cap
        cap·tanh(logits / cap) where final_logit_softcapping is set."""
        logits = self.lm_head(self.norm(x))
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


ACTS = ("gelu_pytorch_tanh",)
MULTIMODAL = (". 'gemma3' is the multimodal Gemma 3 (4B and up); text-only Gemma 3 checkpoints "
              "(model_type gemma3_text: gemma-3-270m, gemma-3-1b) are supported")


ROPE_TYPES_NO_YARN = ("default", "linear", "llama3")


def fields(hf: dict) -> dict:
    """Gemma 3 text. Defaults are Gemma3TextConfig's. attn_logit_softcapping is ignored, as HF
    transformers' Gemma 3 ignores it (Gemma 3 replaced attention soft-capping by q/k norms)."""
    if hf.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention (EmbeddingGemma) is not supported: only causal models")
    layers = hf["num_hidden_layers"]
    pattern = hf.get("sliding_window_pattern", 6)  # older configs: every pattern-th layer is global
    if type(pattern) is not int or pattern <= 0:
        raise ConfigError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
    layer_types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    theta, scaling, local_theta = layer_type_rope(hf, ROPE_TYPES_NO_YARN, 1e6, hf.get("rope_local_base_freq", 10000.0))
    bias = bool(hf.get("attention_bias", False))
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=layers,
        num_attention_heads=hf["num_attention_heads"], num_key_value_heads=hf.get("num_key_value_heads", 4),
        intermediate_size=hf["intermediate_size"], max_position_embeddings=hf.get("max_position_embeddings", 131072),
        head_dim=hf.get("head_dim", 256), norm_eps=hf.get("rms_norm_eps", 1e-6),
        hidden_act=check_act(hf.get("hidden_activation", "gelu_pytorch_tanh"), ACTS),
        rope_theta=theta, rope_scaling=scaling, rope_local_base_freq=local_theta,
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        attention_bias=bias, o_proj_bias=bias, tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        sliding_window=hf.get("sliding_window", 4096), layer_types=layer_types,
    )


# The file holds no local RoPE theta and no layer pattern; llama.cpp hard-codes them
# (src/llama-model.cpp, LLM_ARCH_GEMMA3: every 6th layer global, local theta 10000, scores scaled
# by 1/√head_dim, by 1/√(hidden/heads) for the 62-layer 27B), and so does gguf_config
SLIDING_PATTERN, LOCAL_THETA = 6, 10000.0


def gguf_config(meta: GGUFMeta) -> dict:
    """Gemma 3 text as llama.cpp runs it: what the file leaves out is llama.cpp's constant; as in
    llama.cpp, no metadata key overrides those."""
    config = llama.gguf_config(meta)
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    del config["hidden_act"]
    # llama.cpp ends a turn at <end_of_turn> too (gemma-3's generation_config.json: eos [1, 106])
    end_of_turn = meta.tokens.index("<end_of_turn>") if "<end_of_turn>" in meta.tokens else None
    stops = [meta.values.get("tokenizer.ggml.eos_token_id"), end_of_turn]
    return {
        **config, "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": meta.key("attention.sliding_window"),
        "layer_types": ["full_attention" if (i + 1) % SLIDING_PATTERN == 0 else "sliding_attention"
                        for i in range(layers)],
        "rope_local_base_freq": LOCAL_THETA,
        "query_pre_attn_scalar": config["hidden_size"] // heads if layers == 62 else config["head_dim"],
        "final_logit_softcapping": None, "attn_logit_softcapping": None,  # llama.cpp applies neither to Gemma 3
        "eos_token_id": [i for i in dict.fromkeys(stops) if i is not None],
    }


# a norm before and after both attention and MLP, and one on each q and k head
GGUF_TENSORS = {
    **llama.GGUF_TENSORS,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    **qwen3.QK_NORM_TENSORS,
}

ARCHITECTURES = (
    Architecture("gemma3_text", Gemma3, fields, GGUFLayout("gemma3", gguf_config, GGUF_TENSORS, norm_offset=1.0,
                                                           hf_class="Gemma3ForCausalLM")),
)
