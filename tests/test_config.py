"""ModelConfig from HF config.json dicts: both transformers 4 and 5 spellings, clear errors."""

from __future__ import annotations

import pytest

from nexttok.models.config import ConfigError
from nexttok.models.registry import from_hf_config

LLAMA = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-5}


def test_gpt2_keys_map_to_canonical_names():
    config = from_hf_config({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
                             "n_head": 12, "n_positions": 1024, "eos_token_id": 50256})
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (768, 12, 12)
    assert config.intermediate_size == 3072 and config.head_dim == 64 and config.tie_word_embeddings
    assert config.eos_token_id == [50256]


def test_unknown_keys_are_ignored():
    config = from_hf_config({**LLAMA, "some_future_key": {"x": 1}, "architectures": ["Foo"]})
    assert config.n_rep == 2 and config.head_dim == 16


def test_rope_spellings_of_transformers_4_and_5_agree():
    v4 = from_hf_config({**LLAMA, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    v5 = from_hf_config({**LLAMA, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                      "rope_theta": 5e5}})
    assert v4.rope_theta == v5.rope_theta == 5e5
    assert v4.rope_scaling == v5.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    plain = from_hf_config({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert plain.rope_scaling is None


def test_qwen2_sliding_layers_follow_max_window_layers():
    base = {**LLAMA, "model_type": "qwen2", "num_hidden_layers": 3, "sliding_window": 8}
    on = from_hf_config({**base, "use_sliding_window": True, "max_window_layers": 1})
    assert on.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert on.attention_bias and not on.o_proj_bias
    off = from_hf_config({**base, "use_sliding_window": False})
    assert off.sliding_window is None and set(off.layer_types) == {"full_attention"}


def test_mistral_window_applies_to_every_layer():
    config = from_hf_config({**LLAMA, "model_type": "mistral", "sliding_window": 16})
    assert config.layer_types == ["sliding_attention"] * 2


@pytest.mark.parametrize("changes,message", [
    ({"model_type": "bert"}, "model_type 'bert' is not supported"),
    ({"model_type": None}, "model_type None is not supported"),
    ({"hidden_size": None}, "hidden_size must be a positive integer"),
    ({"hidden_size": "64"}, "wrong type|hidden_size must be a positive integer"),
    ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads \\(3\\)"),
    ({"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}}, "rope_type 'dynamic' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": -4.0, "original_max_position_embeddings": 64}},
     "rope factor must be a positive number, got -4.0"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "needs numeric low_freq_factor"),
    ({"rms_norm_eps": -1.0}, "norm epsilon must be a positive number"),
    ({"eos_token_id": "x"}, "eos_token_id must be an integer or a list"),
    ({"layer_types": ["full_attention"]}, "layer_types has 1 entries for 2 layers"),
    ({"layer_types": ["sliding_attention"] * 2}, "sliding_window is not set"),
])
def test_bad_configs(changes, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**LLAMA, **changes})


def test_missing_key_is_named():
    bad = dict(LLAMA)
    del bad["intermediate_size"]
    with pytest.raises(ConfigError, match="missing 'intermediate_size'"):
        from_hf_config(bad)
    with pytest.raises(ConfigError, match="GPT-2 option scale_attn_by_inverse_layer_idx"):
        from_hf_config({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(ConfigError, match="config must be a JSON object"):
        from_hf_config([1])
