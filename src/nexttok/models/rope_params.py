"""The RoPE scalings whose parameters need more than a factor: YaRN and LongRoPE, as config.json
writes them (config.rope_scaling reads the rest)."""

from __future__ import annotations

import math

from nexttok.models.config_errors import ConfigError


def yarn(params: dict, hf: dict) -> dict:
    """YaRN (gpt-oss, Qwen3 long context): as HF's _compute_yarn_parameters reads it. factor may be
    left out (then max_position_embeddings / original_max_position_embeddings); attention_factor
    too (then from factor, or mscale / mscale_all_dim); beta_fast 32 and beta_slow 1 by default."""
    original = params.get("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
    if type(original) is not int or original <= 0:
        raise ConfigError(f"rope_type 'yarn' needs original_max_position_embeddings, a positive integer, "
                          f"got {original!r}")
    out = {"rope_type": "yarn", "original_max_position_embeddings": original,
           "truncate": bool(params.get("truncate", True))}
    for name, default in (("factor", None), ("attention_factor", None), ("beta_fast", 32.0), ("beta_slow", 1.0),
                          ("mscale", None), ("mscale_all_dim", None)):
        value = params.get(name) or default
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ConfigError(f"rope {name} must be a positive number, got {value!r}")
        out[name] = None if value is None else float(value)
    if out["factor"] is None:
        out["factor"] = hf.get("max_position_embeddings", original) / original
    return out


def longrope(params: dict, hf: dict) -> dict:
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
