"""Llama family: Llama (1-3), SmolLM, Qwen2, Mistral.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

Attention uses rotary position embeddings (RoPE) on q and k, grouped-query heads (several query
heads share one key/value head), optional q/k/v bias (Qwen2) and sliding windows (Mistral).
Module names follow the HF checkpoint ("model." prefix aside), except that q/k/v and gate/up are
each one fused matmul (fused.py); the loaders stack the checkpoint's parts.

Variants in files of their own swap one part and keep the rest: Qwen3 (qwen3.py) the attention,
Phi-3 (phi3.py) the attention, the MLP and the RoPE (DecoderLayer.attention_class / mlp_class,
Llama.LAYER, Llama.rope).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models import kernels
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta
from nexttok.models.attention import attend_cached
from nexttok.models.config import ROPE_TYPES, ConfigError, ModelConfig, check_act, partial_rotary, rope
from nexttok.models.decoder import LlamaLayout
from nexttok.models.fused import FusedLinear
from nexttok.models.rope import apply_rope, rope_attention_factor, rope_inverse_frequencies


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.takes(x):  # the same steps in one call
            return kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()  # the mean of squares in float32, as the reference does
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Grouped-query attention with RoPE, and the hooks the families set:

        QK_NORM     None; "head": an RMSNorm over each q and each k head before RoPE (Qwen3, Gemma 3,
                    GLM-4 where use_qk_norm); "whole": one over all of q and one over all of k (OLMoE)
        NORM        that norm's class (Gemma's is its own)
        ONE_TENSOR  the checkpoint stores q, k and v as one tensor (Phi-3), not three
        q_scale     q is multiplied by this: the kernels scale scores by 1/√head_dim, a family that
                    scales otherwise (Gemma 3, Granite) makes up the difference here
        rotary_dim  RoPE turns the first rotary_dim dimensions of each head, the rest pass (Phi-4, GLM-4);
                    use_rope: none at all on this layer (SmolLM3's and EXAONE 4's NoPE layers)
        sinks       a learned logit per head that joins each softmax and takes a share of it (gpt-oss)
        window      sliding-window layers attend over the last `window` keys only
    """

    PARALLEL_HEADS = ("qkv_proj", "o_proj")  # tensor parallelism (parallel_layers.py): heads split over ranks
    QK_NORM: str | None = None
    NORM: type[nn.Module] = RMSNorm
    ONE_TENSOR = False

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        hidden, bias = config.hidden_size, config.attention_bias
        q_rows, kv_rows = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        if self.ONE_TENSOR:
            self.qkv_proj = nn.Linear(hidden, q_rows + 2 * kv_rows, bias=bias)
        else:
            self.qkv_proj = FusedLinear(hidden, {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows}, bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, hidden, bias=config.o_proj_bias)
        self.qk_norm = self.QK_NORM or ("head" if config.use_qk_norm else None)
        if self.qk_norm is not None:
            whole = self.qk_norm == "whole"
            self.q_norm = self.NORM(q_rows if whole else self.head_dim, config.norm_eps)
            self.k_norm = self.NORM(kv_rows if whole else self.head_dim, config.norm_eps)
        self.rotary_dim = config.rotary_dim
        self.use_rope = not config.no_rope_layers or bool(config.no_rope_layers[layer_idx])  # SmolLM3's NoPE layers
        multiplier = config.attention_multiplier
        self.q_scale = 1.0 if multiplier is None else multiplier * math.sqrt(self.head_dim)
        self.sinks = nn.Parameter(torch.empty(self.n_head)) if config.attention_sinks else None
        sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.window = config.sliding_window if sliding else None

    def forward(self, x, cos, sin, masks, cache, capture):
        b, t, _ = x.shape
        nq, nk = self.n_head, self.n_kv_head
        heads = self.qkv_proj(x).view(b, t, -1, self.head_dim)  # (B, T, n_head + 2 n_kv, hd)
        if self.qk_norm is None:
            qk = self.rotate(heads[:, :, : nq + nk], cos, sin)  # q and k in one rotation
            q, k = qk[:, :, :nq], qk[:, :, nq:]
        else:
            q, k = self.normed(heads[:, :, :nq], heads[:, :, nq : nq + nk])
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        v = heads[:, :, nq + nk :]
        y = attend_cached(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.layer_idx,
                          masks[self.window], cache, capture, self.sinks)  # (B, n_head, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, nq * self.head_dim))

    def normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, T, n_head, hd) and k (B, T, n_kv, hd) through their norms, per head or whole."""
        if self.qk_norm == "head":
            return self.q_norm(q), self.k_norm(k)
        b, t = q.shape[:2]
        return (self.q_norm(q.reshape(b, t, -1)).view(b, t, -1, self.head_dim),
                self.k_norm(k.reshape(b, t, -1)).view(b, t, -1, self.head_dim))

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on heads x (B, T, H, hd): the first rotary_dim dimensions turn, the rest pass through."""
        if not self.use_rope:
            return x
        r = self.rotary_dim
        if r == self.head_dim:
            return apply_rope(x, cos, sin)
        return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). inner: its width (a shared expert's differs)."""

    PARALLEL_INNER = ("gate_up_proj", "down_proj")  # tensor parallelism: the inner width split over ranks

    def __init__(self, config: ModelConfig, inner: int | None = None):
        super().__init__()
        hidden, inner, bias = config.hidden_size, inner or config.intermediate_size, config.mlp_bias
        self.gate_up_proj = FusedLinear(hidden, {"gate_proj": inner, "up_proj": inner}, bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_up_proj(x)))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] (..., 2 inner) -> (..., inner)."""
    if kernels.takes(gate_up):  # the same arithmetic in one call
        return kernels.glu(gate_up, kernels.SILU_MUL)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class DecoderLayer(nn.Module):
    """x += attn(norm(x)); x += mlp(norm(x)), each added times residual_multiplier (Granite's; else 1).
    A layer whose config.mlp_types entry is "sparse" has moe_class (a mixture of experts) for its
    MLP, which is also told the capture (it records the router's choices)."""

    # the parts a variant of the family swaps (qwen3.py: q/k norms; phi3.py: fused checkpoint tensors)
    attention_class: type[nn.Module] = Attention
    mlp_class: type[nn.Module] = MLP
    moe_class: type[nn.Module] | None = None  # the MoE families' (moe.py)

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = self.attention_class(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.sparse = config.mlp_types[layer_idx] == "sparse"
        self.mlp = self.moe_class(config, layer_idx) if self.sparse else self.mlp_class(config)
        self.scale = config.residual_multiplier

    def forward(self, x, cos, sin, masks, cache, capture):
        h = self.self_attn(self.input_layernorm(x), cos, sin, masks, cache, capture)
        x = x + (h if self.scale == 1.0 else h * self.scale)
        h = self.post_attention_layernorm(x)
        h = self.mlp(h, capture) if self.sparse else self.mlp(h)
        return x + (h if self.scale == 1.0 else h * self.scale)


class Llama(LlamaLayout):
    LAYER: type[nn.Module] = DecoderLayer  # a variant's own layer (qwen3.py, phi3.py)
    NORM = RMSNorm

    def declare_buffers(self) -> None:
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    def init_buffers(self) -> None:
        """(Re)compute the RoPE tables (max_position_embeddings, rotary_dim // 2) in float32, times
        YaRN's attention factor where it applies."""
        device = self.norm.weight.device
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
        angles = positions[:, None] * rope_inverse_frequencies(self.config)[None, :]  # (P, rd/2)
        factor = rope_attention_factor(self.config)
        self.rope_cos = (angles.cos() * factor).to(device)
        self.rope_sin = (angles.sin() * factor).to(device)

    def rotations(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What each layer takes besides x: RoPE's cos and sin at the positions."""
        return self.rope(q_pos, dtype)

    def inverse_frequencies(self) -> torch.Tensor:
        """Radians per position of each rotated pair of dimensions (rotary_dim // 2,)."""
        return rope_inverse_frequencies(self.config)

    def rope(self, q_pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B, T, 1, rd/2) of the angles at positions q_pos (B, T); padding (-1) gets
        position 0's."""
        rows = q_pos.clamp(min=0)
        return self.rope_cos[rows].to(dtype)[:, :, None], self.rope_sin[rows].to(dtype)[:, :, None]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, hidden): the rows of the embedding matrix times embedding_multiplier
        (Granite's; else 1; no position here: RoPE rotates q and k inside attention)."""
        x = self.embed_tokens(ids)
        scale = self.config.embedding_multiplier
        return x if scale == 1.0 else x * scale

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from a residual stream (..., hidden): the final norm, then lm_head (divided by
        logits_scaling, Granite's; else 1)."""
        logits = self.lm_head(self.norm(x))
        scale = self.config.logits_scaling
        return logits if scale == 1.0 else logits / scale


LLAMA_ACTS = ("silu",)


def fields(hf: dict, model_type: str, *, rope_kinds: tuple[str, ...] = ROPE_TYPES, partial_rotary_allowed: bool = False,
           head_dim_default: int = 0) -> dict:
    """The Llama family's config.json: Llama, Qwen2 (q/k/v bias), Mistral, and what the variants
    share (Qwen3, Phi-3 and the MoE families start from it and add their own)."""
    heads = hf["num_attention_heads"]
    theta, scaling = rope(hf, rope_kinds)
    bias = bool(hf.get("attention_bias", False))
    window, layer_types = windows(hf, model_type)
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        head_dim=hf.get("head_dim") or head_dim_default, norm_eps=hf.get("rms_norm_eps", 1e-6),
        hidden_act=check_act(hf.get("hidden_act", "silu"), LLAMA_ACTS),
        rope_theta=theta, rope_scaling=scaling,
        partial_rotary_factor=partial_rotary(hf, model_type, partial_rotary_allowed),
        attention_bias=model_type == "qwen2" or bias, o_proj_bias=model_type == "llama" and bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=window, layer_types=layer_types,
    )


def windows(hf: dict, model_type: str) -> tuple[int | None, list[str]]:
    """(sliding_window, layer_types). Qwen2/3: sliding layers only with use_sliding_window, from
    layer max_window_layers on. Mistral and Phi-3: a window set applies to every layer."""
    window = hf.get("sliding_window")
    layer_types = hf.get("layer_types") or []
    if model_type not in ("qwen2", "qwen3"):
        return window, layer_types
    layers = hf["num_hidden_layers"]
    if not hf.get("use_sliding_window", False):
        return None, ["full_attention"] * layers
    start = hf.get("max_window_layers", layers)
    return window, layer_types or ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]


YARN_KEYS = {"beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attn_factor"}  # ours: llama.cpp's
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}  # HF's and llama.cpp's


def gguf_config(meta: GGUFMeta) -> dict:
    """config.json keys from llama.cpp's metadata of a Llama-like file (Llama, Qwen2, Qwen3, and the
    attention and RoPE of every family built on them)."""
    hidden, heads = meta.key("embedding_length"), meta.key("attention.head_count")
    head_dim = meta.get("attention.key_length", hidden // heads)
    if "rope_freqs.weight" in meta.tensor_names:
        raise ConfigError("GGUF rope_freqs (Llama 3.1 style frequency factors) are not supported yet")
    config = {
        "hidden_size": hidden,
        "intermediate_size": meta.key("feed_forward_length"), "num_hidden_layers": meta.key("block_count"),
        "num_attention_heads": heads, "num_key_value_heads": meta.key("attention.head_count_kv", heads),
        "head_dim": head_dim, "max_position_embeddings": meta.key("context_length"),
        "rms_norm_eps": meta.key("attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.key("rope.freq_base", 10000.0), "hidden_act": "silu",
        # no metadata key says so: biases are there or not (llama.cpp loads them where present)
        "attention_bias": "blk.0.attn_q.bias" in meta.tensor_names,
        "mlp_bias": "blk.0.ffn_up.bias" in meta.tensor_names,
    }
    rotary = meta.get("rope.dimension_count", head_dim)
    if rotary != head_dim:  # the family's fields refuse it where llama.cpp does (the llama arch)
        config["partial_rotary_factor"] = rotary / head_dim
    kind = meta.get("rope.scaling.type", "none")
    if kind == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": meta.key("rope.scaling.factor")}
    elif kind == "yarn":
        if meta.get("rope.scaling.attn_factor", 1.0) != 1.0:
            raise ConfigError("GGUF rope.scaling.attn_factor other than 1 is not supported")
        # ggml rounds YaRN's correction range (truncate), whatever the original config said; the
        # converter writes HF's beta_fast, beta_slow and attention_factor where the config set them
        extras = {ours: meta.get(f"rope.scaling.yarn_{theirs}") for ours, theirs in YARN_KEYS.items()}
        config["rope_scaling"] = {"rope_type": "yarn", "factor": meta.key("rope.scaling.factor"), "truncate": True,
                                  "original_max_position_embeddings": meta.key("rope.scaling.original_context_length"),
                                  **extras}
    elif kind not in ("none", None):
        raise ConfigError(f"GGUF rope scaling {kind!r} is not supported")
    if meta.get("expert_count", 0) and meta.arch == "llama":  # llama.cpp writes Mixtral as a llama file
        config.update(model_type="mixtral", num_local_experts=meta.key("expert_count"),
                      num_experts_per_tok=meta.key("expert_used_count"))
    return config


def gguf_metadata(config: ModelConfig) -> dict:
    """gguf_config's inverse: the "<arch>." metadata llama.cpp reads for a Llama-like model."""
    out = {"context_length": config.max_position_embeddings, "embedding_length": config.hidden_size,
           "block_count": config.num_hidden_layers, "feed_forward_length": config.intermediate_size,
           "attention.head_count": config.num_attention_heads,
           "attention.head_count_kv": config.num_key_value_heads, "attention.key_length": config.head_dim,
           "attention.value_length": config.head_dim, "rope.dimension_count": config.rotary_dim,
           "rope.freq_base": float(config.rope_theta), "attention.layer_norm_rms_epsilon": float(config.norm_eps)}
    scaling = config.rope_scaling
    if scaling is not None:
        if scaling["rope_type"] not in ("linear", "yarn"):
            raise ConfigError(f"GGUF export of rope_type {scaling['rope_type']!r} is not supported")
        out.update({"rope.scaling.type": scaling["rope_type"], "rope.scaling.factor": float(scaling["factor"])})
        if scaling["rope_type"] == "yarn":
            out["rope.scaling.original_context_length"] = scaling["original_max_position_embeddings"]
            out.update({f"rope.scaling.yarn_{theirs}": float(scaling[ours]) for ours, theirs in YARN_KEYS.items()
                        if scaling[ours] is not None and scaling[ours] != YARN_DEFAULTS.get(ours)})
    if config.sliding_window and "sliding_attention" in config.layer_types:
        out["attention.sliding_window"] = config.sliding_window
    return out


def plain_metadata(config: ModelConfig) -> dict:
    """gguf_metadata for the llama, qwen2 and qwen3 archs, whose llama.cpp graphs (and gguf_config)
    have no sliding-window layers: a checkpoint with some is refused, not written as one whose
    layers attend everywhere."""
    if "sliding_attention" in config.layer_types:
        raise ConfigError(f"llama.cpp's {config.model_type} GGUF has no sliding-window layers, and this checkpoint "
                          "has some (use_sliding_window)")
    return gguf_metadata(config)


GGUF_TENSORS = {  # llama.cpp → ours (per block: "blk.N." → "model.layers.N.")
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight", "ffn_down.bias": "mlp.down_proj.bias",
}
# llama.cpp's converter interleaves their rows for its RoPE kernel (the llama arch and those built on
# its LlamaModel: smollm3, granite, granitemoe), biases too
QK_PERMUTED = (".q_proj.weight", ".k_proj.weight", ".q_proj.bias", ".k_proj.bias")

ARCHITECTURES = (
    Architecture("llama", Llama, lambda hf: fields(hf, "llama"),
                 GGUFLayout("llama", gguf_config, GGUF_TENSORS, permuted=QK_PERMUTED,
                            hf_class="LlamaForCausalLM", metadata=plain_metadata)),
    Architecture("qwen2", Llama, lambda hf: fields(hf, "qwen2"),
                 GGUFLayout("qwen2", gguf_config, GGUF_TENSORS, hf_class="Qwen2ForCausalLM",
                            metadata=plain_metadata)),
    Architecture("mistral", Llama, lambda hf: fields(hf, "mistral")),
)
