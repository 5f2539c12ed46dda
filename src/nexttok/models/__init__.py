"""Architectures by HF model_type."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
    (the loader puts the weights in)."""
    with torch.device("meta"), _no_random_init():
        return ARCHITECTURES[config.model_type](config)


@contextlib.contextmanager
def _no_random_init() -> Iterator[None]:
    """Skip the layers' random initialisation, as HF's no_init_weights does: on the meta device it
    is pointless, and its first call imports torch's compiler stack (~1.7 s of start-up here)."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "zeros_", "ones_")
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)
