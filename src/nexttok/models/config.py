"""ModelConfig: one dataclass for every supported architecture, named as HF config.json names it.

GPT-2's own keys (n_embd, n_layer, ...) are read into the canonical names HF also maps them to
(hidden_size, num_hidden_layers, ...). Unknown keys are ignored; unsupported features raise.
read_config and read_generation_stop_ids read a checkpoint directory's config.json and
generation_config.json; ConfigError and CheckpointError are what a bad checkpoint raises.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

LLAMA_FAMILY = ("llama", "qwen2", "mistral")
SUPPORTED = ("gpt2", *LLAMA_FAMILY, "qwen3", "phi3", "gemma3_text")
ROPE_TYPES = ("default", "linear", "llama3")
PHI3_ROPE_TYPES = ("default", "longrope")  # as HF's Phi3Config; "su" is an older name of longrope


class ConfigError(ValueError):
    """config.json asks for something missing, malformed or unsupported."""


class CheckpointError(ValueError):
    """A checkpoint file that is missing, corrupt, or does not fit the model."""


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
    rope_scaling: dict | None = None  # {"rope_type": "linear" | "llama3" | "longrope", "factor": ..., ...}
    partial_rotary_factor: float = 1.0  # share of head_dim that RoPE rotates (Phi-3 family)
    rope_local_base_freq: float | None = None  # RoPE theta of sliding-window layers (Gemma 3)
    query_pre_attn_scalar: float | None = None  # scores scaled by 1/sqrt(this); None: head_dim
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 3)
    attention_bias: bool = False  # bias on q, k, v (and o for Llama's attention_bias)
    o_proj_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)  # "full_attention" | "sliding_attention"
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
        bad = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise ConfigError(f"layer_types entries {sorted(bad)} are not supported")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ConfigError("layer_types asks for sliding_attention but sliding_window is not set")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"norm epsilon must be a positive number, got {self.norm_eps!r}")
        for name in ("rope_local_base_freq", "query_pre_attn_scalar", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(f"{name} must be a positive number or null, got {value!r}")
        self._validate_rotary()

    def _validate_rotary(self) -> None:
        if not (0 < self.partial_rotary_factor <= 1) or self.rotary_dim % 2:
            raise ConfigError(f"partial_rotary_factor {self.partial_rotary_factor!r} must be in (0, 1] and "
                              f"rotate an even number of dimensions (head_dim {self.head_dim})")
        if self.rope_scaling is not None and self.rope_scaling["rope_type"] == "longrope":
            for name in ("short_factor", "long_factor"):
                if len(self.rope_scaling[name]) != self.rotary_dim // 2:
                    raise ConfigError(f"rope {name} has {len(self.rope_scaling[name])} entries; the rotated "
                                      f"dimensions need {self.rotary_dim // 2}")

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that RoPE rotates: the first rotary_dim of head_dim."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads


def from_hf_config(hf: dict) -> ModelConfig:
    """ModelConfig from a parsed HF config.json; unknown keys ignored.

    from_hf_config({"model_type": "gpt2", "n_embd": 768, ...}).hidden_size == 768
    """
    if not isinstance(hf, dict):
        raise ConfigError(f"config must be a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED:
        hint = GEMMA3_MULTIMODAL if model_type == "gemma3" else ""
        raise ConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED)}){hint}")
    try:
        fields = (_gpt2_fields(hf) if model_type == "gpt2" else _gemma3_fields(hf) if model_type == "gemma3_text"
                  else _llama_fields(hf, model_type))
        return ModelConfig(model_type=model_type, bos_token_id=_optional_int(hf, "bos_token_id"),
                           eos_token_id=eos_token_ids(hf.get("eos_token_id")),
                           torch_dtype=hf.get("torch_dtype") or hf.get("dtype"), **fields)
    except KeyError as e:
        raise ConfigError(f"config.json for {model_type} is missing {e.args[0]!r}") from None
    except TypeError as e:
        raise ConfigError(f"config.json for {model_type} has a value of the wrong type: {e}") from None


def _optional_int(hf: dict, key: str) -> int | None:
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


def read_config(directory: Path) -> ModelConfig:
    """The ModelConfig of a checkpoint directory's config.json."""
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json in {directory}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    return from_hf_config(data)


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


def _gpt2_fields(hf: dict) -> dict:
    for key, ok in (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                    ("scale_attn_weights", True), ("add_cross_attention", False)):
        if hf.get(key, ok) != ok:
            raise ConfigError(f"GPT-2 option {key}={hf[key]!r} is not supported")
    act = hf.get("activation_function", "gelu_new")
    hidden = hf["n_embd"]
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hidden, num_hidden_layers=hf["n_layer"],
        num_attention_heads=hf["n_head"], num_key_value_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * hidden, max_position_embeddings=hf["n_positions"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), hidden_act=_check_act(act, GPT2_ACTS),
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
    )


GPT2_ACTS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu")
LLAMA_ACTS = ("silu",)


def _check_act(act, allowed: tuple[str, ...]) -> str:
    if act not in allowed:
        raise ConfigError(f"activation {act!r} is not supported (supported: {', '.join(allowed)})")
    return act


def _llama_fields(hf: dict, model_type: str) -> dict:
    """Llama and its variants: Qwen2 (q/k/v bias), Qwen3 (q/k norms), Mistral, Phi-3 (longrope)."""
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf, PHI3_ROPE_TYPES if model_type == "phi3" else ROPE_TYPES)
    bias = bool(hf.get("attention_bias", False)) and model_type != "phi3"  # Phi-3 has none, as in HF
    window, layer_types = _llama_windows(hf, model_type)
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        # Qwen3Config's head_dim defaults to 128, not hidden_size // heads
        head_dim=hf.get("head_dim") or (128 if model_type == "qwen3" else 0), norm_eps=hf.get("rms_norm_eps", 1e-6),
        hidden_act=_check_act(hf.get("hidden_act", "silu"), LLAMA_ACTS),
        rope_theta=theta, rope_scaling=scaling, partial_rotary_factor=_partial_rotary(hf, model_type),
        attention_bias=model_type == "qwen2" or bias, o_proj_bias=model_type in ("llama", "qwen3") and bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) and model_type != "phi3",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=window, layer_types=layer_types,
    )


def _llama_windows(hf: dict, model_type: str) -> tuple[int | None, list[str]]:
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


def _partial_rotary(hf: dict, model_type: str) -> float:
    """partial_rotary_factor from the RoPE parameters or the top level (Phi-4-mini: 0.75)."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)):
        raise ConfigError(f"partial_rotary_factor must be a number, got {factor!r}")
    if factor != 1.0 and model_type != "phi3":
        raise ConfigError(f"partial_rotary_factor != 1 is not supported for {model_type}")
    return float(factor)


GEMMA3_ACTS = ("gelu_pytorch_tanh",)
GEMMA3_MULTIMODAL = (". 'gemma3' is the multimodal Gemma 3 (4B and up); text-only Gemma 3 checkpoints "
                     "(model_type gemma3_text: gemma-3-270m, gemma-3-1b) are supported")


def _gemma3_fields(hf: dict) -> dict:
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
    theta, scaling, local_theta = _gemma3_rope(hf)
    bias = bool(hf.get("attention_bias", False))
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=layers,
        num_attention_heads=hf["num_attention_heads"], num_key_value_heads=hf.get("num_key_value_heads", 4),
        intermediate_size=hf["intermediate_size"], max_position_embeddings=hf.get("max_position_embeddings", 131072),
        head_dim=hf.get("head_dim", 256), norm_eps=hf.get("rms_norm_eps", 1e-6),
        hidden_act=_check_act(hf.get("hidden_activation", "gelu_pytorch_tanh"), GEMMA3_ACTS),
        rope_theta=theta, rope_scaling=scaling, rope_local_base_freq=local_theta,
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        attention_bias=bias, o_proj_bias=bias, tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        sliding_window=hf.get("sliding_window", 4096), layer_types=layer_types,
    )


def _gemma3_rope(hf: dict) -> tuple[float, dict | None, float]:
    """(global theta, global scaling, local theta): transformers 5's rope_parameters per layer
    type, or 4's rope_theta + rope_scaling (global layers only) and rope_local_base_freq."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = dict(hf.get("rope_scaling") or {})
        local = {}
    full.setdefault("rope_theta", hf.get("rope_theta", 1e6))
    local.setdefault("rope_theta", hf.get("rope_local_base_freq", 10000.0))
    theta, scaling = _rope_scaling(full, ROPE_TYPES, hf)
    local_theta, local_scaling = _rope_scaling(local, ROPE_TYPES, hf)
    if local_scaling is not None:
        raise ConfigError("RoPE scaling of sliding_attention layers is not supported")
    return theta, scaling, local_theta


def _rope(hf: dict, kinds: tuple[str, ...] = ROPE_TYPES) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's rope_parameters or 4's rope_theta + rope_scaling."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    return _rope_scaling(params, kinds, hf)


def _rope_scaling(params: dict, kinds: tuple[str, ...], hf: dict) -> tuple[float, dict | None]:
    """(theta, scaling) of one set of RoPE parameters (rope_theta included)."""
    theta = float(params.pop("rope_theta"))
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind == "su" and "longrope" in kinds else kind
    if kind not in kinds:
        raise ConfigError(f"rope_type {kind!r} is not supported (supported: {', '.join(kinds)})")
    if kind == "default":
        return theta, None
    if kind == "longrope":
        return theta, _longrope(params, hf)
    needed = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in needed if not isinstance(params.get(k), (int, float))]
    if missing:
        raise ConfigError(f"rope_type {kind!r} needs numeric {', '.join(missing)}")
    return theta, {"rope_type": kind, **{k: float(params[k]) for k in needed}}


def _longrope(params: dict, hf: dict) -> dict:
    """LongRoPE (Phi-3): per-dimension divisors of the frequencies, short_factor up to the
    original context and long_factor past it. The top-level original_max_position_embeddings
    wins over the parameters' own, as in HF's Phi3Config (default 4096)."""
    for name in ("short_factor", "long_factor"):
        value = params.get(name)
        if not (isinstance(value, list) and value and all(isinstance(x, (int, float)) and x > 0 for x in value)):
            raise ConfigError(f"rope_type 'longrope' needs {name}: a list of positive numbers")
    original = hf.get("original_max_position_embeddings", params.get("original_max_position_embeddings", 4096))
    if type(original) is not int or original <= 0:
        raise ConfigError(f"original_max_position_embeddings must be a positive integer, got {original!r}")
    for name in ("factor", "attention_factor"):  # optional; phi3.py derives them when absent
        if params.get(name) is not None and not (isinstance(params[name], (int, float)) and params[name] > 0):
            raise ConfigError(f"rope {name} must be a positive number, got {params[name]!r}")
    return {"rope_type": "longrope", "short_factor": [float(x) for x in params["short_factor"]],
            "long_factor": [float(x) for x in params["long_factor"]],
            "original_max_position_embeddings": original,
            "factor": params.get("factor"), "attention_factor": params.get("attention_factor")}
