"""LFM2 (Liquid AI): a hybrid of short causal convolutions and grouped-query attention.

ids ─embed_tokens→ x ─N × [x += op(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    op on a "full_attention" layer: Qwen3's attention (an RMSNorm on each q and k head, RoPE)
    op on a "conv" layer:  b, c, u = x·W_in (three of hidden each)
                           y = c ⊙ conv(b ⊙ u)     conv: depthwise over the last conv_kernel tokens
                           out = y·W_out

A convolution layer sees only its last conv_kernel inputs (3 in LFM2), so all it keeps between
steps is a (hidden, conv_kernel - 1) window of them: a recurrent state whose size does not grow
with the context, where an attention layer's keys and values grow by a row per token. Most of
LFM2's layers are convolutions (10 of 16 in LFM2-1.2B), which is why its cache stays small at long
contexts. Padding must not enter that window: a padded token's input is zeroed (masks[TOKENS]),
as the convolution's own zero padding at the start.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models import llama, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta
from nexttok.models.attention import TOKENS
from nexttok.models.config import ConfigError, ModelConfig


class DepthwiseConv(nn.Module):
    """A depthwise convolution's weights: weight (channels, kernel), as llama.cpp stores it (HF's
    Conv1d has (channels, 1, kernel): TRANSFORMS squeezes it), and a bias per channel or none."""

    def __init__(self, channels: int, kernel: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None


class ShortConv(nn.Module):
    """The gated depthwise causal convolution of a "conv" layer; its state: the last conv_kernel - 1
    gated inputs b ⊙ u of each row (B, hidden, conv_kernel - 1), oldest first."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        hidden, bias = config.hidden_size, config.conv_bias
        self.layer_idx, self.kernel = layer_idx, config.conv_kernel
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.conv = DepthwiseConv(hidden, self.kernel, bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor, masks: dict, cache) -> torch.Tensor:
        tokens = masks.get(TOKENS)
        if tokens is not None and not bool(tokens.all()):
            x = x * tokens[..., None].to(x.dtype)  # padding takes no part
        b, c, u = self.in_proj(x).chunk(3, dim=-1)  # (B, T, hidden) each
        gated = (b * u).transpose(1, 2)  # (B, hidden, T)
        past = self.kernel - 1
        if cache is None:
            window = F.pad(gated, (past, 0))  # nothing before the first token
        else:
            state = cache.state(self.layer_idx, "conv", (gated.shape[1], past), gated.dtype)
            window = torch.cat((state, gated), dim=-1)
            state.copy_(window[..., -past:])  # the last kernel - 1 inputs, for the next call
        y = depthwise(window, self.conv.weight, self.conv.bias)  # (B, hidden, T)
        return self.out_proj(c * y.transpose(1, 2))


def depthwise(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A causal depthwise convolution written out: window (B, C, T + K - 1), weight (C, K) -> (B, C, T),
    out[t] = sum_k weight[:, k] * window[t + k]. F.conv1d's depthwise path costs ~3.4 ms a decode
    step at 2,048 channels here, this ~0.2 ms."""
    k = weight.shape[1]
    t = window.shape[-1] - k + 1
    out = window[..., :t] * weight[:, :1]
    for i in range(1, k):
        out = out + window[..., i : i + t] * weight[:, i : i + 1]
    return out if bias is None else out + bias[:, None]


class DecoderLayer(llama.DecoderLayer):
    """Attention or a short convolution, then the SwiGLU MLP, each after an RMSNorm."""

    attention_class = qwen3.Attention

    def __init__(self, config: ModelConfig, layer_idx: int):
        nn.Module.__init__(self)
        self.input_layernorm = llama.RMSNorm(config.hidden_size, config.norm_eps)
        self.recurrent = config.layer_types[layer_idx] == "conv"
        if self.recurrent:
            self.conv = ShortConv(config, layer_idx)
        else:
            self.self_attn = self.attention_class(config, layer_idx)
        self.post_attention_layernorm = llama.RMSNorm(config.hidden_size, config.norm_eps)
        self.sparse = False
        self.mlp = self.mlp_class(config)
        self.scale = 1.0

    def forward(self, x, cos, sin, masks, cache, capture):
        h = self.input_layernorm(x)
        x = x + (self.conv(h, masks, cache) if self.recurrent else self.self_attn(h, cos, sin, masks, cache, capture))
        return x + self.mlp(self.post_attention_layernorm(x))


class Lfm2(llama.Llama):
    LAYER = DecoderLayer

    def window_of(self, block: nn.Module) -> int | None:
        return None if block.recurrent else block.self_attn.window


def fields(hf: dict) -> dict:
    """LFM2's config.json: layer_types ("conv" / "full_attention"; or full_attn_idxs), conv_L_cache
    (the convolution's kernel), norm_eps, and the MLP's width as Lfm2MLP computes it."""
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        full = hf.get("full_attn_idxs")
        full = range(layers) if full is None else full
        types = ["full_attention" if i in full else "conv" for i in range(layers)]
    inner = hf.get("intermediate_size", hf.get("block_ff_dim"))
    if type(inner) is not int or inner <= 0:
        raise ConfigError(f"intermediate_size must be a positive integer, got {inner!r}")
    if hf.get("block_auto_adjust_ff_dim", True):  # Lfm2MLP: two thirds, times a multiplier, rounded up
        inner = int(2 * inner / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            step = hf.get("block_multiple_of", 256)
            if type(step) is not int or step <= 0:
                raise ConfigError(f"block_multiple_of must be a positive integer, got {step!r}")
            inner = step * ((int(multiplier * inner) + step - 1) // step)
    tied = hf.get("tie_word_embeddings", hf.get("tie_embedding", True))
    out = llama.fields({**hf, "intermediate_size": inner, "rms_norm_eps": hf.get("norm_eps", 1e-5),
                        "tie_word_embeddings": tied, "layer_types": types}, "lfm2")
    return {**out, "conv_kernel": hf.get("conv_L_cache", 3), "conv_bias": bool(hf.get("conv_bias", False))}


RENAMES = (  # Lfm2ForCausalLM's module names -> ours (its convolution's out_proj keeps its name)
    ("self_attn.out_proj", "self_attn.o_proj"), ("self_attn.q_layernorm", "self_attn.q_norm"),
    ("self_attn.k_layernorm", "self_attn.k_norm"), ("operator_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"), ("feed_forward.w1", "mlp.gate_proj"),
    ("feed_forward.w3", "mlp.up_proj"), ("feed_forward.w2", "mlp.down_proj"), ("model.embedding_norm", "model.norm"),
)

# HF's Conv1d -> (hidden, kernel)
TRANSFORMS = {".conv.conv.weight": lambda w, config: w.squeeze(1) if w.dim() == 3 else w}


def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's lfm2: head_count_kv per layer, 0 on a convolution layer (which is how its layer
    types are written); shortconv.l_cache the kernel; feed_forward_length the MLP's width as is."""
    kv = meta.key("attention.head_count_kv")
    per_layer = list(kv) if isinstance(kv, list) else [kv] * meta.key("block_count")
    heads = {n for n in per_layer if n}
    if len(heads) != 1:
        raise ConfigError(f"GGUF {meta.arch}.attention.head_count_kv {per_layer} must name one KV head count for "
                          "the attention layers (0 on the convolution layers)")
    kv_key = f"{meta.arch}.attention.head_count_kv"
    config = llama.gguf_config(dataclasses.replace(meta, values={**meta.values, kv_key: heads.pop()}))
    return {**config, "layer_types": ["full_attention" if n else "conv" for n in per_layer],
            "norm_eps": config["rms_norm_eps"], "conv_L_cache": meta.key("shortconv.l_cache"),
            "block_auto_adjust_ff_dim": False}


def gguf_metadata(config: ModelConfig) -> dict:
    if config.conv_bias:
        raise ConfigError("GGUF export: llama.cpp's lfm2 has no convolution biases")
    kv = [0 if kind == "conv" else config.num_key_value_heads for kind in config.layer_types]
    return {**llama.gguf_metadata(config), "attention.head_count_kv": kv, "shortconv.l_cache": config.conv_kernel}


GGUF_TENSORS = {
    **llama.GGUF_TENSORS, **qwen3.QK_NORM_TENSORS, "token_embd_norm.weight": "model.norm.weight",
    "shortconv.conv.weight": "conv.conv.weight", "shortconv.in_proj.weight": "conv.in_proj.weight",
    "shortconv.out_proj.weight": "conv.out_proj.weight",
}
del GGUF_TENSORS["output_norm.weight"]  # the final norm is token_embd_norm in llama.cpp's lfm2

ARCHITECTURES = (
    Architecture("lfm2", Lfm2, fields, GGUFLayout("lfm2", gguf_config, GGUF_TENSORS, hf_class="Lfm2ForCausalLM",
                                                  metadata=gguf_metadata),
                 renames=RENAMES, transforms=TRANSFORMS),
)
