"""Gemma 4 (gemma4.py) in llama.cpp's `gemma4` GGUF layout: gguf_config reads its metadata as
config.json keys, gguf_metadata writes them, refusing in one line what llama.cpp's gemma4 cannot
hold. The ground truth is llama.cpp's source: src/models/gemma4.cpp (load_arch_hparams: the keys it
reads; load_arch_tensors: the tensors; the graph: what it does with them), src/llama-model.cpp
(load_hparams: the keys every family shares; create_memory: which layer's keys a KV-shared layer
takes) and conversion/gemma.py (Gemma4Model: how HF's checkpoint is written).

    metadata ("gemma4." ...)              config.json (Gemma4TextConfig)
    attention.sliding_window_pattern      layer_types: a bool per layer, true where it slides
    attention.key_length / _swa           the full / sliding layers' head_dim (value_length alike)
    attention.head_count_kv               KV heads: one count, or one per layer
    attention.shared_kv_layers            num_kv_shared_layers
    feed_forward_length                   intermediate_size, per layer where use_double_wide_mlp
    embedding_length_per_layer_input      hidden_size_per_layer_input (0: none)
    rope.freq_base / rope.freq_base_swa   the full / sliding layers' theta
    rope_freqs.weight (a tensor)          the full layers' "proportional" RoPE: per pair of dimensions
                                          a factor dividing its rate, 1e30 where it stays still
    final_logit_softcapping               the soft cap of the logits; 0: none (absent: llama.cpp caps at 30)
    expert_count, expert_used_count, expert_feed_forward_length   the experts (26B-A4B)

Norms are stored as they are (Gemma 4's RMSNorm multiplies by w, not 1 + w); the RoPE is NEOX's
(halves, as HF's: nothing permuted); a full layer with attn_k and no attn_v takes its keys as
values (attention_k_eq_v); experts' gate and up are one tensor, ffn_gate_up_exps, as the converter
writes them; the router's scale is ffn_gate_inp.scale, its per-expert scale ffn_down_exps.scale.
"""

from __future__ import annotations

import numpy as np

from nexttok.models import moe, qwen3
from nexttok.models.architecture import GGUFMeta, representable
from nexttok.models.config import ConfigError, ModelConfig
from nexttok.tokenizers.tokenizer import GEMMA4_END_TOKENS

# a pair whose rate is divided by this does not turn (the factor llama.cpp's converter writes: 1e30);
# read back, any factor past STILL_FROM is a pair that stays still
STILL, STILL_FROM = 1e30, 1e20
# where the file holds no theta for the sliding layers, and no final_logit_softcapping, llama.cpp's hparams
# defaults (llama-hparams.h): its graph caps logits at 30 then, and only a 0 in the file turns the cap off
SWA_THETA, LOGIT_CAP = 10_000.0, 30.0


def llama_kv_source(config: ModelConfig, layer: int) -> int:
    """The layer whose keys and values llama.cpp's gemma4 gives `layer` (src/llama-model.cpp,
    create_memory's reuse): its own, but on a KV-shared layer the last unshared layer's where the
    layer is full, the one before it where it slides."""
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    if layer < first_shared:
        return layer
    return first_shared - (2 if config.layer_types[layer] == "sliding_attention" else 1)


def gguf_config(meta: GGUFMeta) -> dict:
    """config.json keys of a gemma4 file, as llama.cpp's gemma4 runs it."""
    layers, hidden = meta.key("block_count"), meta.key("embedding_length")
    types = _layer_types(meta, layers)
    heads = _one(meta, "attention.head_count")
    kv = _per_layer(meta, "attention.head_count_kv", layers, heads)
    full_dim, swa_dim = _head_dims(meta, hidden // heads)
    shared = meta.get("attention.shared_kv_layers", 0)
    inner, wide = _widths(meta, layers, shared)
    per_layer = meta.key("embedding_length_per_layer_input")  # llama.cpp reads it unconditionally
    dims = [swa_dim if kind == "sliding_attention" else full_dim for kind in types]
    config = {
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv[types.index("sliding_attention")] if "sliding_attention" in types else kv[0],
        "head_dim": swa_dim, "per_layer_config": {str(i): {"head_dim": dims[i], "num_key_value_heads": kv[i]}
                                                  for i in range(layers)},
        "intermediate_size": inner, "use_double_wide_mlp": wide, "max_position_embeddings": meta.key("context_length"),
        "rms_norm_eps": meta.key("attention.layer_norm_rms_epsilon"), "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": types, "sliding_window": meta.key("attention.sliding_window"), "num_kv_shared_layers": shared,
        "attention_k_eq_v": _keys_as_values(meta, types, layers - shared),
        "hidden_size_per_layer_input": per_layer, "attention_bias": False,
        "final_logit_softcapping": meta.get("final_logit_softcapping", LOGIT_CAP) or None,
        "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                  "rope_theta": meta.get("rope.freq_base_swa", SWA_THETA)},
                            "full_attention": _full_rope(meta, full_dim)},
        "eos_token_id": end_of_generation(meta),
    }
    if per_layer:  # llama.cpp's table has a row per token of the vocabulary
        config["vocab_size_per_layer_input"] = len(meta.tokens)
    if meta.get("expert_count"):
        config.update(_experts(meta, layers))
    return config


def end_of_generation(meta: GGUFMeta) -> list[int]:
    """The ids llama.cpp's gemma4 ends generation at: the file's eos, then GEMMA4_END_TOKENS where the vocabulary
    has them (a "</s>" there is a normal token: llama.cpp drops it from the list beside <|tool_response>)."""
    stops = [meta.values.get("tokenizer.ggml.eos_token_id"), *(meta.tokens.index(t) for t in GEMMA4_END_TOKENS
                                                                 if t in meta.tokens)]
    return [i for i in dict.fromkeys(stops) if i is not None]


def _layer_types(meta: GGUFMeta, layers: int) -> list[str]:
    pattern = meta.key("attention.sliding_window_pattern")
    if not isinstance(pattern, list):  # llama.cpp's gemma4 reads it with get_arr: a bool per layer
        raise ConfigError(f"GGUF {meta.arch}.attention.sliding_window_pattern must be a bool per layer, got "
                          f"{pattern!r}")
    types = meta.layer_types(layers, 0)
    if types[-1] != "full_attention":
        raise ConfigError(f"GGUF {meta.arch}.attention.sliding_window_pattern: a last layer that slides is not "
                          "supported (Gemma 4's last layer attends over everything)")
    return types


def _one(meta: GGUFMeta, key: str) -> int:
    value = meta.key(key)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ConfigError(f"GGUF {meta.arch}.{key} {value}: one count for every layer is supported")
        value = value[0]
    return value


def _per_layer(meta: GGUFMeta, key: str, layers: int, default: int) -> list[int]:
    value = meta.get(key, default)
    values = list(value) if isinstance(value, list) else [value] * layers
    if len(values) != layers:
        raise ConfigError(f"GGUF {meta.arch}.{key} has {len(values)} entries for {layers} layers")
    return values


def _head_dims(meta: GGUFMeta, default: int) -> tuple[int, int]:
    """(full, sliding) layers' head size, as llama.cpp's load_hparams reads them, checked against the
    value lengths and RoPE dimensions (llama.cpp's gemma4 requires values the keys' size; a RoPE over
    part of a head, in NEOX's halves, is not Gemma 4's)."""
    full, swa = meta.key("attention.key_length", default), meta.key("attention.key_length_swa")
    rot_full = meta.get("rope.dimension_count", full)
    checks = {"attention.value_length": (meta.get("attention.value_length", default), full),
              "attention.value_length_swa": (meta.key("attention.value_length_swa"), swa),
              "rope.dimension_count": (rot_full, full),
              "rope.dimension_count_swa": (meta.get("rope.dimension_count_swa", rot_full), swa)}
    for key, (value, want) in checks.items():
        if value != want:
            raise ConfigError(f"GGUF {meta.arch}.{key} {value} is not the layers' head size {want}: not supported")
    return full, swa


def _widths(meta: GGUFMeta, layers: int, shared: int) -> tuple[int, bool]:
    """(intermediate_size, use_double_wide_mlp): one width, or twice it on the KV-shared layers."""
    width = meta.key("feed_forward_length")
    if not isinstance(width, list):
        return width, False
    base = width[0]
    if width == [base] * layers:
        return base, False
    if shared and width == [base if i < layers - shared else 2 * base for i in range(layers)]:
        return base, True
    raise ConfigError(f"GGUF {meta.arch}.feed_forward_length {width}: one width, or twice it on the KV-shared "
                      "layers (use_double_wide_mlp), is supported")


def _keys_as_values(meta: GGUFMeta, types: list[str], unshared: int) -> bool:
    """attention_k_eq_v: the full layers that compute keys have no attn_v (llama.cpp then takes the
    keys as values); on every such layer or none, and never on a sliding one (HF's own rule)."""
    missing = {i for i in range(unshared) if f"blk.{i}.attn_v.weight" not in meta.tensor_names}
    full = {i for i in range(unshared) if types[i] == "full_attention"}
    if missing and missing != full:
        raise ConfigError(f"GGUF {meta.arch}: layers {sorted(missing)} have no attn_v; keys as values are supported "
                          "on every full layer or none")
    return bool(missing)


def _full_rope(meta: GGUFMeta, head_dim: int) -> dict:
    """The full layers' rope_parameters from rope_freqs (llama.cpp's converter: 1 for each of the
    first partial_rotary_factor of the pairs, 1e30 for the rest) and the linear scale llama.cpp
    applies to them where the file has one."""
    factors = meta.vectors.get("rope_freqs.weight")
    if factors is None or len(factors) != head_dim // 2:
        raise ConfigError(f"GGUF tensor rope_freqs.weight (the full layers' RoPE, {head_dim // 2} factors) is missing "
                          "or of another size")
    turning = sum(f < STILL_FROM for f in factors)
    if len(set(factors[:turning])) > 1 or any(f < STILL_FROM for f in factors[turning:]):
        raise ConfigError("GGUF rope_freqs.weight other than one factor for the first pairs and 1e30 for the rest "
                          "is not supported")
    fraction = turning / (head_dim // 2)
    if int(fraction * head_dim // 2) != turning:
        raise ConfigError(f"GGUF rope_freqs.weight turns {turning} of {head_dim // 2} pairs: no partial_rotary_factor "
                          "gives that")
    kind = meta.get("rope.scaling.type", "linear")  # llama.cpp's default, and it scales the full layers only
    if kind not in ("linear", "none"):
        raise ConfigError(f"GGUF rope scaling {kind!r} is not supported for {meta.arch}")
    scale = (meta.get("rope.scaling.factor") or 1.0) if kind == "linear" else 1.0
    factor = (factors[0] if turning else 1.0) * scale
    theta = meta.key("rope.freq_base", 10_000.0)  # llama.cpp's default where the file has none
    if turning == len(factors) and factor == 1.0:
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "proportional", "partial_rotary_factor": fraction, "factor": factor, "rope_theta": theta}


def _experts(meta: GGUFMeta, layers: int) -> dict:
    routed = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in meta.tensor_names]
    if len(routed) != layers:
        raise ConfigError(f"GGUF {meta.arch}: experts on layers {routed} only; on every layer or none is supported")
    out = moe.gguf_config(meta)
    inner = out.pop("moe_intermediate_size", None)
    return {"enable_moe_block": True, "num_experts": out["num_experts"], "top_k_experts": out["num_experts_per_tok"],
            "moe_intermediate_size": inner[0] if isinstance(inner, list) else inner}


def gguf_metadata(config: ModelConfig) -> dict:
    """gguf_config's inverse, after refusing what llama.cpp's gemma4 cannot hold."""
    _check_representable(config)
    n, types = config.num_hidden_layers, config.layer_types
    full_dim = config.kv_shape(types.index("full_attention"))[1]
    swa_dim = config.kv_shape(types.index("sliding_attention"))[1] if "sliding_attention" in types else full_dim
    kv = [config.kv_shape(i)[0] for i in range(n)]
    shared, inner = config.num_kv_shared_layers, config.intermediate_size
    wide = config.use_double_wide_mlp and shared  # as the converter: twice as wide on the KV-shared layers
    out = {
        "context_length": config.max_position_embeddings, "embedding_length": config.hidden_size, "block_count": n,
        "feed_forward_length": [inner * (2 if i >= n - shared else 1) for i in range(n)] if wide else inner,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": kv if len(set(kv)) > 1 else kv[0],
        "attention.key_length": full_dim, "attention.value_length": full_dim,
        "attention.key_length_swa": swa_dim, "attention.value_length_swa": swa_dim,
        "rope.dimension_count": full_dim, "rope.dimension_count_swa": swa_dim,
        "rope.freq_base": float(config.rope_theta), "rope.freq_base_swa": float(config.rope_local_base_freq),
        "attention.layer_norm_rms_epsilon": float(config.norm_eps), "attention.sliding_window": config.sliding_window,
        "attention.sliding_window_pattern": [kind == "sliding_attention" for kind in types],
        "attention.shared_kv_layers": shared, "embedding_length_per_layer_input": config.hidden_size_per_layer_input,
    }
    out["final_logit_softcapping"] = float(config.final_logit_softcapping or 0.0)  # 0: none (absent: 30)
    if config.is_moe:
        out.update(moe.gguf_metadata(config))
    return out


def _check_representable(config: ModelConfig) -> None:
    n, shared = config.num_hidden_layers, config.num_kv_shared_layers
    representable(not config.attention_bias, "attention biases (llama.cpp's gemma4 has none)")
    representable(n - shared >= 2, "fewer than 2 layers that compute keys (llama.cpp's gemma4 asserts 2)")
    representable(all(config.kv_source(i) == llama_kv_source(config, i) for i in range(n)),
                  "KV-shared layers taking keys from other layers than llama.cpp's gemma4 gives them (a full one "
                  "the last unshared layer's, a sliding one the layer's before it: "
                  f"{[llama_kv_source(config, i) for i in range(n - shared, n)]}, this checkpoint "
                  f"{[config.kv_source(i) for i in range(n - shared, n)]})")
    representable(not config.hidden_size_per_layer_input or config.vocab_size_per_layer_input == config.vocab_size,
                  f"a per-layer input table of {config.vocab_size_per_layer_input} rows for a vocabulary of "
                  f"{config.vocab_size} (llama.cpp's has a row per token)")


def rope_freqs(config: ModelConfig) -> np.ndarray:
    """The full layers' RoPE as llama.cpp's converter writes it (Gemma4Model.generate_extra_tensors):
    per pair of a full head's dimensions 1 where it turns, 1e30 where it stays still; a scaled RoPE's
    factor in place of the 1 (ggml divides each pair's rate by its value).

    partial_rotary_factor 0.25 over a head of 16, factor 2: [2, 2, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30]"""
    head_dim = config.kv_shape(config.layer_types.index("full_attention"))[1]
    scaling = config.rope_scaling or {}
    turning = int(scaling.get("partial_rotary_factor", 1.0) * head_dim // 2)  # as gemma4.inverse_frequencies
    return np.array([scaling.get("factor", 1.0)] * turning + [STILL] * (head_dim // 2 - turning), dtype=np.float32)


# llama.cpp -> ours (per block: "blk.N." -> "model.layers.N."), llama-arch.cpp's gemma4 names; the experts' stacked
# tensors are HF's own (E, 2 inner, hidden) and (E, hidden, inner), named as HF names them
GGUF_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", **qwen3.QK_NORM_TENSORS,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "inp_gate.weight": "per_layer_input_gate.weight", "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight", "layer_output_scale.weight": "layer_scalar",
    "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale", "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj", "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
}
DERIVED = {"rope_freqs.weight": rope_freqs}
