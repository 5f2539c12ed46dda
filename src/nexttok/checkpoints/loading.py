"""A ready model, its tokenizer and chat template, from any name sources.py resolves.

    path = sources.resolve_checkpoint(name)       a checkpoint directory, or a .gguf file
    directory: config.json → ModelConfig → model built on the meta device → its size checked
               against free memory → safetensors copied in (weights.py); tokenizer.json; stop ids
               from config.json and generation_config.json
    .gguf:     config, tokenizer and chat template from the file's metadata; size checked; weights
               kept as shipped where a kernel runs them (gguf_weights.py)

dtype: "auto" (float32 on CPU for a directory; a GGUF as shipped), float32 / bfloat16 / float16,
or int8 / int4 (linear layers quantized at load, the rest in bfloat16).

Kept apart from sources.py because this is where torch comes in: finding files and tokenizing
need none of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from nexttok.checkpoints.gguf.reader import GGUFFile
from nexttok.checkpoints.gguf.weights import gguf_model, gguf_weight_bytes
from nexttok.checkpoints.sources import open_gguf, resolve_checkpoint
from nexttok.checkpoints.weights import (
    assign_weights,
    check_dtype,
    check_memory,
    checkpoint_files,
    pick_device,
    pick_dtype,
    weight_bytes,
)
from nexttok.models import Model, build_model
from nexttok.models.compiled import CompileUnavailable, compile_decode
from nexttok.models.config import CheckpointError, read_generation_stop_ids
from nexttok.models.fused_decode import fuse_decode
from nexttok.models.quant import BITS, quantize_linears
from nexttok.models.registry import from_hf_config, read_config
from nexttok.tokenizers.chat_template import ChatTemplate
from nexttok.tokenizers.from_json import from_directory, tokenizer_from_json
from nexttok.tokenizers.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    """A loaded model and what came with it."""

    model: Model
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    path: Path  # the checkpoint directory or .gguf file it came from


def load_checkpoint(source: str | Path, *, dtype: str | None = None, device: str | None = None,
                    compile: bool = False) -> Checkpoint:
    """Model, tokenizer and chat template of one checkpoint (any source resolve_checkpoint takes).
    compile: run decode steps through torch.compile (models/compiled.py); where it cannot run,
    one line on stderr says why and the model runs uncompiled."""
    check_dtype(dtype)
    path = resolve_checkpoint(source)
    if path.is_file():  # a .gguf
        gguf = open_gguf(path)
        # the tokenizer first, its metadata (151k token strings for Qwen2.5) dropped and the memory
        # its building took given back, so that the weights never sit on top of that peak (-40 MB)
        tokenizer = tokenizer_from_json(gguf.tokenizer, f"{path.name} (tokenizer metadata)")
        template = ChatTemplate.from_config(gguf.tokenizer_config)
        gguf.tokenizer = {}
        give_back_freed_memory()
        model = _gguf_model(gguf, dtype, device)
        del gguf
        if template is not None:  # a file holds one eos id; the template knows the rest (gpt-oss: <|call|>, ...)
            _add_stop_ids(model, [tokenizer.token_to_id(t) for t in template.stop_texts])
    else:
        model = _directory_model(path, dtype, device)
        tokenizer = from_directory(path)
        template = ChatTemplate.from_directory(path)
        _add_stop_ids(model, read_generation_stop_ids(path))
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} ids but the model only "
                              f"{model.config.vocab_size} embeddings")
    if compile:
        try:
            compile_decode(model)
        except CompileUnavailable as e:
            print(f"nexttok: --compile: {e}", file=sys.stderr)
    give_back_freed_memory()
    return Checkpoint(model, tokenizer, template, path)


def _add_stop_ids(model: Model, ids: list[int | None]) -> None:
    """More ids that end generation (generation_config.json's, a template's end tokens), each once."""
    for i in ids:
        if i is not None and i not in model.config.eos_token_id:
            model.config.eos_token_id.append(i)


def give_back_freed_memory() -> None:
    """Hand the heap pages that loading freed (repack buffers, parsed metadata) back to the OS:
    glibc keeps freed blocks for reuse otherwise, and a process's RSS stays at its loading peak
    (17 MB on Qwen2.5-0.5B's GGUF). Nothing where the C library has no malloc_trim."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def load_model(source: str | Path, *, dtype: str | torch.dtype | None = None, device: str | None = None) -> Model:
    """The model alone (eval mode), from any source load_checkpoint takes."""
    check_dtype(dtype)
    path = resolve_checkpoint(source)
    return _gguf_model(open_gguf(path), dtype, device) if path.is_file() else _directory_model(path, dtype, device)


def _gguf_model(gguf: GGUFFile, dtype, device: str | None) -> Model:
    config, target = from_hf_config(gguf.config), pick_device(device)
    check_memory(gguf_weight_bytes(gguf, dtype, target), target)
    return fuse_decode(gguf_model(gguf, config, dtype, target).eval())


def _directory_model(directory: Path, dtype, device: str | None) -> Model:
    config = read_config(directory)
    target = pick_device(device)
    chosen = pick_dtype(None if dtype in BITS else dtype, target, config)
    # cast on the meta device (no storage yet): the size is known before anything is allocated,
    # and the float32 copy that to_empty would otherwise make first never exists
    model = build_model(config).to(chosen)
    check_memory(weight_bytes(model), target)  # int8/int4 load in float first: that is the peak
    files = checkpoint_files(directory)
    model = model.to_empty(device=target)
    model.tie_weights()  # materializing off the meta device unties shared parameters
    assign_weights(model, files)
    model.init_buffers()
    if dtype in BITS:
        quantize_linears(model, BITS[dtype])
    return model.eval()
