"""Architectures by HF model_type: the registry (registry.py) of every family nexttok runs."""

from __future__ import annotations

from nexttok.models.protocol import Model
from nexttok.models.registry import ARCHITECTURES, build_model, from_hf_config, read_config

__all__ = ["ARCHITECTURES", "Model", "build_model", "from_hf_config", "read_config"]
