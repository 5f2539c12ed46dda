"""Gemma 4, text: Gemma4ForCausalLM (model_type gemma4_text), and the text part of the multimodal
Gemma4ForConditionalGeneration (gemma4: gemma-4-E2B, E4B, 31B, 26B-A4B), whose vision and audio
towers are left unread.

ids ─embed_tokens·√hidden→ x ─N × [x += post_attention_norm(attn(input_norm(x)));
                                   x += post_feedforward_norm(GeGLU(pre_feedforward_norm(x)));
                                   x += post_per_layer_input_norm(proj(gelu(gate(x)) · per_layer_input));
                                   x *= layer_scalar]
    ─norm─lm_head→ logits ─cap·tanh(logits / cap), where final_logit_softcapping is set

What differs from Gemma 3 (gemma3.py):
  attention   scores not scaled (q·k, not q·k/√d); q and k normed per head, v too (no weight);
              full layers have heads of their own size (global_head_dim, 512 as the real models)
              and may have fewer KV heads, whose keys serve as values (attention_k_eq_v)
  RoPE        sliding layers: plain, over their head_dim; full layers: "proportional", only the
              first partial_rotary_factor of the pairs turn, at the rates of the whole head
  KV sharing  the last num_kv_shared_layers compute no keys or values: each attends over those of
              the last earlier layer of its kind (config.kv_source), and writes no cache
  per-layer   (E2B, E4B) a second embedding table gives each token hidden_size_per_layer_input
  inputs      values per layer, mixed with a projection of the embeddings; each layer adds them
              to its output through a gate and a projection
  experts     (26B-A4B) beside the dense MLP, a mixture of experts on the same residual
              (router: norm, scale, softmax, top k renormalised, times a scale per expert)
  norms       RMSNorm with the weight itself, not Gemma 3's offset from 1

The KV cache holds each layer's shape (cache.KVCache shapes, from config.cache_shapes()); a
KV-shared layer borrows, within the forward call, the keys and values its source layer attended
over (cached and new), which is what HF transformers does too. llama.cpp's GGUF layout of it:
gemma4_gguf.py.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models import gemma3, gemma4_gguf, kernels, moe
from nexttok.models.architecture import Architecture, GGUFLayout
from nexttok.models.attention import attend
from nexttok.models.config import ConfigError, ModelConfig, check_act
from nexttok.models.decoder import empty_embedding
from nexttok.models.fused import FusedLinear
from nexttok.models.rope import apply_rope


class RMSNorm(nn.Module):
    """x / rms(x) · weight, in float32, back in x's dtype; scale=False: no weight (the values' norm,
    the router's)."""

    def __init__(self, dim: int, eps: float, scale: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None and kernels.takes(x):  # the same steps in one call
            return kernels.rms_norm(x, self.weight, self.eps)
        y = x.float()
        y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (y if self.weight is None else y * self.weight.float()).to(x.dtype)


def inverse_frequencies(theta: float, head_dim: int, fraction: float = 1.0, factor: float = 1.0) -> torch.Tensor:
    """Radians per position of each pair of a head's dimensions (head_dim // 2,): the first
    fraction of them turn as plain RoPE's over the whole head_dim, the others stay still (HF's
    "proportional" RoPE; fraction 1: plain RoPE), all divided by factor.

    inverse_frequencies(100.0, 8, 0.5) -> [1.0, 0.3162, 0.0, 0.0]"""
    turning = int(fraction * head_dim // 2)
    rates = 1.0 / theta ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / head_dim)
    return torch.cat((rates, torch.zeros(head_dim // 2 - turning))) / factor


class Attention(nn.Module):
    """q (and, but on KV-shared layers, k and v) from one fused matmul; q and k normed per head,
    then rotated; v normed without a weight; on full layers with attention_k_eq_v the keys before
    their norm and rotation are also the values. Scores are not scaled: q is multiplied by
    √head_dim, which the kernels' 1/√head_dim takes back."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.num_attention_heads
        self.n_kv_head, self.head_dim = config.kv_shape(layer_idx)
        self.window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" else None
        self.source = config.kv_source(layer_idx)  # whose keys and values it attends over
        self.lends = layer_idx in {config.kv_source(i) for i in range(layer_idx + 1, config.num_hidden_layers)}
        self.k_eq_v = config.attention_k_eq_v and self.window is None
        hd, kv_rows = self.head_dim, self.n_kv_head * self.head_dim
        parts = {"q_proj": self.n_head * hd}
        if self.source == layer_idx:
            parts.update({"k_proj": kv_rows} if self.k_eq_v else {"k_proj": kv_rows, "v_proj": kv_rows})
            self.k_norm = RMSNorm(hd, config.norm_eps)
            self.v_norm = RMSNorm(hd, config.norm_eps, scale=False)
        self.qkv_proj = FusedLinear(config.hidden_size, parts, config.attention_bias)
        self.q_norm = RMSNorm(hd, config.norm_eps)
        self.o_proj = nn.Linear(self.n_head * hd, config.hidden_size, bias=config.attention_bias)
        self.q_scale = math.sqrt(hd)

    def forward(self, x, cos, sin, borrowed: dict, masks, cache, capture):
        """borrowed: layer -> the keys and values (B, n_kv, S, hd) it attended over in this call,
        for the KV-shared layers after it."""
        b, t, _ = x.shape
        nq, nk, hd = self.n_head, self.n_kv_head, self.head_dim
        heads = self.qkv_proj(x).view(b, t, -1, hd)  # (B, T, n_head [+ n_kv [+ n_kv]], hd)
        q = apply_rope(self.q_norm(heads[:, :, :nq]), cos, sin) * self.q_scale
        if self.source != self.layer_idx:
            k, v = borrowed[self.source]
        else:
            k = heads[:, :, nq : nq + nk]
            v = self.v_norm(k if self.k_eq_v else heads[:, :, nq + nk :]).transpose(1, 2)  # (B, n_kv, T, hd)
            k = apply_rope(self.k_norm(k), cos, sin).transpose(1, 2)
            if cache is not None:
                k, v = cache.update_and_fetch(self.layer_idx, k, v)  # (B, n_kv, S, hd)
            if self.lends:
                borrowed[self.layer_idx] = k, v
        if capture is not None:
            capture.layers.append(self.layer_idx)
        y = attend(q.transpose(1, 2).to(k.dtype), k, v, masks[self.window], capture).to(q.dtype)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, nq * hd))  # y (B, n_head, T, hd)


class Router(nn.Module):
    """Gemma 4's router: x normed (no weight) · scale / √hidden ─proj→ softmax over the experts;
    the k most probable, renormalised to sum to 1, each times its expert's per_expert_scale."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden, e = config.hidden_size, config.num_experts
        self.k, self.root = config.num_experts_per_tok, hidden**-0.5
        self.norm = RMSNorm(hidden, config.norm_eps, scale=False)
        self.proj = nn.Linear(hidden, e, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(e))

    def forward(self, x: torch.Tensor) -> moe.Routing:
        """x (N, hidden) -> the Routing of its N tokens."""
        probs = torch.softmax(self.proj(self.norm(x) * self.scale * self.root), dim=-1, dtype=torch.float32)
        weights, ids = probs.topk(self.k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return moe.Routing(ids, weights * self.per_expert_scale[ids], probs)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        wide = config.use_double_wide_mlp and self.self_attn.source != layer_idx
        self.mlp = gemma3.MLP(config, config.intermediate_size * (2 if wide else 1))
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)
        self.sparse = config.mlp_types[layer_idx] == "sparse"
        if self.sparse:  # experts beside the dense MLP, each output normed, then summed
            self.router = Router(config)
            self.experts = moe.Experts(config)
            self.pre_feedforward_layernorm_2 = RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_1 = RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(hidden, eps)
        if config.hidden_size_per_layer_input:
            size = config.hidden_size_per_layer_input
            self.per_layer_input_gate = nn.Linear(hidden, size, bias=False)
            self.per_layer_projection = nn.Linear(size, hidden, bias=False)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)
        self.register_buffer("layer_scalar", torch.ones(1))  # in the checkpoint

    def forward(self, x, cos, sin, local_cos, local_sin, per_layer, borrowed, masks, cache, capture):
        """cos, sin: the full layers' rotation; local_cos, local_sin: the sliding layers';
        per_layer (B, T, layers, size): every layer's input, or None; borrowed: see Attention."""
        if self.self_attn.window is not None:
            cos, sin = local_cos, local_sin
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, borrowed, masks,
                                                             cache, capture))
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.sparse:
            h = self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(self.moe(x, capture))
        x = x + self.post_feedforward_layernorm(h)
        if per_layer is not None:
            gate = F.gelu(self.per_layer_input_gate(x), approximate="tanh")
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gate * per_layer[:, :, self.layer_idx]))
        return x * self.layer_scalar

    def moe(self, x: torch.Tensor, capture) -> torch.Tensor:
        """The experts' output (B, T, hidden) for the residual stream x, routed from x itself."""
        b, t, hidden = x.shape
        flat = x.reshape(-1, hidden)
        routing = self.router(flat)
        if capture is not None:
            capture.route(self.layer_idx, routing, b, t)
        return self.experts(self.pre_feedforward_layernorm_2(flat), routing).view(b, t, hidden)


class Gemma4(gemma3.Gemma3):
    LAYER = DecoderLayer
    NORM = RMSNorm
    # why compiled.compile_decode refuses it: one graph for every layer, attention an opaque op
    UNCOMPILED = ("Gemma 4's layers differ in their heads' size and its KV-shared layers borrow keys and values "
                  "within the step, which the compiled step does not hold")

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        size = config.hidden_size_per_layer_input
        if size:
            layers = config.num_hidden_layers
            self.embed_tokens_per_layer = empty_embedding(config.vocab_size_per_layer_input, layers * size)
            self.per_layer_model_projection = nn.Linear(config.hidden_size, layers * size, bias=False)
            self.per_layer_projection_norm = RMSNorm(size, config.norm_eps)

    def init_buffers(self) -> None:
        """The inverse frequencies of full layers (head_dim // 2 of theirs, "proportional") and of
        sliding ones, float32 on the weights' device (see Gemma3.init_buffers)."""
        config, device = self.config, self.norm.weight.device
        full = next((i for i, kind in enumerate(config.layer_types) if kind == "full_attention"), 0)
        scaling = config.rope_scaling or {}
        self.inv_freq = inverse_frequencies(config.rope_theta, config.kv_shape(full)[1],
                                            scaling.get("partial_rotary_factor", 1.0),
                                            scaling.get("factor", 1.0)).to(device)
        self.inv_freq_local = inverse_frequencies(config.rope_local_base_freq, config.head_dim).to(device)

    def side_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> tuple:
        """Every layer's per-layer input (B, T, layers, size), or None; and an empty dict for the
        keys and values KV-shared layers borrow in this call."""
        return self.per_layer_inputs(ids, x), {}

    def per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """(rows of embed_tokens_per_layer · √size + norm(projection of x / √hidden)) / √2, as
        (B, T, layers, size): what each token gives each layer beside the residual stream."""
        size = self.config.hidden_size_per_layer_input
        if not size:
            return None
        b, t = ids.shape
        rows = self.embed_tokens_per_layer(ids)
        rows = (rows * torch.tensor(size**0.5, dtype=rows.dtype)).view(b, t, -1, size)
        projected = self.per_layer_model_projection(x) * self.config.hidden_size**-0.5
        return (self.per_layer_projection_norm(projected.view(b, t, -1, size)) + rows) * 2**-0.5


ACTS = ("gelu_pytorch_tanh",)
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}


def fields(hf: dict) -> dict:
    """Gemma 4 text, with Gemma4TextConfig's defaults."""
    if hf.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention 'all' (an encoder) is not supported: only causal models")
    layers = hf["num_hidden_layers"]
    types = list(hf.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                           for i in range(layers)])
    if types:
        types[-1] = "full_attention"  # as HF's config forces it
    head_dims, kv_heads = _layer_shapes(hf, types)
    theta, scaling, local_theta = _rope(hf)
    bias = bool(hf.get("attention_bias", False))
    out = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=layers,
        num_attention_heads=hf["num_attention_heads"], num_key_value_heads=hf.get("num_key_value_heads", 4),
        intermediate_size=hf["intermediate_size"], max_position_embeddings=hf.get("max_position_embeddings", 131072),
        head_dim=hf.get("head_dim", 256), norm_eps=hf.get("rms_norm_eps", 1e-6),
        hidden_act=check_act(hf.get("hidden_activation", "gelu_pytorch_tanh"), ACTS),
        rope_theta=theta, rope_scaling=scaling, rope_local_base_freq=local_theta,
        final_logit_softcapping=hf.get("final_logit_softcapping"), attention_bias=bias, o_proj_bias=bias,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        sliding_window=hf.get("sliding_window", 512), layer_types=types,
        layer_head_dims=head_dims, layer_kv_heads=kv_heads, num_kv_shared_layers=hf.get("num_kv_shared_layers", 0),
        attention_k_eq_v=bool(hf.get("attention_k_eq_v", False)),
        hidden_size_per_layer_input=hf.get("hidden_size_per_layer_input", 256) or 0,
        vocab_size_per_layer_input=hf.get("vocab_size_per_layer_input", 262144),
        use_double_wide_mlp=bool(hf.get("use_double_wide_mlp", False)),
    )
    if hf.get("enable_moe_block"):
        out.update(num_experts=hf.get("num_experts"), num_experts_per_tok=hf.get("top_k_experts"),
                   moe_intermediate_size=hf.get("moe_intermediate_size"), mlp_types=["sparse"] * layers)
    return out


SHAPE_KEYS = {"head_dim", "num_key_value_heads"}  # what per_layer_config may override


def _layer_shapes(hf: dict, types: list[str]) -> tuple[list[int], list[int]]:
    """Each layer's head_dim and KV heads: transformers 5.25's per_layer_config (layer -> its
    overrides), or the hub's global_head_dim (default 512) and num_global_key_value_heads (where
    attention_k_eq_v) for the full layers. Layers of one kind have one shape (one RoPE each)."""
    head_dim, kv = hf.get("head_dim", 256), hf.get("num_key_value_heads", 4)
    overrides = hf.get("per_layer_config")
    if overrides is None:
        full = {"head_dim": hf.get("global_head_dim", 512)}
        if hf.get("attention_k_eq_v") and hf.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = hf["num_global_key_value_heads"]
        overrides = {i: full for i, kind in enumerate(types) if kind == "full_attention"}
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        raise ConfigError(f"per_layer_config must map layers to their overrides, got {overrides!r}")
    try:
        layer = {int(i): v for i, v in overrides.items()}
    except ValueError:
        raise ConfigError(f"per_layer_config's keys must be layer indices, got {sorted(overrides)}") from None
    for i, values in layer.items():
        if set(values) - SHAPE_KEYS:
            raise ConfigError(f"per_layer_config[{i}] overrides {sorted(set(values) - SHAPE_KEYS)}: only head_dim and "
                              "num_key_value_heads are supported")
    head_dims = [layer.get(i, {}).get("head_dim", head_dim) for i in range(len(types))]
    kv_heads = [layer.get(i, {}).get("num_key_value_heads", kv) for i in range(len(types))]
    for kind in set(types):
        if len({head_dims[i] for i, k in enumerate(types) if k == kind}) > 1:
            raise ConfigError(f"per_layer_config gives {kind} layers several head sizes: one per kind is supported")
    return head_dims, kv_heads


def _rope(hf: dict) -> tuple[float, dict | None, float]:
    """(full layers' theta, their scaling, sliding layers' theta) from rope_parameters per layer
    kind: sliding layers plain RoPE; full layers plain or "proportional" (partial_rotary_factor,
    factor)."""
    params = hf.get("rope_parameters") or DEFAULT_ROPE
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ConfigError(f"rope_type {local['rope_type']!r} of sliding_attention layers is not supported (default)")
    kind = full.get("rope_type", "default")
    if kind not in ("default", "proportional"):
        raise ConfigError(f"rope_type {kind!r} of full_attention layers is not supported (default, proportional)")
    scaling = None
    if kind == "proportional":
        scaling = {"rope_type": "proportional", "partial_rotary_factor": float(full.get("partial_rotary_factor", 1.0)),
                   "factor": float(full.get("factor", 1.0))}
    return float(full.get("rope_theta", 1e6)), scaling, float(local.get("rope_theta", 10_000.0))


# the multimodal checkpoint's text model sits under model.language_model; its towers are not read
RENAMES = (("model.language_model.", "model."),)
TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
# KV-shared layers compute no keys or values; checkpoints may still hold their projections (HF ignores them)
SHARED_KV = re.compile(r"\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")


def unused(name: str, num_hidden_layers: int) -> bool:
    """Tensors left unread on purpose: the multimodal towers, and key / value weights of KV-shared
    layers (any others would have been read: a layer that computes them needs them)."""
    return name.startswith(TOWERS) or SHARED_KV.search(name) is not None


# llama.cpp's gemma4 (gemma4_gguf.py); the multimodal checkpoint's text part is written as one too, and
# a file reads back as the text model
GGUF = GGUFLayout("gemma4", gemma4_gguf.gguf_config, gemma4_gguf.GGUF_TENSORS, hf_class="Gemma4ForCausalLM",
                  metadata=gemma4_gguf.gguf_metadata, derived=gemma4_gguf.DERIVED)

ARCHITECTURES = (
    Architecture("gemma4_text", Gemma4, fields, GGUF, unused=unused),
    Architecture("gemma4", Gemma4, fields, GGUF, renames=RENAMES, unused=unused, text_config=True),
)
