"""nexttok's HTTP server: OpenAI-compatible routes over the same core as the CLI."""

from __future__ import annotations

from pathlib import Path

from nexttok.server.app import create_app
from nexttok.server.engine import ServedModel

__all__ = ["ServedModel", "create_app", "load_served"]


def load_served(source: str, name: str | None = None, *, dtype=None, device=None,
                on_convert=None) -> ServedModel:
    """Load a checkpoint for serving; its name defaults to the source as given (a path's folder name)."""
    from nexttok.chat import ChatTemplate
    from nexttok.weights import load_checkpoint

    model, tokenizer = load_checkpoint(source, dtype=dtype, device=device, on_convert=on_convert)
    path = Path(source)
    default_name = path.name if path.exists() else str(source)
    return ServedModel(name or default_name, model, tokenizer, ChatTemplate.from_directory(model.directory))
