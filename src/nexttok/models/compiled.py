"""The decode step compiled: one layer's work for one new token, as one torch.compile'd graph.

An eager decode step of the default model is ~1,500 small tensor operations (~3 us each to
dispatch) around 121 matmuls; inductor fuses the norms, the rotary embedding, the residual adds and
the activation into a few C++ loops per layer. Shapes stay static: the graph takes one new token
per row and never sees the KV cache, whose length grows every step. Attention over the cache is an
opaque op (attention.py: the layer is given TRACED as its cache and masks) that finds the real
cache and mask in attention.STEP, set here before each layer.

One graph serves every layer (the layers differ only in weights, which are the graph's inputs);
a new batch size compiles a new one. Prefill (many tokens) and captures for a viewer stay eager.
The compiled code is cached on disk by inductor, so a later process pays only the tracing: inductor
takes its folder from TORCHINDUCTOR_CACHE_DIR, which the `nexttok` commands point at the nexttok
cache's inductor/ folder (cli/__init__.py); a library caller's process keeps its own setting.
The compiled step rounds bfloat16 differently from the eager one (fused ops round once): same
tokens up to near ties, not the same bits.
"""

from __future__ import annotations

import os
import shutil
import time

import torch
from torch import nn

from nexttok.models.attention import STEP, TRACED


class CompileUnavailable(RuntimeError):
    """torch.compile cannot run here (no C++ compiler for inductor's CPU code)."""


def _layer(layer: nn.Module, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
    return layer(x, *extra, masks=TRACED, cache=TRACED, capture=None)


def _check_compiler(device: torch.device) -> None:
    compilers = (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")
    if device.type == "cpu" and not any(shutil.which(c) for c in compilers):
        raise CompileUnavailable("no C++ compiler found (install g++): the decode step runs uncompiled")


class CompiledDecode:
    """Runs a model's layers for one new token per row through one compiled graph."""

    def __init__(self, device: torch.device):
        _check_compiler(device)
        # cpp_wrapper: the graph's calls made from C++, not Python (18.8 -> 17.3 ms a step without,
        # 18.1 -> 15.3 ms with, interleaved A/B on the default model)
        self.fn = torch.compile(_layer, dynamic=False, fullgraph=True, options={"cpp_wrapper": True})
        self.compiled_rows: set[int] = set()
        self.compile_seconds = 0.0  # the first step of each batch size: tracing, compiling (or loading)

    @staticmethod
    def takes(ids: torch.Tensor, cache, capture) -> bool:
        """A decode step: one new token per row, a cache to extend, nothing captured."""
        return ids.shape[1] == 1 and cache is not None and capture is None

    def run(self, layers: nn.ModuleList, x: torch.Tensor, extra: tuple, masks: list, cache) -> torch.Tensor:
        """x (B, 1, hidden) through every layer; extra: the per-step inputs each layer takes after x
        (RoPE's cos and sin); masks: each layer's mask."""
        start = time.perf_counter()
        STEP.cache = cache
        try:
            for i, layer in enumerate(layers):
                STEP.layer, STEP.mask = i, masks[i]
                x = self.fn(layer, x, *extra)
        finally:
            STEP.cache = STEP.mask = None
        if x.shape[0] not in self.compiled_rows:
            self.compiled_rows.add(x.shape[0])
            self.compile_seconds += time.perf_counter() - start
        return x


def compile_decode(model: nn.Module) -> CompiledDecode:
    """Turn on the compiled decode step for `model` (raises CompileUnavailable where it cannot: a
    mixture of experts picks its experts' weights by the router's output, which one static graph
    cannot hold; its step runs eagerly, reading only the chosen experts)."""
    if model.config.is_moe:
        raise CompileUnavailable(f"mixture-of-experts layers ({model.config.model_type}) choose their weights per "
                                 "token, which a compiled step cannot: the decode step runs uncompiled")
    if model.config.recurrent_layers:
        raise CompileUnavailable(f"recurrent layers ({model.config.model_type}) update a state the compiled step does "
                                 "not hold: the decode step runs uncompiled")
    reason = getattr(model, "UNCOMPILED", None)  # an architecture the compiled step cannot run, and why
    if reason is not None:
        raise CompileUnavailable(f"{reason}: the decode step runs uncompiled")
    model.compiled = CompiledDecode(next(model.parameters()).device)
    return model.compiled
