"""Rotary position embeddings (RoPE): how fast each pair of a head's dimensions turns per position,
with the scalings checkpoints ask for (linear, llama3, YaRN), and the rotation itself.

    angle(position, pair i) = position · inv_freq[i];  (x[i], x[i + d/2]) turned by that angle

Phi-3's LongRoPE (phi3.py) and Gemma 3's per-layer-kind thetas (gemma3.py) build on these.
"""

from __future__ import annotations

import math

import torch

from nexttok.models import kernels
from nexttok.models.config import ModelConfig


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Rotation speed of each rotated pair of dimensions (rotary_dim // 2,), rope_scaling applied."""
    dim = config.rotary_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    if scaling["rope_type"] == "yarn":
        return _yarn_inverse_frequencies(config, scaling)
    # llama3: long wavelengths slowed by `factor`, short kept, a smooth blend in between
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, blended, scaled)


def _yarn_inverse_frequencies(config: ModelConfig, scaling: dict) -> torch.Tensor:
    """YaRN: dimensions that turn fewer than beta_slow times over the original context are slowed by
    `factor` (interpolated), those turning more than beta_fast times kept (extrapolated), a linear
    ramp between (as HF's _compute_yarn_parameters, truncate included)."""
    dim, base, factor = config.rotary_dim, config.rope_theta, scaling["factor"]
    original = scaling["original_max_position_embeddings"]

    def dimension(rotations: float) -> float:  # the dimension that turns `rotations` times in `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(scaling["beta_fast"]), dimension(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    powers = base ** (torch.arange(0, dim, 2).float() / dim)
    kept = 1 - ramp  # the share of each dimension extrapolated
    return (1.0 / (factor * powers)) * (1 - kept) + (1.0 / powers) * kept


def rope_attention_factor(config: ModelConfig) -> float:
    """What YaRN multiplies cos and sin by (so q·k by its square): attention_factor, else from mscale
    and mscale_all_dim, else 0.1·ln(factor) + 1. 1 for every other RoPE."""
    scaling = config.rope_scaling
    if scaling is None or scaling["rope_type"] != "yarn":
        return 1.0
    if scaling["attention_factor"] is not None:
        return scaling["attention_factor"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor, m, m_all = scaling["factor"], scaling["mscale"], scaling["mscale_all_dim"]
    return mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + d/2]) by each position's angle. x (B, T, H, D); cos/sin (B, T, 1, D/2)."""
    if kernels.takes(x):  # the same arithmetic in one call
        return kernels.rope(x, cos, sin, x.shape[2])
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
