"""ModelConfig: one dataclass for every supported architecture, named as HF config.json names it.

What each family reads from its config.json is its own (`fields` in its registry entry,
registry.py); the helpers here are what several of them share: RoPE parameters in transformers
4's and 5's spellings, activations, token ids, and which layers slide or route to experts.
Unknown keys are ignored; unsupported features raise ConfigError in one line.
read_generation_stop_ids reads generation_config.json; ConfigError and CheckpointError are what a
bad checkpoint raises.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from nexttok.models import rope_params
from nexttok.models.config_errors import CheckpointError, ConfigError  # noqa: F401 (imported from here elsewhere)

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ROUTERS = ("softmax", "topk_softmax", "sigmoid")  # moe.py: how router logits become k experts and weights
ACTIVATIONS = ("silu", "swiglu_oai")  # the gated MLPs' (and experts') activation; GPT-2 and Gemma name their own


# what a layer does with its context: attend over all of it, over a sliding window of it, or fold it
# into a state of fixed size (a recurrent layer: LFM2's short convolutions, Qwen3-Next's gated DeltaNet)
LAYER_TYPES = ("full_attention", "sliding_attention", "conv", "linear_attention")
RECURRENT_TYPES = ("conv", "linear_attention")


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    norm_eps: float = 1e-5  # rms_norm_eps (Llama family) or layer_norm_epsilon (GPT-2)
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear" | "llama3" | "yarn" | "longrope", "factor": ..., ...}
    partial_rotary_factor: float = 1.0  # share of head_dim that RoPE rotates (Phi-3, GLM-4)
    rope_local_base_freq: float | None = None  # RoPE theta of sliding-window layers (Gemma 3)
    query_pre_attn_scalar: float | None = None  # scores scaled by 1/sqrt(this); None: head_dim
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 3)
    attention_bias: bool = False  # bias on q, k, v (and o for Llama's attention_bias)
    o_proj_bias: bool = False
    mlp_bias: bool = False
    use_qk_norm: bool = False  # an RMSNorm over each q and k head (GLM-4-MoE; Qwen3 and Gemma 3 always have one)
    attention_sinks: bool = False  # a learned logit per head that takes a share of the softmax (gpt-oss)
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)  # one of LAYER_TYPES per layer
    no_rope_layers: list[int] = field(default_factory=list)  # per layer 1: RoPE, 0: none (SmolLM3); []: all RoPE
    # recurrent layers (layer_types "conv"): a short causal convolution over the last conv_kernel inputs (LFM2);
    # "linear_attention" (gated DeltaNet: Qwen3-Next, Qwen3.5) convolves its q, k, v over conv_kernel inputs too
    conv_kernel: int = 0
    conv_bias: bool = False
    linear_num_key_heads: int = 0  # gated DeltaNet's q and k heads; each serves value heads / key heads v heads
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    # the value heads' order: grouped by the key head they share (HF's), or tiled (k0, k1, k0, k1, ...), as
    # llama.cpp's qwen35 files store them
    linear_value_heads_tiled: bool = False
    # mixture of experts (moe.py); num_experts 0: every layer's MLP is dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's inner width
    mlp_types: list[str] = field(default_factory=list)  # per layer "dense" | "sparse" (experts)
    router: str = "softmax"  # one of ROUTERS
    norm_topk_prob: bool = False  # the k kept weights renormalised to sum to 1
    routed_scaling_factor: float = 1.0  # the experts' weights times this (GLM-4-MoE)
    n_group: int = 1  # experts in n_group groups, the top topk_group groups eligible (GLM-4-MoE)
    topk_group: int = 1
    router_bias: bool = False  # a bias on the router's logits and on each expert's projections (gpt-oss)
    shared_expert_intermediate_size: int = 0  # an always-on expert beside the routed ones (0: none)
    shared_expert_gate: bool = False  # the shared expert's output times sigmoid(x · w) (Qwen2-MoE)
    swiglu_alpha: float = 1.702  # gpt-oss's clamped SwiGLU: gate · σ(alpha · gate) · (up + 1)
    swiglu_limit: float = 7.0
    # Granite's multipliers: embeddings, each block's output before the residual add, attention scores
    # (instead of 1/√head_dim), and logits (divided by logits_scaling)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    # Gemma 4: per layer head_dim and KV heads ([]: all alike), the last num_kv_shared_layers borrowing
    # keys and values (kv_source), keys as values on full layers, per-layer input embeddings (0: none),
    # MLPs twice as wide on the KV-shared layers
    layer_head_dims: list[int] = field(default_factory=list)
    layer_kv_heads: list[int] = field(default_factory=list)
    num_kv_shared_layers: int = 0
    attention_k_eq_v: bool = False
    hidden_size_per_layer_input: int = 0
    vocab_size_per_layer_input: int = 0
    use_double_wide_mlp: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not self.layer_types:
            kind = "sliding_attention" if self.sliding_window else "full_attention"
            self.layer_types = [kind] * self.num_hidden_layers
        if not self.mlp_types:
            self.mlp_types = ["sparse" if self.num_experts else "dense"] * self.num_hidden_layers
        self._validate()

    def _validate(self) -> None:
        if type(self.head_dim) is not int or self.head_dim <= 0:
            raise ConfigError(f"head_dim must be a positive integer, got {self.head_dim!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for "
                              f"{self.num_hidden_layers} layers")
        if self.no_rope_layers and (len(self.no_rope_layers) != self.num_hidden_layers
                                    or set(self.no_rope_layers) - {0, 1}):
            raise ConfigError(f"no_rope_layers must be 0 or 1 for each of {self.num_hidden_layers} layers")
        bad = set(self.layer_types) - set(LAYER_TYPES)
        if bad:
            raise ConfigError(f"layer_types entries {sorted(bad)} are not supported "
                              f"(supported: {', '.join(LAYER_TYPES)})")
        if {"conv", "linear_attention"} & set(self.layer_types) and (type(self.conv_kernel) is not int
                                                                     or self.conv_kernel < 2):
            raise ConfigError(f"conv and linear_attention layers need a kernel of at least 2 inputs, got "
                              f"{self.conv_kernel!r}")
        if "linear_attention" in self.layer_types:
            self._validate_linear_attention()
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ConfigError("layer_types asks for sliding_attention but sliding_window is not set")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"norm epsilon must be a positive number, got {self.norm_eps!r}")
        for name in ("rope_local_base_freq", "query_pre_attn_scalar", "final_logit_softcapping",
                     "attention_multiplier"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(f"{name} must be a positive number or null, got {value!r}")
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling", "routed_scaling_factor",
                     "swiglu_alpha", "swiglu_limit"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        self._validate_rotary()
        self._validate_experts()
        self._validate_layer_shapes()

    def _validate_linear_attention(self) -> None:
        for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                              f"linear_num_key_heads ({self.linear_num_key_heads})")

    def _validate_rotary(self) -> None:
        if not (0 < self.partial_rotary_factor <= 1) or self.rotary_dim % 2 or not self.rotary_dim:
            raise ConfigError(f"partial_rotary_factor {self.partial_rotary_factor!r} must be in (0, 1] and "
                              f"rotate an even number of dimensions (head_dim {self.head_dim})")
        if self.rope_scaling is not None and self.rope_scaling["rope_type"] == "longrope":
            for name in ("short_factor", "long_factor"):
                if len(self.rope_scaling[name]) != self.rotary_dim // 2:
                    raise ConfigError(f"rope {name} has {len(self.rope_scaling[name])} entries; the rotated "
                                      f"dimensions need {self.rotary_dim // 2}")

    def _validate_experts(self) -> None:
        if len(self.mlp_types) != self.num_hidden_layers or set(self.mlp_types) - {"dense", "sparse"}:
            raise ConfigError(f"mlp_types must be 'dense' or 'sparse' for each of {self.num_hidden_layers} layers")
        if "sparse" not in self.mlp_types:
            return
        e, k = self.num_experts, self.num_experts_per_tok
        if type(e) is not int or type(k) is not int or not 0 < k <= e:
            raise ConfigError(f"num_experts_per_tok ({k!r}) must be an integer in 1..num_experts ({e!r})")
        if type(self.moe_intermediate_size) is not int or self.moe_intermediate_size <= 0:
            raise ConfigError(f"moe_intermediate_size must be a positive integer, got {self.moe_intermediate_size!r}")
        if self.router not in ROUTERS:
            raise ConfigError(f"router {self.router!r} is not supported (supported: {', '.join(ROUTERS)})")
        groups, top = self.n_group, self.topk_group
        if type(groups) is not int or type(top) is not int or groups <= 0 or e % groups or not 0 < top <= groups:
            raise ConfigError(f"n_group ({groups!r}) must divide the {e} experts and topk_group ({top!r}) be in "
                              f"1..n_group")
        if k > top * (e // groups):
            raise ConfigError(f"num_experts_per_tok ({k}) exceeds the experts of the topk_group ({top}) groups "
                              f"eligible ({top * (e // groups)})")
        if groups > 1 and e // groups < 2:
            raise ConfigError(f"n_group ({groups}) leaves fewer than 2 experts per group (a group's score is "
                              "its best two)")

    def _validate_layer_shapes(self) -> None:
        n = self.num_hidden_layers
        heads = self.num_attention_heads
        for name, fits, what in (("layer_head_dims", lambda v: v % 2 == 0, "even (RoPE)"),
                                 ("layer_kv_heads", lambda v: heads % v == 0, f"dividing the {heads} heads")):
            values = getattr(self, name)
            if values and (len(values) != n or not all(type(v) is int and v > 0 and fits(v) for v in values)):
                raise ConfigError(f"{name} must be positive integers {what}, one per layer ({n}), got {values!r}")
        shared = self.num_kv_shared_layers
        if type(shared) is not int or not 0 <= shared < n:
            raise ConfigError(f"num_kv_shared_layers must be an integer in 0..{n - 1}, got {shared!r}")
        if shared and not set(self.layer_types[n - shared :]) <= set(self.layer_types[: n - shared]):
            raise ConfigError("num_kv_shared_layers: a KV-shared layer's kind (layer_types) has no earlier layer of "
                              "that kind to take keys and values from")
        for name in ("hidden_size_per_layer_input", "vocab_size_per_layer_input"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")

    def kv_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head_dim) of a layer's keys and values (and of its query heads' head_dim)."""
        heads = self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_key_value_heads
        return heads, self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends over: itself, but for the last
        num_kv_shared_layers, which take those of the last layer of their kind before them.

        With layer_types [sliding, full, sliding, full] and num_kv_shared_layers 2: [0, 1, 0, 1]."""
        first_shared = self.num_hidden_layers - self.num_kv_shared_layers
        if layer < first_shared:
            return layer
        kind = self.layer_types[layer]
        return max(i for i in range(first_shared) if self.layer_types[i] == kind)

    def cache_shapes(self) -> list[tuple[int, int] | None]:
        """What a KV cache holds per layer: (KV heads, head_dim), or None (it borrows: kv_source)."""
        return [self.kv_shape(i) if self.kv_source(i) == i else None for i in range(self.num_hidden_layers)]

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that RoPE rotates: the first rotary_dim of head_dim."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def recurrent_layers(self) -> list[int]:
        """The layers that keep a fixed-size state instead of keys and values (RECURRENT_TYPES)."""
        return [i for i, kind in enumerate(self.layer_types) if kind in RECURRENT_TYPES]

    @property
    def attention_layers(self) -> list[int]:
        """The layers that attend, keeping keys and values in the cache."""
        return [i for i, kind in enumerate(self.layer_types) if kind not in RECURRENT_TYPES]

    @property
    def is_moe(self) -> bool:
        """Some layer routes each token to experts."""
        return "sparse" in self.mlp_types


def optional_int(hf: dict, key: str) -> int | None:
    """hf[key] if it is an integer or absent/null; ConfigError otherwise."""
    value = hf.get(key)
    if value is not None and type(value) is not int:
        raise ConfigError(f"{key} must be an integer or null, got {value!r}")
    return value


def eos_token_ids(value, where: str = "") -> list[int]:
    """eos_token_id as config.json and generation_config.json write it: an int, a list, or null.

    eos_token_ids(2) == [2]; eos_token_ids([2, 7]) == [2, 7]; eos_token_ids(None) == []
    """
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(i) is int for i in ids):
        raise ConfigError(f"{where}eos_token_id must be an integer or a list of integers, got {value!r}")
    return list(ids)


def read_generation_stop_ids(directory: Path) -> list[int]:
    """eos_token_id from generation_config.json (often longer than config.json's), if present."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (ValueError, AttributeError):
        raise ConfigError(f"{path} is not a valid JSON object") from None
    return eos_token_ids(value, where=f"{path}: ")


def check_act(act, allowed: tuple[str, ...]) -> str:
    """act if it is one of allowed: check_act("silu", ("silu",)) == "silu"; ConfigError otherwise."""
    if act not in allowed:
        raise ConfigError(f"activation {act!r} is not supported (supported: {', '.join(allowed)})")
    return act


def partial_rotary(hf: dict, model_type: str, allowed: bool) -> float:
    """partial_rotary_factor from the RoPE parameters or the top level (Phi-4-mini: 0.75; GLM-4: 0.5);
    a family that rotates whole heads (allowed False) refuses anything but 1."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)):
        raise ConfigError(f"partial_rotary_factor must be a number, got {factor!r}")
    if factor != 1.0 and not allowed:
        raise ConfigError(f"partial_rotary_factor != 1 is not supported for {model_type}")
    return float(factor)


def rope(hf: dict, kinds: tuple[str, ...] = ROPE_TYPES) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's rope_parameters or 4's rope_theta + rope_scaling."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    return rope_scaling(params, kinds, hf)


def rope_scaling(params: dict, kinds: tuple[str, ...], hf: dict) -> tuple[float, dict | None]:
    """(theta, scaling) of one set of RoPE parameters (rope_theta included)."""
    params = dict(params)
    theta = float(params.pop("rope_theta"))
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind == "su" and "longrope" in kinds else kind
    if kind not in kinds:
        raise ConfigError(f"rope_type {kind!r} is not supported (supported: {', '.join(kinds)})")
    if kind == "default":
        return theta, None
    if kind in ("longrope", "yarn"):
        return theta, getattr(rope_params, kind)(params, hf)
    needed = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in needed if not isinstance(params.get(k), (int, float))]
    if missing:
        raise ConfigError(f"rope_type {kind!r} needs numeric {', '.join(missing)}")
    return theta, {"rope_type": kind, **{k: float(params[k]) for k in needed}}


def layer_type_rope(hf: dict, kinds: tuple[str, ...], theta: float, local_theta: float
                    ) -> tuple[float, dict | None, float]:
    """(global theta, global scaling, local theta) of a family whose sliding and full layers turn
    at rates of their own (Gemma 3, OLMo 3): transformers 5's rope_parameters per layer type, or
    4's rope_theta + rope_scaling (global layers only); theta and local_theta are the defaults. The
    local layers' RoPE takes no scaling."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = dict(hf.get("rope_scaling") or {})
        local = {}
    full.setdefault("rope_theta", hf.get("rope_theta", theta))
    local.setdefault("rope_theta", local_theta)
    theta, scaling = rope_scaling(full, kinds, hf)
    local_theta, local_scaling = rope_scaling(local, kinds, hf)
    if local_scaling is not None:
        raise ConfigError("RoPE scaling of sliding_attention layers is not supported")
    return theta, scaling, local_theta


def sparse_layers(layers: int, *, every: int = 1, dense: list[int] | tuple[int, ...] = (), first_dense: int = 0
                  ) -> list[str]:
    """Which layers route to experts, in the families' three spellings: every `every`-th layer
    (Qwen2-MoE's decoder_sparse_step), except those listed (mlp_only_layers) and the first
    `first_dense` (GLM-4-MoE's first_k_dense_replace).

    sparse_layers(4, first_dense=1) == ["dense", "sparse", "sparse", "sparse"]
    """
    if type(every) is not int or every <= 0:
        raise ConfigError(f"decoder_sparse_step must be a positive integer, got {every!r}")
    if not isinstance(dense, (list, tuple)) or not all(type(i) is int for i in dense):
        raise ConfigError(f"mlp_only_layers must be a list of layer indices, got {dense!r}")
    if type(first_dense) is not int or first_dense < 0:
        raise ConfigError(f"first_k_dense_replace must be a non-negative integer, got {first_dense!r}")
    return ["sparse" if (i + 1) % every == 0 and i not in dense and i >= first_dense else "dense"
            for i in range(layers)]


def positive_number(hf: dict, key: str, default: float) -> float:
    """hf[key] (default when absent or null) as a float; ConfigError unless a finite positive number."""
    value = hf.get(key)
    value = default if value is None else value
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
        raise ConfigError(f"{key} must be a positive number, got {value!r}")
    return float(value)
