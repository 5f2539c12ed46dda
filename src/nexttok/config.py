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
SUPPORTED = ("gpt2", *LLAMA_FAMILY)
ROPE_TYPES = ("default", "linear", "llama3")


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
    rope_scaling: dict | None = None  # {"rope_type": "linear" | "llama3", "factor": ..., ...}
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
        raise ConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED)})")
    try:
        fields = _gpt2_fields(hf) if model_type == "gpt2" else _llama_fields(hf, model_type)
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
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    qkv_bias = model_type == "qwen2" or bool(hf.get("attention_bias", False))
    window = hf.get("sliding_window")
    layer_types = hf.get("layer_types") or []
    if model_type == "qwen2" and not layer_types:
        use = hf.get("use_sliding_window", False)
        start = hf.get("max_window_layers", hf["num_hidden_layers"])
        layer_types = ["sliding_attention" if use and i >= start else "full_attention"
                       for i in range(hf["num_hidden_layers"])]
    if model_type == "qwen2" and not hf.get("use_sliding_window", False):
        layer_types, window = ["full_attention"] * hf["num_hidden_layers"], None
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        head_dim=hf.get("head_dim") or 0, norm_eps=hf.get("rms_norm_eps", 1e-6),
        hidden_act=_check_act(hf.get("hidden_act", "silu"), LLAMA_ACTS),
        rope_theta=theta, rope_scaling=scaling, attention_bias=qkv_bias,
        o_proj_bias=model_type == "llama" and bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=window, layer_types=layer_types,
    )


def _rope(hf: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's rope_parameters or 4's rope_theta + rope_scaling."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(f"rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError("partial_rotary_factor != 1 is not supported")
    if kind == "default":
        return theta, None
    needed = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in needed if not isinstance(params.get(k), (int, float))]
    if missing:
        raise ConfigError(f"rope_type {kind!r} needs numeric {', '.join(missing)}")
    return theta, {"rope_type": kind, **{k: float(params[k]) for k in needed}}
