"""A model's weights from a GGUF file, kept as the file ships them.

With nexttok's kernels (kernels/, built by scripts/setup.sh; the default):
    linear layers of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K → BlockLinear (the file's
                                       bytes; a fused q/k/v or gate/up keeps each part's type)
    the token embedding of such a type → BlockEmbedding, and a tied output layer is a
                                       BlockLinear over the same bytes
    F32 / F16 / BF16 tensors          → float32 (norms, biases; a float linear layer)
    and the model runs in float32 (the kernels quantize its activations to 8 bits per 32).
    gemma-3-270m Q4_K_M: 253 MB in memory, its file's size; Qwen2.5-0.5B Q4_K_M likewise.

Without them (no C++ compiler), torch's kernels, in bfloat16:
    Q4_0, Q4_1, Q4_K linear layers  → Int4Linear (exactly the file's 4-bit groups, no float copy;
                                       rows a multiple of 16, as the kernel needs)
    a Q8_0 token embedding          → Q8Embedding (the file's int8 values and float16 scales);
                                       a tied lm_head over it → Int8Linear, one scale per row
    any other type                  → dequantized (the `gguf` package) into a bfloat16 layer
                                       (gemma-3-270m Q4_K_M: 515 MB)

Whichever runs: dtype float32 / bfloat16 dequantizes every tensor on purpose (no file written);
int8 / int4 dequantizes, then quantizes again our way (quant.py). A file with no quantized tensor
(F32/F16/BF16) runs in float32. Fused projections stack their parts' rows. Gemma's norms arrive
less 1 (gguf.py).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import torch
from torch import nn

from nexttok.checkpoints.gguf.blocks import INT4_KINDS, int4_groups
from nexttok.checkpoints.gguf.metadata import TensorEntry
from nexttok.checkpoints.gguf.reader import GGUFFile, GGUFTensor
from nexttok.checkpoints.weights import DTYPES, checkpoint_keys
from nexttok.models import build_model, kernels
from nexttok.models.block_quant import BlockEmbedding, BlockExperts, BlockLinear, fits
from nexttok.models.config import CheckpointError, ModelConfig
from nexttok.models.fused import fused_parts
from nexttok.models.moe import Experts
from nexttok.models.quant import ACTIVATION, BITS, Int4Linear, Q8Embedding, int8_rows, quantized_linear
from nexttok.models.registry import architecture

FLOAT_KINDS = ("F32", "F16", "BF16")


def gguf_model(gguf: GGUFFile, config: ModelConfig, dtype: str | None, device: torch.device) -> nn.Module:
    """The model of a GGUF file; dtype None/"auto": as shipped (see above)."""
    as_shipped = _as_shipped(dtype, device)
    isa = kernels.best_isa() if as_shipped and kernels.available() else None
    floats = DTYPES.get(dtype) or (torch.float32 if _all_float(gguf) or isa is not None else ACTIVATION)
    tensors = {t.name: t for t in gguf.blocks()}
    model = build_model(config)
    tied = config.tie_word_embeddings
    if isa is not None:
        embedding_kept = _keep_block_embedding(model, tensors, tied, isa)
    else:
        embedding_kept = as_shipped and _keep_q8_0_embedding(model, tensors, tied)
    for name, module in list(model.named_modules()):
        if isinstance(module, Experts):
            model.set_submodule(name, _experts(model, tensors, name, module, isa, floats, device))
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and not (tied and name == "lm_head"):
            parts = [_take(model, tensors, f"{part}.weight") for part in fused_parts(name, module)]
            _check_rows(name, parts, module)
            bias = _bias(model, tensors, name, module, floats, device)
            model.set_submodule(name, _linear(parts, bias, as_shipped, isa, dtype, floats, device))
    saved = model.state_dict(keep_vars=True)  # the buffers a checkpoint holds (Gemma 4's layer_scalar) too
    for name, tensor in [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n in saved)]:
        if tensor.is_meta:
            value = _dense(_take(model, tensors, name), floats, device)
            _check_shape(name, value, tensor)
            owner, leaf = name.rsplit(".", 1)
            is_param = isinstance(tensor, nn.Parameter)
            setattr(model.get_submodule(owner), leaf, nn.Parameter(value, requires_grad=False) if is_param else value)
    unread = architecture(config.model_type).unused  # left unread on purpose (Gemma 4's KV-shared layers' keys)
    left = sorted(n for n in tensors if unread is None or not unread(n, config.num_hidden_layers))
    if left:
        raise CheckpointError(f"GGUF has {len(left)} tensors this architecture does not use: {', '.join(left[:5])}")
    if not embedding_kept:
        model.tie_weights()
    model.init_buffers()
    return model


def _all_float(gguf: GGUFFile) -> bool:
    """A file of F32/F16/BF16 tensors only (an unquantized export): it runs in float32."""
    return all(entry.kind in FLOAT_KINDS for entry in gguf.entries)


def _as_shipped(dtype: str | None, device: torch.device) -> bool:
    return dtype in (None, "auto") and device.type == "cpu"  # the 4-bit kernel runs on the CPU


def gguf_weight_bytes(gguf: GGUFFile, dtype: str | None, device: torch.device) -> int:
    """About the bytes gguf_model's weights take, known before any is read. As shipped with the
    kernels: the file's bytes, float32 for its float tensors. With torch's: the file's own bytes
    for what stays quantized (4-bit layers; a Q8_0 embedding, and its int8 copy where the output
    layer is tied to it), bfloat16 for the rest (gemma-3-270m Q4_K_M: 515 MB from a 253 MB file).
    Requantized to int8/int4: about the file's bytes. Otherwise each value at the float dtype (an
    unquantized file, F16 say, runs in float32)."""
    if dtype in BITS:
        return sum(entry.n_bytes for entry in gguf.entries)
    if _as_shipped(dtype, device) and not _all_float(gguf):
        if kernels.available():  # blocks as in the file, the rest (norms, biases) float32
            return sum(entry.n_bytes if fits(entry.kind, entry.dims[-1]) else 4 * math.prod(entry.dims)
                       for entry in gguf.entries)
        return sum(_shipped_bytes(entry, gguf.config["tie_word_embeddings"]) for entry in gguf.entries)
    size = (DTYPES.get(dtype) or (torch.float32 if _all_float(gguf) else ACTIVATION)).itemsize
    return sum(math.prod(entry.dims) * size for entry in gguf.entries)


def _shipped_bytes(entry: TensorEntry, tied: bool) -> int:
    if entry.kind in INT4_KINDS:
        return entry.n_bytes
    if entry.kind == "Q8_0" and entry.name == "token_embd.weight":
        return entry.n_bytes + (math.prod(entry.dims) + 2 * entry.dims[0] if tied else 0)  # + int8 head, row scales
    return math.prod(entry.dims) * ACTIVATION.itemsize


def _keep_q8_0_embedding(model: nn.Module, tensors: dict[str, GGUFTensor], tied: bool) -> bool:
    """A Q8_0 token embedding stays Q8_0 (Q8Embedding); when the output layer is tied to it, that
    layer becomes int8 with one scale per row (torch's int8 kernel has no group scales: requantized
    from the groups, +0.1% perplexity on the default model) instead of a bfloat16 copy at half the
    speed. False (nothing done) for anything else."""
    name, module, key = _embedding_table(model, tensors)
    if key is None or tensors[key].kind != "Q8_0":
        return False
    table = tensors.pop(key)
    blocks = torch.from_numpy(np.array(table.raw, copy=True)).view(table.shape[0], -1, 34)
    d = blocks[..., :2].contiguous().view(torch.float16)[..., 0]  # (V, K/32)
    q = blocks[..., 2:].contiguous().view(torch.int8).reshape(table.shape)  # (V, K)
    model.set_submodule(name, Q8Embedding(q, d, ACTIVATION))
    if tied:
        rows = 4096
        chunks = (q[i : i + rows].float().view(-1, q.shape[1] // 32, 32) * d[i : i + rows].float()[..., None]
                  for i in range(0, q.shape[0], rows))
        model.set_submodule("lm_head", int8_rows(c.reshape(-1, q.shape[1]) for c in chunks))
    return True


def _keep_block_embedding(model: nn.Module, tensors: dict[str, GGUFTensor], tied: bool, isa: int) -> bool:
    """A token embedding of a block type stays in it (BlockEmbedding), and an output layer tied to
    it reads the same bytes (BlockLinear). False (nothing done) for anything else."""
    name, module, key = _embedding_table(model, tensors)
    if key is None or not fits(tensors[key].kind, module.embedding_dim):
        return False
    (table,) = _tiled([tensors.pop(key)], module.embedding_dim)
    embedding = BlockEmbedding(table, torch.float32)
    model.set_submodule(name, embedding)
    if tied:
        model.set_submodule("lm_head", embedding.head(isa))
    return True


def _embedding_table(model: nn.Module, tensors: dict[str, GGUFTensor]) -> tuple[str, nn.Module, str | None]:
    """The model's one token embedding, its name, and the file's tensor for it (None where there
    are several embeddings, or the file's tensor is missing or of another shape)."""
    embeddings = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    if len(embeddings) != 1:
        return "", None, None
    name, module = embeddings[0]
    key = next((k for k in checkpoint_keys(model, f"{name}.weight") if k in tensors), None)
    if key is not None and tensors[key].shape != tuple(module.weight.shape):
        key = None
    return name, module, key


def _tiled(parts: list[GGUFTensor], k: int, matrices: int = 1) -> list[kernels.Tiled]:
    """The parts' block rows repacked into the kernels' tiles, neighbours of one kind joined (one
    run of rows for the kernel instead of several; matrices: a lone part's experts, each laid out
    alone). The file's pages are given back as they are read, so a weight is never in memory twice
    (a lone part is read straight from the mapping)."""
    runs: list[list[GGUFTensor]] = []
    for p in parts:
        if runs and runs[-1][0].kind == p.kind:
            runs[-1].append(p)
        else:
            runs.append([p])
    tiled = []
    for run in runs:
        rows = [np.asarray(p.raw).reshape(math.prod(p.shape[:-1]), -1) for p in run]
        if len(run) == 1:  # repacked straight from the mapping, its pages given back chunk by chunk
            with warnings.catch_warnings():  # the mapping is read-only, and only ever read
                warnings.simplefilter("ignore", UserWarning)
                raw, done = torch.from_numpy(rows[0]), run[0].release
        else:  # joined into a copy first: the file's pages go now
            raw, done = torch.from_numpy(np.concatenate(rows)), None
            for p in run:
                p.release()
        tiled.append(kernels.repack(run[0].kind, raw, k, done=done, matrices=matrices))
    return tiled


def _experts(model: nn.Module, tensors: dict[str, GGUFTensor], name: str, module: Experts, isa: int | None,
             floats: torch.dtype, device: torch.device) -> nn.Module:
    """A mixture of experts' weights from the file's three 3-D tensors (ffn_gate_exps, ffn_up_exps,
    ffn_down_exps: E experts' rows one after another; or two, gate and up in one ffn_gate_up_exps, each
    expert's gate rows then its up rows, as llama.cpp's gemma4): kept in their blocks (BlockExperts)
    where the kernels run them, else dequantized into the float module's stacked parameters."""
    e, inner, hidden = module.num_experts, module.inner, module.down_proj.shape[1]
    fused = any(key in tensors for key in checkpoint_keys(model, f"{name}.gate_up_proj"))  # the parameter itself
    names = ("gate_up_proj", "down_proj") if fused else ("gate_proj", "up_proj", "down_proj")
    parts = {p: _take(model, tensors, f"{name}.{p}" if fused else f"{name}.{p}.weight") for p in names}
    wants = {"gate_proj": (e, inner, hidden), "up_proj": (e, inner, hidden), "down_proj": (e, hidden, inner),
             "gate_up_proj": (e, 2 * inner, hidden)}
    for p in names:
        if parts[p].shape != wants[p]:
            raise CheckpointError(f"GGUF tensor {parts[p].name!r} has shape {parts[p].shape}, expected {wants[p]}")
    biases = None
    if module.gate_up_proj_bias is not None:
        biases = [_dense(_take(model, tensors, f"{name}.{p}.bias"), torch.float32, device)
                  for p in ("gate_proj", "up_proj", "down_proj")]
    gate_up_bias, down_bias = (None, None) if biases is None else (torch.cat(biases[:2], dim=1), biases[2])
    blocks = isa is not None and all(fits(t.kind, t.shape[-1]) for t in parts.values()) and inner % kernels.TILE == 0 \
        and hidden % kernels.TILE == 0 and not fused and module.activation[0] in BlockExperts.MODES
    if blocks:
        gate_up = [_tiled([parts[p]], hidden, e)[0] for p in ("gate_proj", "up_proj")]  # each expert's rows in place
        (down,) = _tiled([parts["down_proj"]], inner, e)
        return BlockExperts(gate_up, [down], e, isa, module.activation, gate_up_bias, down_bias)
    module.gate_up_proj = nn.Parameter(torch.cat([_dense(parts[p], floats, device) for p in names[:-1]], dim=1),
                                       requires_grad=False)  # (E, 2 inner, hidden)
    module.down_proj = nn.Parameter(_dense(parts["down_proj"], floats, device), requires_grad=False)
    if biases is not None:
        module.gate_up_proj_bias = nn.Parameter(gate_up_bias.to(floats), requires_grad=False)
        module.down_proj_bias = nn.Parameter(down_bias.to(floats), requires_grad=False)
    return module


def _take(model: nn.Module, tensors: dict[str, GGUFTensor], name: str) -> GGUFTensor:
    for key in checkpoint_keys(model, name):
        if key in tensors:
            return tensors.pop(key)
    raise CheckpointError(f"tensor {checkpoint_keys(model, name)[0]!r} is missing from the GGUF file")


def _bias(model, tensors, name: str, module: nn.Linear, dtype, device) -> torch.Tensor | None:
    if module.bias is None:
        return None
    parts = [_take(model, tensors, f"{part}.bias") for part in fused_parts(name, module)]
    return torch.cat([_dense(p, dtype, device) for p in parts])


def _linear(parts: list[GGUFTensor], bias, as_shipped: bool, isa: int | None, dtype: str | None,
            floats: torch.dtype, device: torch.device) -> nn.Module:
    rows, columns = sum(p.shape[0] for p in parts), parts[0].shape[1]
    if isa is not None and all(fits(p.kind, columns) for p in parts):
        return BlockLinear(_tiled(parts, columns), isa, bias)
    if as_shipped and all(p.kind in INT4_KINDS for p in parts) and Int4Linear.fits(rows, columns):
        groups = [int4_groups(p.kind, p.raw) for p in parts]
        return Int4Linear.from_groups(*(torch.cat(g) for g in zip(*groups, strict=True)), bias)
    if dtype in BITS:
        weight = torch.cat([_dense(p, torch.float32, torch.device("cpu")) for p in parts])  # (N, K)
        return quantized_linear(weight, bias, BITS[dtype])
    weight = torch.cat([_dense(p, floats, device) for p in parts])
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _dense(tensor: GGUFTensor, dtype: torch.dtype, device: torch.device, rows: int = 4096) -> torch.Tensor:
    """The tensor's values as `dtype`, dequantized a few thousand rows at a time (a 49152-row
    embedding never exists as a whole in float32)."""
    if len(tensor.shape) == 1:
        return torch.from_numpy(np.array(tensor.dequantize())).to(device, dtype)
    n, k = math.prod(tensor.shape[:-1]), tensor.shape[-1]  # a 3-D tensor (experts) as its rows
    raw = tensor.raw.reshape(n, -1)
    out = torch.empty((n, k), dtype=dtype, device=device)
    for start in range(0, n, rows):
        part = dataclasses.replace(tensor, shape=(min(rows, n - start), k), raw=raw[start : start + rows])
        out[start : start + rows] = torch.from_numpy(np.array(part.dequantize()))
    return out.view(tensor.shape)


def _check_rows(name: str, parts: list[GGUFTensor], module: nn.Linear) -> None:
    rows = sum(p.shape[0] for p in parts)
    if rows != module.out_features or any(p.shape[1:] != (module.in_features,) for p in parts):
        shapes = ", ".join(f"{p.name} {p.shape}" for p in parts)
        raise CheckpointError(f"GGUF tensors for {name!r} have shapes {shapes}, expected "
                              f"{module.out_features} rows of {module.in_features} in all")


def _check_shape(name: str, value: torch.Tensor, param: torch.Tensor) -> None:
    if value.shape != param.shape:
        raise CheckpointError(f"GGUF tensor for {name!r} has shape {tuple(value.shape)}, "
                              f"expected {tuple(param.shape)}")
