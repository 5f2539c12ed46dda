"""Architectures by HF model_type."""

from __future__ import annotations

import torch
from torch import nn

from nexttok.models.config import ModelConfig
from nexttok.models.gemma3 import Gemma3
from nexttok.models.gpt2 import GPT2
from nexttok.models.llama import Llama
from nexttok.models.phi3 import Phi3
from nexttok.models.protocol import Model
from nexttok.models.qwen3 import Qwen3

__all__ = ["ARCHITECTURES", "Model", "build_model"]

ARCHITECTURES: dict[str, type[nn.Module]] = {"gpt2": GPT2, "llama": Llama, "qwen2": Llama, "mistral": Llama,
                                             "qwen3": Qwen3, "phi3": Phi3, "gemma3_text": Gemma3}


def build_model(config: ModelConfig) -> nn.Module:
    """The modules of config's architecture on the meta device: shapes, no storage, no values
    (the loader puts the weights in; the random init of a meta tensor does nothing)."""
    with torch.device("meta"):
        return ARCHITECTURES[config.model_type](config)
