"""Architectures by HF model_type."""

from __future__ import annotations

from torch import nn

from nexttok.config import ModelConfig
from nexttok.models.gpt2 import GPT2
from nexttok.models.llama import Llama
from nexttok.models.protocol import Model

__all__ = ["ARCHITECTURES", "Model", "build_model"]

ARCHITECTURES: dict[str, type[nn.Module]] = {"gpt2": GPT2, "llama": Llama, "qwen2": Llama, "mistral": Llama}


def build_model(config: ModelConfig) -> nn.Module:
    """An uninitialised model of config's architecture (weights come from the loader)."""
    return ARCHITECTURES[config.model_type](config)
