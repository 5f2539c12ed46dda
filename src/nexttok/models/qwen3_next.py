"""Qwen3-Next (Qwen3-Next-80B-A3B) and Qwen3.5: hybrids of gated DeltaNet and gated full attention.

ids ─embed_tokens→ x ─N × [x += mixer(RMSNorm(x)); x += MLP(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    mixer on a "linear_attention" layer: gated DeltaNet (gated_deltanet.py), a recurrent layer
    mixer on a "full_attention" layer:   Qwen3's attention (an RMSNorm on each q and k head) with
                                         q_proj doubled: each head's second half gates its output,
                                         o_proj(attn ⊙ sigmoid(gate)); RoPE on the first quarter of
                                         each head (partial_rotary_factor 0.25)
    MLP: Qwen3-Next's a mixture of experts with a shared expert behind a sigmoid gate (moe.py), on
         every layer but mlp_only_layers; Qwen3.5's a SwiGLU (qwen3_5_text) or Qwen3-Next's mixture,
         its top-k weights always renormalised (qwen3_5_moe_text)
    every RMSNorm but the DeltaNet's own is zero-centred: x / rms(x) · (1 + w)

Three layers in four are linear (full_attention_interval 4), so the cache keeps keys and values for
a quarter of the layers and a fixed-size state for the rest. Qwen3.5 is Qwen3-Next with its
DeltaNet's projections kept apart (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, where Qwen3-Next
interleaves q, k, v, z and b, a per key head) and interleaved mRoPE, which for text alone (its three
position ids equal) is plain RoPE. Qwen3.5 ships as the multimodal Qwen3_5ForConditionalGeneration
(model_type qwen3_5): its text model is read from text_config and model.language_model.*, the vision
tower and the multi-token-prediction head (mtp.*, which Qwen3-Next's checkpoints carry too) unread.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from nexttok.models import gemma3, llama, moe, qwen3
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.attention import attend_cached
from nexttok.models.config import ConfigError, ModelConfig, sparse_layers
from nexttok.models.fused import FusedLinear
from nexttok.models.gated_deltanet import GatedDeltaNet

RMSNorm = gemma3.RMSNorm  # zero-centred: x / rms(x) · (1 + w), in float32


class Attention(qwen3.Attention):
    """Qwen3's attention, q_proj giving each head's query then its output gate (2 head_dim rows)."""

    NORM = RMSNorm

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        q_rows, kv_rows = 2 * self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.qkv_proj = FusedLinear(config.hidden_size, {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows},
                                    config.attention_bias)

    def forward(self, x, cos, sin, masks, cache, capture):
        b, t, _ = x.shape
        nq, nk, hd = self.n_head, self.n_kv_head, self.head_dim
        q_gate, k, v = self.qkv_proj(x).split([2 * nq * hd, nk * hd, nk * hd], dim=-1)
        q_gate = q_gate.view(b, t, nq, 2 * hd)  # each head: its query, then its gate
        q, k = self.normed(q_gate[..., :hd], k.view(b, t, nk, hd))
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        y = attend_cached(q.transpose(1, 2), k.transpose(1, 2), v.view(b, t, nk, hd).transpose(1, 2),
                          self.layer_idx, masks[self.window], cache, capture)  # (B, n_head, T, hd)
        y = y.transpose(1, 2).reshape(b, t, nq * hd) * torch.sigmoid(q_gate[..., hd:].reshape(b, t, nq * hd))
        return self.o_proj(y)


class DecoderLayer(llama.DecoderLayer):
    """Gated DeltaNet or gated attention, then the MLP or the experts, each after a zero-centred
    RMSNorm. INTERLEAVED: the DeltaNet's b and a come interleaved per key head (Qwen3-Next)."""

    INTERLEAVED = True

    def __init__(self, config: ModelConfig, layer_idx: int):
        nn.Module.__init__(self)
        hidden, eps = config.hidden_size, config.norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.recurrent = config.layer_types[layer_idx] == "linear_attention"
        if self.recurrent:
            self.linear_attn = GatedDeltaNet(config, layer_idx, interleaved=self.INTERLEAVED)
        else:
            self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.sparse = config.mlp_types[layer_idx] == "sparse"
        self.mlp = moe.SparseMoE(config, layer_idx) if self.sparse else llama.MLP(config)
        self.scale = 1.0

    def forward(self, x, cos, sin, masks, cache, capture):
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, masks, cache) if self.recurrent
                 else self.self_attn(h, cos, sin, masks, cache, capture))
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, capture) if self.sparse else self.mlp(h))


class Qwen35Layer(DecoderLayer):
    INTERLEAVED = False


class Qwen3Next(llama.Llama):
    LAYER = DecoderLayer
    NORM = RMSNorm

    def window_of(self, block: nn.Module) -> int | None:
        return None if block.recurrent else block.self_attn.window


class Qwen35(Qwen3Next):
    LAYER = Qwen35Layer


def fields(hf: dict, model_type: str, experts: bool) -> dict:
    """Qwen3NextConfig's and Qwen3_5TextConfig's keys: Qwen3's attention (head_dim 256 by default, a
    quarter of it rotated), layer_types (or every full_attention_interval-th layer full), the
    DeltaNet's heads and kernel, and the experts where the family has them."""
    layers = hf["num_hidden_layers"]
    hf = {"partial_rotary_factor": 0.25, "intermediate_size": hf.get("moe_intermediate_size"), **hf}
    out = llama.fields(hf, model_type, partial_rotary_allowed=True, head_dim_default=256)
    interval = hf.get("full_attention_interval", 4)
    if type(interval) is not int or interval <= 0:
        raise ConfigError(f"full_attention_interval must be a positive integer, got {interval!r}")
    types = hf.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                      for i in range(layers)]
    out.update(o_proj_bias=out["attention_bias"], layer_types=types, sliding_window=None,
               conv_kernel=hf.get("linear_conv_kernel_dim", 4),
               linear_num_key_heads=hf.get("linear_num_key_heads", 16),
               linear_num_value_heads=hf.get("linear_num_value_heads", 32),
               linear_key_head_dim=hf.get("linear_key_head_dim", 128),
               linear_value_head_dim=hf.get("linear_value_head_dim", 128),
               linear_value_heads_tiled=bool(hf.get("linear_value_heads_tiled", False)))
    if experts and hf.get("num_experts") != 0:
        norm = True if model_type == "qwen3_5_moe_text" else hf.get("norm_topk_prob", True)
        out.update(moe.fields(hf, norm=bool(norm)), shared_expert_gate=True,
                   shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 512),
                   mlp_types=sparse_layers(layers, every=hf.get("decoder_sparse_step", 1),
                                           dense=hf.get("mlp_only_layers") or []))
    return out


# the multimodal checkpoints whose text model we run: model_type -> text_config's
MULTIMODAL = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

RENAMES = (("model.language_model.", "model."),)  # Qwen3_5ForConditionalGeneration's text model
TRANSFORMS = {
    ".linear_attn.conv1d.weight": lambda w, config: w.squeeze(1) if w.dim() == 3 else w,  # HF's Conv1d
    ".linear_attn.in_proj_qkvz.weight": lambda w, config: deinterleave_qkvz(w, config),
}


def deinterleave_qkvz(w: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Qwen3-Next's in_proj_qkvz rows, per key head [q (d_k), k (d_k), v (r d_v), z (r d_v)], as ours:
    every head's q, then k, v, z (r = value heads per key head); llama.cpp's converter does the same."""
    nk, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    r = config.linear_num_value_heads // nk
    parts = w.view(nk, 2 * dk + 2 * r * dv, -1).split([dk, dk, r * dv, r * dv], dim=1)
    return torch.cat([p.reshape(-1, w.shape[-1]) for p in parts])


def unused(name: str, layers: int) -> bool:
    """The vision tower and the multi-token-prediction head: left unread, as HF's causal LM leaves them."""
    return name.startswith(("mtp.", "model.visual.", "model.mtp."))


def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's qwen3next / qwen35 / qwen35moe: the DeltaNet's sizes under ssm.* (group_count the key
    heads, time_step_rank the value heads, state_size d_k), attention.recurrent_layers which layers are
    linear, block_count counting the multi-token-prediction layers (nextn_predict_layers), which stay
    unread. A layer has experts where its file has a router; llama.cpp always renormalises their weights.
    qwen35 files order the value heads tiled (llama.cpp's converter reorders them)."""
    config = llama.gguf_config(meta)
    layers = meta.key("block_count") - meta.get("nextn_predict_layers", 0)
    recurrent = meta.get("attention.recurrent_layers")
    interval = meta.get("full_attention_interval", 4)
    if recurrent is None:
        recurrent = [(i + 1) % interval != 0 for i in range(layers)]
    value_heads = meta.key("ssm.time_step_rank")
    config.update(
        model_type={"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}[meta.arch],
        num_hidden_layers=layers,
        layer_types=["linear_attention" if r else "full_attention" for r in recurrent[:layers]],
        linear_conv_kernel_dim=meta.key("ssm.conv_kernel"), linear_num_key_heads=meta.key("ssm.group_count"),
        linear_num_value_heads=value_heads, linear_key_head_dim=meta.key("ssm.state_size"),
        linear_value_head_dim=meta.key("ssm.inner_size") // value_heads,
        linear_value_heads_tiled=meta.arch != "qwen3next")
    if meta.get("expert_count"):
        dense = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in meta.tensor_names]
        config.update(moe.gguf_config(meta), norm_topk_prob=True, mlp_only_layers=dense,
                      shared_expert_intermediate_size=meta.key("expert_shared_feed_forward_length"))
    return config


NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
         ".k_norm.weight")
GGUF_VALUES = {  # what llama.cpp's converter stores instead of HF's values: (file -> ours, ours -> file)
    **{norm: (lambda x: x - 1.0, lambda x: x + 1.0) for norm in NORMS},  # zero-centred norms as 1 + w
    ".linear_attn.A_log": (lambda x: np.log(-x), lambda x: -np.exp(x)),  # the decay's rate as -exp(A_log)
}
DELTANET_TENSORS = {
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}
COMMON_TENSORS = {**llama.GGUF_TENSORS, **qwen3.QK_NORM_TENSORS, **DELTANET_TENSORS,
                  "post_attention_norm.weight": "post_attention_layernorm.weight"}
del COMMON_TENSORS["ffn_norm.weight"]
QWEN3NEXT_TENSORS = {**COMMON_TENSORS, **moe.GGUF_TENSORS, **moe.SHARED_GGUF_TENSORS,
                     "ssm_ba.weight": "linear_attn.in_proj_ba.weight"}
QWEN35_TENSORS = {**COMMON_TENSORS, "ssm_beta.weight": "linear_attn.in_proj_b.weight",
                  "ssm_alpha.weight": "linear_attn.in_proj_a.weight"}
QWEN35MOE_TENSORS = {**QWEN35_TENSORS, **moe.GGUF_TENSORS, **moe.SHARED_GGUF_TENSORS}


def gguf_metadata(config: ModelConfig, arch: str) -> dict:
    """gguf_config's inverse, refusing what llama.cpp's graphs fix otherwise: d_v is d_k there (both
    ssm.state_size), every qwen3next layer has experts, the experts' weights are renormalised."""
    representable(config.linear_key_head_dim == config.linear_value_head_dim,
                      "a DeltaNet whose d_v differs from its d_k (llama.cpp takes both from ssm.state_size)")
    representable(not config.attention_bias, "attention biases")
    nv = config.linear_num_value_heads
    out = {**llama.gguf_metadata(config), "ssm.conv_kernel": config.conv_kernel,
           "ssm.state_size": config.linear_key_head_dim, "ssm.group_count": config.linear_num_key_heads,
           "ssm.time_step_rank": nv, "ssm.inner_size": nv * config.linear_value_head_dim,
           "attention.recurrent_layers": [kind == "linear_attention" for kind in config.layer_types]}
    interval = config.layer_types.index("full_attention") + 1 if "full_attention" in config.layer_types else 0
    if interval and config.layer_types == ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                           for i in range(config.num_hidden_layers)]:
        out["full_attention_interval"] = interval  # as llama.cpp's converter writes it (recurrent_layers says all)
    if arch != "qwen3next":  # interleaved mRoPE's sections (t, h, w): for text alone any split is plain RoPE
        pairs = config.rotary_dim // 2
        third = -(-pairs // 3)
        out["rope.dimension_sections"] = [third, third, pairs - 2 * third, 0]
    if config.is_moe:
        representable(set(config.mlp_types) == {"sparse"}, "dense layers among the sparse ones (mlp_only_layers)")
        representable(config.norm_topk_prob, "norm_topk_prob false (llama.cpp always renormalises)")
        out.update(moe.gguf_metadata(config), expert_shared_feed_forward_length=config.shared_expert_intermediate_size)
    return out


def tiled(name: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """A DeltaNet tensor with its value heads tiled (key head 0's first, key head 1's first, ..., key
    head 0's second, ...), as llama.cpp's converter writes qwen35 files, from HF's order (grouped by
    key head). Along rows of v in in_proj_qkv and the convolution, of z, b, a, A_log and dt_bias; along
    out_proj's columns."""
    nk, nv, dk, dv = (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                      config.linear_value_head_dim)
    if config.linear_value_heads_tiled or nk == nv or ".linear_attn." not in name:
        return w

    def tile(x: np.ndarray, axis: int, d: int) -> np.ndarray:  # x's `axis`: nv heads of d
        x = np.moveaxis(x, axis, 0)
        rest = x.shape[1:]
        return np.moveaxis(x.reshape(nk, nv // nk, d, *rest).swapaxes(0, 1).reshape(-1, *rest), 0, axis)

    keys = 2 * nk * dk
    if name.endswith((".in_proj_qkv.weight", ".conv1d.weight")):
        return np.concatenate([w[:keys], tile(w[keys:], 0, dv)])
    if name.endswith(".in_proj_z.weight"):
        return tile(w, 0, dv)
    if name.endswith((".in_proj_b.weight", ".in_proj_a.weight", ".A_log", ".dt_bias")):
        return tile(w, 0, 1)
    return tile(w, 1, dv) if name.endswith(".out_proj.weight") else w


def _layout(arch: str, tensors: dict, hf_class: str) -> GGUFLayout:
    return GGUFLayout(arch, gguf_config, tensors, hf_class=hf_class, values=GGUF_VALUES,
                      metadata=lambda config: gguf_metadata(config, arch),
                      rearrange=None if arch == "qwen3next" else tiled)


def _entry(model_type: str, model: type[nn.Module], experts: bool, layout: GGUFLayout | None) -> Architecture:
    return Architecture(model_type, model, lambda hf: fields(hf, model_type, experts), layout, renames=RENAMES,
                        transforms=TRANSFORMS, unused=unused)


ARCHITECTURES = (
    _entry("qwen3_next", Qwen3Next, True, _layout("qwen3next", QWEN3NEXT_TENSORS, "Qwen3NextForCausalLM")),
    _entry("qwen3_5_text", Qwen35, False, _layout("qwen35", QWEN35_TENSORS, "Qwen3_5ForCausalLM")),
    _entry("qwen3_5_moe_text", Qwen35, True, _layout("qwen35moe", QWEN35MOE_TENSORS, "Qwen3_5MoeForCausalLM")),
)
