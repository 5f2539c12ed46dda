"""The models a server holds: each with its tokenizer, chat template and batch scheduler, and how
one is loaded for serving."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nexttok.checkpoints.loading import load_checkpoint
from nexttok.generation.loop import context_window
from nexttok.models import Model
from nexttok.server.errors import APIError
from nexttok.server.scheduler import Scheduler
from nexttok.tokenizers.chat_template import ChatTemplate
from nexttok.tokenizers.tokenizer import Tokenizer


@dataclass
class ServedModel:
    name: str
    model: Model
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    created: int = field(default_factory=lambda: int(time.time()))
    scheduler: Scheduler | None = None  # started by create_app
    path: Path | None = None  # the checkpoint it was loaded from (a trace names it by its sha256)

    @property
    def context_length(self) -> int:
        """Longest sequence (prompt + completion) this server runs for the model."""
        return context_window(self.model.config, None if self.scheduler is None else self.scheduler.max_len)


def find_served(models: Mapping[str, ServedModel], name: str | None) -> ServedModel:
    """The model a request names; None names the only one when there is one. Unknown: 404."""
    if name is None and len(models) == 1:
        return next(iter(models.values()))
    if name not in models:
        raise APIError(404, f"The model {name!r} does not exist (served: {', '.join(models)})",
                       param="model", code="model_not_found")
    return models[name]


def load_served(source: str, name: str | None = None, *, dtype=None, device=None, compile=False) -> ServedModel:
    """Load a checkpoint for serving; its name defaults to the source as given (a path's folder name)."""
    checkpoint = load_checkpoint(source, dtype=dtype, device=device, compile=compile)
    path = Path(source)
    default_name = path.name if path.exists() else str(source)
    return ServedModel(name or default_name, checkpoint.model, checkpoint.tokenizer, checkpoint.chat_template,
                       path=checkpoint.path)
