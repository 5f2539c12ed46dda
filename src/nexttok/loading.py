"""A ready model (and its tokenizer) from any name sources.py resolves.

    directory = sources.resolve_checkpoint(name)
    config.json → ModelConfig → model built on the meta device → weights copied in (weights.py)
    tokenizer.json (tokenizer_json.py); stop ids from config.json and generation_config.json

Kept apart from sources.py because this is where torch comes in: finding files and tokenizing
need none of it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nexttok.config import CheckpointError, read_config, read_generation_stop_ids
from nexttok.models import build_model
from nexttok.sources import OnConvert, resolve_checkpoint
from nexttok.tokenizer import Tokenizer
from nexttok.tokenizer_json import from_directory
from nexttok.weights import assign_weights, checkpoint_files, pick_device, pick_dtype


def load_model(source: str | Path, *, dtype: str | torch.dtype | None = None,
               device: str | None = None, on_convert: OnConvert | None = None) -> torch.nn.Module:
    """A ready model (eval mode) from any source resolve_checkpoint takes; model.config holds its
    config and model.directory the checkpoint directory."""
    directory = resolve_checkpoint(source, on_convert)
    config = read_config(directory)
    files = checkpoint_files(directory)
    target = pick_device(device)
    chosen = pick_dtype(dtype, target, config)
    with torch.device("meta"):
        model = build_model(config)
    model = model.to_empty(device=target).to(chosen)
    model.tie_weights()  # materializing off the meta device unties shared parameters
    assign_weights(model, files)
    model.init_buffers()
    model.directory = directory
    return model.eval()


def load_checkpoint(source: str | Path, *, dtype: str | torch.dtype | None = None, device: str | None = None,
                    on_convert: OnConvert | None = None) -> tuple[torch.nn.Module, Tokenizer]:
    """(model, tokenizer) from one checkpoint; stop ids from config.json and generation_config.json."""
    model = load_model(source, dtype=dtype, device=device, on_convert=on_convert)
    tokenizer = from_directory(model.directory)
    config = model.config
    for i in read_generation_stop_ids(model.directory):
        if i not in config.eos_token_id:
            config.eos_token_id.append(i)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} ids but the model only "
                              f"{config.vocab_size} embeddings")
    return model, tokenizer
